"""A deployed query as the engine sees it: plan, instances, sources, outputs, progress, bin tables.

:class:`Deployment` runs every instance in the calling process
(``Engine.local(workers=0)``): channels are in-process queues and each
engine call runs the instances until nothing is left to do, so results are
there when ``send`` returns. :class:`~sparkcep.runtime.cluster.RemoteDeployment`
runs the same instances (:class:`~sparkcep.runtime.instance.InstanceRunner`,
wired by :mod:`sparkcep.runtime.wiring`) on instance managers; the source
side (stamping epochs, routing source batches, watermarks per source), the
bin tables and the output side (:class:`~sparkcep.runtime.sink.Sink`) are
this module's, for both.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)

from sparkcep.core import columns
from sparkcep.core.operators import WM_END, WM_NONE
from sparkcep.errors import EngineError, OperatorError, QueryError
from sparkcep.query.planner import Plan, plan
from sparkcep.query.query import Query
from sparkcep.runtime.balancers import bin_tables
from sparkcep.runtime.channels import Configure, LocalChannel
from sparkcep.runtime.layout import ENGINE, Endpoint, Layout
from sparkcep.runtime.metrics import EpochClock
from sparkcep.runtime.output_log import OutputLog
from sparkcep.runtime.sink import Sink
from sparkcep.runtime.wiring import host_runners, source_router


@dataclass
class SourceState:
    """What the engine knows of one input stream: its event-time watermark and whether it ended."""

    max_ts: int = WM_NONE
    ended: bool = False
    rows: int = 0

    @property
    def watermark(self) -> int:
        return WM_END if self.ended else self.max_ts


def parallelism_of(p: Plan, parallelism) -> dict[str, int]:
    """Instances per sub-query from an int or a dict {operator name: instances}."""
    if isinstance(parallelism, int) and not isinstance(parallelism, bool):
        if parallelism < 1:
            raise QueryError(f"parallelism must be >= 1, got {parallelism}")
        out = {sq.name: parallelism if sq.parallelizable else 1 for sq in p.subqueries}
    elif isinstance(parallelism, dict):
        out = {sq.name: 1 for sq in p.subqueries}
        for name, n in parallelism.items():
            if name not in p.sq_of:
                raise QueryError(f"parallelism names operator {name!r}, which query {p.query.name!r} "
                                 f"does not have; operators: {sorted(p.sq_of)}")
            sq = p.sq_of[name]
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise QueryError(f"parallelism of {name!r} must be an int >= 1, got {n!r}")
            if n > 1 and not sq.parallelizable:
                raise QueryError(f"{name!r} is a global aggregate (no by=): it runs as one instance")
            out[sq.name] = n
    else:
        raise QueryError(f"parallelism must be an int or a dict {{operator name: instances}}, got {parallelism!r}")
    return out


class Deployment:
    """A query running in this process; made by :meth:`sparkcep.Engine.deploy`.

    The engine calls, per ``send``: :meth:`push` with the stamped source
    batch, :meth:`flush` until the instances' channels took it, then
    :meth:`progress` (closing the epoch) — or :meth:`abort` if anything failed
    before progress, which voids the epoch everywhere. :meth:`end` closes a
    stream.
    """

    def __init__(self, id: str, query: Query, parallelism=1, bins: int = 128, retain: bool = True):
        if not isinstance(bins, int) or bins < 1 or bins & (bins - 1):
            raise QueryError(f"bins must be a power of two, got {bins}")
        self.id, self.query, self.bins = id, query, bins
        self.plan = plan(query)
        self.parallelism = parallelism_of(self.plan, parallelism)
        self.layout = Layout(self.plan, self.parallelism)
        self.tables = bin_tables(self.layout, bins)  # the authoritative bin tables; routers hold copies
        self.controls = 0  # control records sent so far (their numbers)
        self.logs = {out: OutputLog(op.schema.to_arrow(), out, retain, deployment=id)
                     for out, op in query.outputs.items()}
        self.sources: dict[str, SourceState] = {name: SourceState() for name in query.sources}
        self.clock = EpochClock()
        self.epoch = 1  # the open epoch: data pushed now belongs to it, progress closes it
        self.error: EngineError | None = None
        self._arrival: int | None = None
        self._undo: dict[str, tuple[int, int]] = {}  # stream -> its (max_ts, rows) before the open epoch
        self._connect()
        self._source_streams = {c: self.layout.sources_of(self.layout.sq[c[0]]) for c in self._source_channels}

    def _connect(self) -> None:
        """Create the instances and their channels: here all in this process."""
        chans = {pc: LocalChannel() for pc in self.layout.channels()}
        self.runners = host_runners(self.layout, self.bins, None, self.layout.instances(), chans, chans, self.clock)
        self._source_channels = {c: chans[(ENGINE, c)] for c in self.layout.consumers(ENGINE)}
        self.source_router = source_router(self.layout, self.bins, None, chans)
        self.sink = Sink(self.layout, self.logs, self.clock, {p: chans[(p, ENGINE)]
                                                               for p in self.layout.producers(ENGINE)})

    def explain(self) -> str:
        """The plan with the instances of each sub-query and where each runs."""
        return self.plan.explain(self.placement_lines(), self.parallelism)

    def placement_lines(self) -> dict[str, list[str]]:
        return {sq.name: [f"instance {i}: in this process" for i in range(self.parallelism[sq.name])]
                for sq in self.plan.subqueries}

    # --- data ------------------------------------------------------------------
    def push(self, stream: str, batch: pa.RecordBatch) -> None:
        """Route a stamped source batch (:func:`~sparkcep.core.columns.stamp`) into the instances reading ``stream``."""
        self.check()
        src = self.sources[stream]
        self._undo.setdefault(stream, (src.max_ts, src.rows))
        src.max_ts = max(src.max_ts, int(pa.compute.max(batch.column(columns.TS)).as_py()))
        src.rows += batch.num_rows
        if self._arrival is None:
            self._arrival = time.monotonic_ns()
        frontier = int(batch.column(columns.SEQ)[batch.num_rows - 1].as_py())
        self.source_router.send(stream, batch, (self.epoch, frontier, self._arrival))

    def flush(self) -> None:
        """Return once the instances' channels hold everything pushed (in-process: at once)."""

    def abort(self) -> None:
        """Void the open epoch: the sources forget it and every instance drops what it got of it."""
        for stream, (max_ts, rows) in self._undo.items():
            self.sources[stream].max_ts, self.sources[stream].rows = max_ts, rows
        self._undo, self._arrival = {}, None
        self.source_router.abort(self.epoch)
        self.epoch += 1

    def progress(self, frontier: int) -> None:
        """Every source row up to ``frontier`` is in: close the epoch; instances consume and fire."""
        self.check()
        arrival = self._arrival or time.monotonic_ns()
        self._undo, self._arrival = {}, None
        self.clock.note(self.epoch, frontier, arrival)
        for consumer, ch in self._source_channels.items():  # each instance: min over the streams it reads
            wm = min(self.sources[s].watermark for s in self._source_streams[consumer])
            ch.send_progress(self.epoch, frontier, wm, arrival)
        self.epoch += 1
        self._run()

    def configure(self, operator: str, owners) -> None:
        """From the next epoch on, bin ``b`` of ``operator`` belongs to instance ``owners[b]``.

        A :class:`~sparkcep.runtime.channels.Configure` record travels with the
        data and every router applies it at that epoch. It moves routing only:
        the state of the bins (and the tuples pending for them) must move with
        it (live migration), or be empty.
        """
        self.check()
        table = self._table(operator)
        table.set(owners)
        self.controls += 1
        self.source_router.control(Configure(self.epoch, self.controls, operator, table.owners.tolist()))
        self._run()

    def bin_owners(self, operator: str) -> list[int]:
        """For each bin of stateful ``operator``, the instance that owns it."""
        return self._table(operator).owners.tolist()

    def _table(self, operator: str):
        if operator not in self.tables:
            raise QueryError(f"query {self.query.name!r} has no route-key operator named {operator!r} "
                             f"(a stateful operator with by=/on= keys on more than one instance); "
                             f"bin tables: {sorted(self.tables)}")
        return self.tables[operator]

    def end(self, stream: str, frontier: int) -> None:
        self.sources[stream].ended = True
        self.progress(frontier)

    def _run(self) -> None:
        """Run every instance until nothing moves (in-process: results are out when this returns).

        An operator that raises fails the deployment (:class:`~sparkcep.errors.OperatorError`);
        the epoch it was in never reaches the outputs.
        """
        try:
            while True:
                moved = sum(r.poll(budget=1 << 30) for r in self.runners)
                if not moved:
                    break
        except OperatorError as e:
            self.fail(e)
            raise
        self.sink.poll()

    def fail(self, error: EngineError) -> None:
        """Mark the deployment failed with ``error`` (the first one wins)."""
        if self.error is None:
            self.error = error

    def wait(self, timeout: float | None = None) -> None:
        """Return once the outputs reflect every epoch closed so far (in-process: at once)."""
        self.check()

    def check(self) -> None:
        """Raise the deployment's error, if it failed."""
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        """Drop the deployment's instances: their state is freed now, not at the next cyclic collection."""
        self.runners = []

    # --- state -----------------------------------------------------------------
    def instance_metrics(self) -> dict[Endpoint, dict]:
        """Per instance: counters (rows, batches, busy time, latency histogram, epoch) and queues."""
        return {r.endpoint: {**r.counters.snapshot(), "queue": r.queued(), "late": r.late()}
                for r in self.runners}
