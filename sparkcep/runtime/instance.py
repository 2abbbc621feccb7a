"""A sub-query instance at work: reads its input channels, aligns their progress, routes its results.

The same class runs every instance, whether it lives in the engine's
process (``workers=0``) or in an instance manager; only the channels
differ. Its contract with the core (:class:`~sparkcep.core.subquery.SubQueryInstance`):
per input, data then progress, in order, progress taken as the minimum over
the inputs.

Progress is counted in *epochs*: the engine closes one epoch per ``send``
(and per ``end``), with a frontier (the last sequence number sent) and a
watermark per source. Every producer forwards every epoch, so an instance
advances epoch by epoch, each time all its inputs have delivered it:

* a stateless head processes data as it comes (results keep its epoch);
* a stateful head is fed an epoch's data only when that epoch advances, in
  a fixed order (by producer, then arrival), then advances to the epoch's
  frontier and the minimum of the inputs' watermarks; an aggregate that
  takes rows in any order leaves the batches no window it fires reads
  until its progress is out (``settle``): a window's results leave without
  waiting for the rows of the next;
* an aborted epoch (:class:`~sparkcep.runtime.channels.Abort` from every
  input) is dropped: its stash goes, nothing is consumed or fired, and the
  abort is passed on, so no output ever shows it;
* a control record (a :class:`~sparkcep.runtime.channels.Configure` of a
  bin table, say) is applied once every input delivered it, between the
  epoch before it and the one it starts, then passed on — an input that
  delivered it waits for the others meanwhile (Megaphone's updates at a
  frontier). There the instance has consumed everything before the record
  and nothing after it, so that is where state moves
  (:mod:`sparkcep.runtime.handoff`): an ``Export`` hands bins (or the whole
  instance) over, an ``Import`` holds the instance's progress until what it
  imports arrived and is installed, a ``Retire`` ends the instance.

So an instance consumes exactly what it would consume in one process,
whatever the interleaving of its channels: results equal the in-process
run, including order-sensitive ones (tuple windows, first/last).
"""

from __future__ import annotations

import time

import numpy as np

from sparkcep.core import columns
from sparkcep.core.subquery import SubQueryInstance
from sparkcep.errors import EngineError
from sparkcep.runtime.balancers import Router
from sparkcep.runtime.channels import Abort, Consumer, Control, Data, Export, Import, Progress, Retire
from sparkcep.runtime.handoff import Adopted, Handoffs
from sparkcep.runtime.layout import Endpoint, Layout
from sparkcep.runtime.metrics import Counters, EpochClock, Histogram, record_latency


class InstanceRunner:
    """Runs instance ``endpoint`` = (sub-query, index) of a deployment.

    ``inputs`` maps each producer of the layout to its channel; ``router``
    sends what leaves the instance. The host calls :meth:`poll` whenever it
    likes; nothing else.
    """

    def __init__(self, layout: Layout, endpoint: Endpoint, bins: int, inputs: dict[Endpoint, Consumer],
                 router: Router, clock: EpochClock, handoffs: Handoffs):
        sq = layout.sq[endpoint[0]]
        self.layout, self.endpoint, self.router, self.clock, self.handoffs = layout, endpoint, router, clock, handoffs
        self.instance = SubQueryInstance(layout.plan, sq, endpoint[1], bins)
        self.head = sq.head.name
        self.buffers = self.instance.stateful is not None
        self.channels = [inputs[p] for p in layout.producers(endpoint)]
        self.pending: list[list] = [[] for _ in self.channels]  # progress and control not yet applied, per input
        self.held = [0] * len(self.channels)  # control records in pending: the input is not read meanwhile
        self.stash: dict[int, list] = {}  # epoch -> [(input, edge, batch)] for a stateful head
        self.counters = Counters()
        self.name = f"{sq.name}[{endpoint[1]}]"
        self.importing: list[str] = []  # tickets to install before consuming anything more, in order
        self.retired = False  # passed a Retire on: its generation of the deployment is over

    def poll(self, budget: int = 32) -> int:
        """Handle up to ``budget`` messages per input while no output is backed up; returns how many.

        An input that delivered a control record is not read again until every
        input delivered it (alignment): what follows it already belongs to the
        configuration it starts. Nothing is read while imported state is awaited
        (:attr:`importing`): what arrives meanwhile waits in the channels, which
        are bounded, so its producers wait too instead of this process's memory
        growing with it.
        """
        done = 0
        t0 = time.perf_counter_ns()
        if self.importing:
            done += self._install()
        router = self.router
        for k, ch in enumerate(self.channels):
            n = 0
            while (n < budget and not router.backlog_bytes and not self.held[k] and not self.retired
                   and not self.importing):
                msg = ch.receive()
                if msg is None:
                    break
                n += 1
                kind = type(msg)
                if kind is Data:
                    self._data(k, msg)
                    continue
                if kind is Progress:
                    self.clock.note(msg.epoch, msg.frontier, msg.arrival)
                elif kind is not Abort:
                    self.held[k] += 1
                self.pending[k].append(msg)
                if len(self.pending[k]) == 1:
                    self._advance()
            done += n
        if done:
            self.counters.busy_ns += time.perf_counter_ns() - t0
        return done

    @property
    def ready(self) -> bool:
        """May :meth:`poll` take input now (its outputs are not backed up)?"""
        return not self.router.backlog_bytes

    def _data(self, k: int, msg: Data) -> None:
        self.clock.note(msg.epoch, msg.frontier, msg.arrival)
        c = self.counters
        c.rows_in += msg.batch.num_rows
        c.batches_in += 1
        edge = self.layout.edges[msg.port]
        if self.buffers:
            self.stash.setdefault(msg.epoch, []).append((k, edge, msg.batch))
        else:
            self._emit(self.instance.process(edge, msg.batch), (msg.epoch, msg.frontier, msg.arrival))

    def _advance(self) -> None:
        pending = self.pending
        while all(pending) and not self.importing and not self.retired:
            heads = [p.pop(0) for p in pending]
            first = heads[0]
            epoch = first.epoch
            if any(h.epoch != epoch or type(h) is not type(first) for h in heads):
                raise EngineError(f"{self.name}: inputs disagree on the next record: "
                                  f"{[(type(h).__name__, h.epoch) for h in heads]} (a producer skipped one)", "EPOCH")
            if isinstance(first, Control):
                if any(h != first for h in heads):
                    raise EngineError(f"{self.name}: inputs disagree on control record {first}", "EPOCH")
                self.held = [n - 1 for n in self.held]
                self._control(first)
                continue
            aborted = [type(h) is Abort for h in heads]
            if any(aborted):
                if not all(aborted):
                    raise EngineError(f"{self.name}: epoch {epoch} is aborted on some inputs only", "EPOCH")
                self.stash.pop(epoch, None)
                self.router.abort(epoch)
                self.counters.epoch = epoch
                continue
            watermark = min(h.watermark for h in heads)
            stamp = (epoch, first.frontier, first.arrival)
            self.router.hold_wakes()
            try:
                if self.buffers:
                    for _, edge, batch in sorted(self.stash.pop(epoch, ()), key=lambda item: item[0]):
                        self._emit(self.instance.process(edge, batch), stamp)
                self._emit(self.instance.advance(first.frontier, watermark), stamp)
                self.router.progress(epoch, first.frontier, self.instance.output_watermark(watermark),
                                     first.arrival)
            finally:
                self.router.release_wakes()
            self.instance.settle()
            self.counters.epoch = epoch

    def _control(self, record: Control) -> None:
        """Apply an aligned control record to this instance, then pass it on (the router applies its own)."""
        me = self.endpoint[1]
        if isinstance(record, Export) and record.operator == self.head:
            for i, ticket, host, how, bins in record.items:
                if i == me:
                    self.handoffs.send(ticket, host, self._export(how, bins))
        elif isinstance(record, Import) and record.operator == self.head:
            self.importing += [ticket for i, ticket in record.items if i == me]
        self.router.control(record)
        if isinstance(record, Retire):
            self.retired = True

    def _export(self, how: str, bins):
        if how == "adopt":
            return Adopted(self.instance, self.counters)
        op = self.instance.stateful
        if op is None:
            raise EngineError(f"{self.name}: has no state to hand over ({how})", "HANDOFF")
        chosen = None if bins is None else np.asarray(bins, np.int64)
        return op.take_bins(chosen) if how == "take" else op.copy_bins(chosen)

    def _install(self) -> int:
        """Install what arrived of the tickets being imported, in their order; 1 if any was."""
        done = 0
        while self.importing:
            state = self.handoffs.take(self.importing[0])
            if state is None:
                break
            ticket = self.importing.pop(0)
            if isinstance(state, Adopted):
                state.counters.absorb(self.counters)  # what this instance counted while it waited
                self.instance, self.counters, nbytes = state.instance, state.counters, 0
            else:
                self.instance.stateful.put_bins(state)
                nbytes = state.nbytes
            self.handoffs.installed(ticket, nbytes)
            done = 1
        if done and not self.importing:
            self._advance()
        return done

    def _emit(self, outs, stamp) -> None:
        """Send (operator, batch) pairs as ``outs`` yields them."""
        rows_out = self.counters.rows_out
        for name, batch in outs:
            now = time.monotonic_ns()
            rows_out[name] = rows_out.get(name, 0) + batch.num_rows
            hist = self.counters.latency.get(name)
            if hist is None:
                hist = self.counters.latency[name] = Histogram()
            record_latency(hist, self.clock, batch.column(columns.SEQ).to_numpy(), now)
            self.router.send(name, batch, stamp)

    # --- state for metrics -------------------------------------------------------------------
    def late(self) -> tuple[int, list[int]] | None:
        """(late tuples, late tuples per input port) of a stateful head that counts them, else None."""
        op = self.instance.stateful
        if op is None or not hasattr(op, "late"):
            return None
        return int(op.late), [int(x) for x in getattr(op, "late_by_port", [])]

    def queued(self) -> dict:
        """Queue lengths: bytes waiting in the input channels, rows stashed, bytes backlogged."""
        return {"input_bytes": sum(ch.queued_bytes for ch in self.channels),
                "stashed_rows": sum(b.num_rows for items in self.stash.values() for _, _, b in items),
                "backlog_bytes": self.router.backlog_bytes}
