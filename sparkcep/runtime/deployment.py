"""A deployed query as the engine sees it: plan, generations of instances, sources, outputs, bin tables.

A deployment runs as a *generation*: one wiring of its instances
(placement, channels). Changing where instances run or how many there are
(State Transfer, rescaling, rebuilding a lost replica) prepares the next
generation beside the running one (:meth:`Deployment.prepare`) and cuts over
at an epoch (:meth:`Deployment.cut_over`): the running generation hands its
state over (``Export``) and retires, the new one installs it (``Import``) and
takes every epoch from then on (DESIGN §5). Moving bins between the
instances of one generation (Megaphone) needs no new generation:
:meth:`Deployment.control` sends the records into the running one.

:class:`Deployment` runs every instance in the calling process
(``Engine.local(workers=0)``): channels are in-process queues and each
engine call runs the instances until nothing is left to do, so results are
there when ``send`` returns. :class:`~sparkcep.runtime.remote.RemoteDeployment`
runs the same instances (:class:`~sparkcep.runtime.instance.InstanceRunner`,
wired by :mod:`sparkcep.runtime.wiring`) on instance managers; the source
side (stamping epochs, routing source batches, watermarks per source), the
bin tables and the output side (:class:`~sparkcep.runtime.sink.Sink`) are
this module's, for both.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import pyarrow as pa

from sparkcep.arguments import did_you_mean, integer
from sparkcep.core.operators import WM_END, WM_NONE
from sparkcep.errors import EngineError, OperatorError, QueryError
from sparkcep.query.planner import Plan, plan
from sparkcep.query.query import Query
from sparkcep.runtime.balancers import Router, bin_tables
from sparkcep.runtime.channels import Configure, Consumer, Control, LocalChannel, Producer, Retire
from sparkcep.runtime.handoff import ENGINE_HOST, Board, Handoffs
from sparkcep.runtime.layout import ENGINE, Endpoint, Layout
from sparkcep.runtime.metrics import Counters, EpochClock
from sparkcep.runtime.output_log import OutputLog, SubscriberError
from sparkcep.runtime.sink import Sink
from sparkcep.runtime.wiring import host_runners, source_router

HANDOFF_TIMEOUT_S = 120.0  # state handed over must be installed within this long


@dataclass
class SourceState:
    """What the engine knows of one input stream: its event-time watermark and whether it ended."""

    max_ts: int = WM_NONE
    ended: bool = False
    rows: int = 0

    @property
    def watermark(self) -> int:
        return WM_END if self.ended else self.max_ts


MAX_BINS = 1 << 16  # bins per stateful operator: each router and instance keeps a table of them


def parallelism_of(p: Plan, parallelism, bins: int | None = None) -> dict[str, int]:
    """Instances per sub-query from an int or a mapping {operator name: instances}; at most ``bins``
    instances per sub-query (``TOO_MANY_INSTANCES``: an instance owns at least one bin)."""
    if hasattr(parallelism, "items"):
        out = {sq.name: 1 for sq in p.subqueries}
        for name, n in parallelism.items():
            if name not in p.sq_of:
                raise QueryError(f"parallelism names operator {name!r}, which query {p.query.name!r} does not "
                                 f"have{did_you_mean(name, p.sq_of)}; operators: {sorted(p.sq_of)}",
                                 "UNKNOWN_OPERATOR")
            sq = p.sq_of[name]
            n = integer(n, f"parallelism of {name!r}", minimum=1, code="BAD_PARALLELISM")
            if n > 1 and not sq.parallelizable:
                raise QueryError(f"{name!r} is a global aggregate (no by=): it runs as one instance",
                                 "BAD_PARALLELISM")
            out[sq.name] = n
    else:
        n = integer(parallelism, "parallelism (an int or {operator name: instances})", minimum=1,
                    code="BAD_PARALLELISM")
        out = {sq.name: n if sq.parallelizable else 1 for sq in p.subqueries}
    for sq in p.subqueries:
        if bins is not None and out[sq.name] > bins:
            ops = ", ".join(op.name for op in sq.operators)
            raise QueryError(f"{out[sq.name]} instances of {sq.name} ({ops}) exceed its {bins} bins: an instance "
                             f"owns at least one bin (deploy with more bins, up to {MAX_BINS})", "TOO_MANY_INSTANCES")
    return out


def bins_of(bins) -> int:
    """``bins`` checked: a power of two from 1 to :data:`MAX_BINS` (``BAD_BINS``)."""
    n = integer(bins, "bins", minimum=1, maximum=MAX_BINS, code="BAD_BINS")
    if n & (n - 1):
        raise QueryError(f"bins must be a power of two, got {n}", "BAD_BINS")
    return n


@dataclass
class Generation:
    """One wiring of a deployment's instances: the sources' router and channels, the outputs' channels."""

    number: int
    layout: Layout
    source_router: Router
    source_channels: dict[Endpoint, Producer]
    outputs: dict[Endpoint, Consumer]  # the channels into the engine's sink
    runners: list = field(default_factory=list)  # the instances, when they run in this process
    feeds: list = field(default_factory=list)  # the sink's feeds of ``outputs``

    def __post_init__(self):
        self.source_streams = {c: self.layout.sources_of(self.layout.sq[c[0]]) for c in self.source_channels}

    def host_of(self, endpoint: Endpoint) -> str:
        """The process running ``endpoint``, as Export items name it."""
        return ENGINE_HOST

    def close(self) -> None:
        """Drop the instances: their state is freed now, not at the next cyclic collection."""
        self.runners = []


class Deployment:
    """A query running in this process; made by :meth:`sparkcep.Engine.deploy`.

    The engine calls, per ``send``: :meth:`push` with the stamped source
    batch, :meth:`flush` until the instances' channels took it, then
    :meth:`progress` (closing the epoch) — or :meth:`abort` if anything failed
    before progress, which voids the epoch everywhere. :meth:`end` closes a
    stream. Calls that change it hold :attr:`lock` (the engine's), so control
    records fall between epochs.
    """

    def __init__(self, id: str, query: Query, parallelism=1, bins: int = 128, retain: bool = True,
                 handoffs: Handoffs | None = None, board: Board | None = None, lock=None):
        self.id, self.query, self.bins = id, query, bins_of(bins)
        self.replica: int | None = None  # which replica of a replicated deployment it is
        self.plan = plan(query)
        self.parallelism = parallelism_of(self.plan, parallelism, self.bins)
        self.tables = bin_tables(Layout(self.plan, self.parallelism), bins)  # authoritative; routers hold copies
        self.board = board or Board()
        self.handoffs = handoffs or Handoffs(ENGINE_HOST, report=self.board.installed)
        self.lock = lock or threading.RLock()
        self.controls = 0  # control records sent so far (their numbers)
        self.logs = {out: OutputLog(op.schema.to_arrow(), out, retain, deployment=id)
                     for out, op in query.outputs.items()}
        self.sources: dict[str, SourceState] = {name: SourceState() for name in query.sources}
        self.clock = EpochClock()
        self.epoch = 1  # the open epoch: data pushed now belongs to it, progress closes it
        self.error: EngineError | None = None
        self.closed = False  # undeployed: every later call that would change it raises UNDEPLOYED
        self.on_fail: list = []  # called with the error when the deployment fails
        self._arrival: int | None = None
        self._undo: dict[str, tuple[int, int]] = {}  # stream -> its (max_ts, rows) before the open epoch
        self.generations = 0
        self.retiring: list[Generation] = []  # generations handing over to the running one
        self.retired: dict[str, Counters] = {}  # per sub-query: what its instances that retired counted
        self.sink = Sink(Layout(self.plan, self.parallelism), self.logs, self.clock)
        self.gen = self._generation(self.parallelism, None)
        self.gen.feeds = self.sink.add(self.gen.outputs, 0)

    def _generation(self, parallelism: dict[str, int], placement) -> Generation:
        """Create the instances of a generation and their channels: here all in this process."""
        self.generations += 1
        layout = Layout(self.plan, parallelism)
        owners = {op: t.owners.tolist() for op, t in self.tables.items()}
        chans = {pc: LocalChannel() for pc in layout.channels()}
        return Generation(self.generations, layout, source_router(layout, self.bins, owners, chans),
                          {c: chans[(ENGINE, c)] for c in layout.consumers(ENGINE)},
                          {p: chans[(p, ENGINE)] for p in layout.producers(ENGINE)},
                          host_runners(layout, self.bins, owners, layout.instances(), chans, chans, self.clock,
                                       self.handoffs))

    @property
    def layout(self) -> Layout:
        return self.gen.layout

    @property
    def runners(self) -> list:
        """The instances running in this process (none when they run on instance managers)."""
        return [r for g in [self.gen, *self.retiring] for r in g.runners]

    def explain(self) -> str:
        """The plan with the instances of each sub-query and where each runs."""
        return self.plan.explain(self.placement_lines(), self.parallelism)

    def placement_lines(self) -> dict[str, list[str]]:
        return {sq.name: [f"instance {i}: in this process" for i in range(self.parallelism[sq.name])]
                for sq in self.plan.subqueries}

    # --- data ------------------------------------------------------------------
    def push(self, stream: str, batch: pa.RecordBatch, max_ts: int, frontier: int) -> None:
        """Route a stamped source batch (:func:`~sparkcep.core.columns.stamp`) into the instances reading
        ``stream``: its largest event time is ``max_ts`` and its last sequence number ``frontier``."""
        self.check()
        src = self.sources[stream]
        self._undo.setdefault(stream, (src.max_ts, src.rows))
        src.max_ts = max(src.max_ts, max_ts)
        src.rows += batch.num_rows
        if self._arrival is None:
            self._arrival = time.monotonic_ns()
        self.gen.source_router.send(stream, batch, (self.epoch, frontier, self._arrival))

    def flush(self) -> None:
        """Return once the instances' channels hold everything pushed (in-process: at once)."""

    def abort(self) -> None:
        """Void the open epoch: the sources forget it and every instance drops what it got of it."""
        for stream, (max_ts, rows) in self._undo.items():
            self.sources[stream].max_ts, self.sources[stream].rows = max_ts, rows
        self._undo, self._arrival = {}, None
        self.gen.source_router.abort(self.epoch)
        self.epoch += 1

    def progress(self, frontier: int) -> None:
        """Every source row up to ``frontier`` is in: close the epoch; instances consume and fire."""
        self.check()
        arrival = self._arrival or time.monotonic_ns()
        self._undo, self._arrival = {}, None
        self.clock.note(self.epoch, frontier, arrival)
        gen = self.gen
        for consumer, ch in gen.source_channels.items():  # each instance: min over the streams it reads
            wm = min(self.sources[s].watermark for s in gen.source_streams[consumer])
            ch.send_progress(self.epoch, frontier, wm, arrival)
        self.epoch += 1
        self._run()

    def end(self, stream: str, frontier: int) -> None:
        self.sources[stream].ended = True
        self.progress(frontier)

    # --- control -----------------------------------------------------------------
    def control(self, *records: Control) -> None:
        """Send control records into the running generation, to take effect at the open epoch.

        Each record is numbered and stamped here (its ``epoch`` and ``number``
        as given are replaced). A :class:`Configure` also changes the
        authoritative bin table.
        """
        with self.lock:
            self.check()
            for record in records:
                if isinstance(record, Configure):
                    self._table(record.operator).assign(record.bins, record.owners)
                self._stamp(record)
                self.gen.source_router.control(record)
            self._run()

    def configure(self, operator: str, owners) -> None:
        """From the open epoch on, bin ``b`` of ``operator`` belongs to instance ``owners[b]``.

        Routing only: the state of the bins (and the tuples pending for them)
        must move with it (:mod:`sparkcep.migration` sends the records that
        move it), or be empty.
        """
        table = self._table(operator)
        self.control(Configure(0, 0, operator, list(range(table.bins)), [int(o) for o in owners]))

    def _stamp(self, record: Control) -> None:
        self.controls += 1
        record.epoch, record.number = self.epoch, self.controls

    def prepare(self, parallelism: dict[str, int], placement=None) -> Generation:
        """Deploy the next generation beside the running one: its instances wait for :meth:`cut_over`.

        ``parallelism``: instances per sub-query (``{"SQ1": 2, ...}``);
        ``placement``: where its instances run ({endpoint: instance manager
        index}; None: the placement decides). Nothing changes for the running
        generation; on failure nothing is left of the new one.
        """
        self._check_open()
        return self._generation(dict(parallelism), placement)

    def cut_over(self, gen: Generation, imports=(), retire: bool = True) -> Generation | None:
        """From the open epoch on, ``gen`` runs the deployment.

        Call it holding :attr:`lock`, right after sending the ``Export`` records
        whose tickets ``imports`` name (into this deployment, or into a replica
        of it): the running generation passes a ``Retire`` (unless it died:
        ``retire=False``, and its feeds are dropped; it is returned, for the
        caller to :meth:`drop` once it released the lock), ``gen`` gets the
        ``imports`` first, and the sink reads ``gen``'s outputs from this epoch on.
        """
        self._check_open()
        old, dead = self.gen, None
        if retire:
            record = Retire(0, 0)
            self._stamp(record)
            old.source_router.control(record)
            self.retiring.append(old)
        else:
            self.sink.drop(old.feeds, self.epoch - 1)
            dead = old
        for record in imports:
            self._stamp(record)
            gen.source_router.control(record)
        gen.feeds = self.sink.add(gen.outputs, self.epoch - 1)
        self.gen, self.parallelism = gen, dict(gen.layout.parallelism)
        owners = {op: t.owners.tolist() for op, t in self.tables.items()}
        self.tables = bin_tables(gen.layout, self.bins, owners)
        self._run()
        return dead

    def rejoin(self, other: "Deployment") -> None:
        """Take the progress of ``other``, a replica of this deployment that ran on while this one was
        lost: its open epoch, sources and bin tables (call it holding :attr:`lock`, before a
        :meth:`cut_over` to a generation seeded from ``other``'s state)."""
        self.epoch, self.error = other.epoch, None
        self.sources = {name: SourceState(s.max_ts, s.ended, s.rows) for name, s in other.sources.items()}
        self._undo, self._arrival = {}, None
        for op, table in other.tables.items():
            self.tables[op] = table.copy()

    def await_handoffs(self, tickets, timeout: float = HANDOFF_TIMEOUT_S) -> int:
        """Wait until the state handed over under ``tickets`` is installed; returns its bytes."""
        return self.board.wait(tickets, timeout, self.check)

    def await_retired(self, timeout: float = HANDOFF_TIMEOUT_S) -> None:
        """Wait until every retiring generation passed its Retire record to the sink, then drop it."""
        deadline = time.monotonic() + timeout
        while self.retiring:
            with self.lock:
                self._run()
                done = [g for g in self.retiring if self.sink.retired(g.feeds)]
                for g in done:
                    self.retiring.remove(g)
            for g in done:
                self._keep_counts(g)
                self.drop(g)
            if not self.retiring:
                return
            self.check()
            if time.monotonic() > deadline:
                raise EngineError(f"query {self.query.name}: the previous generation of its instances did not "
                                  f"retire within {timeout:.0f} s", "RETIRE_TIMEOUT")
            time.sleep(0.005)

    def _keep_counts(self, old: Generation) -> None:
        """Add to :attr:`retired` the last counts of the instances of ``old``, now retired, that hand no
        counters on: those a rescale in leaves out, and those moved to another process (their successor
        counts from zero). One staying in its process gives its counters with itself (``adopt``)."""
        for (sq, i), snapshot in self.last_counts(old).items():
            if i < self.gen.layout.parallelism[sq] and self.gen.host_of((sq, i)) == old.host_of((sq, i)):
                continue
            self.retired.setdefault(sq, Counters()).absorb(Counters.of(snapshot))

    def last_counts(self, gen: Generation) -> dict[Endpoint, dict]:
        """The counters of ``gen``'s instances (:meth:`~sparkcep.runtime.metrics.Counters.snapshot` each)."""
        return {r.endpoint: r.counters.snapshot() for r in gen.runners}

    def drop(self, gen: Generation) -> None:
        """Undeploy a generation that no longer runs the deployment."""
        gen.close()

    def bin_owners(self, operator: str) -> list[int]:
        """For each bin of stateful ``operator``, the instance that owns it."""
        return self._table(operator).owners.tolist()

    def host_of(self, endpoint: Endpoint) -> str:
        """The process running ``endpoint`` of the running generation, as Export items name it."""
        return self.gen.host_of(endpoint)

    def _table(self, operator: str):
        if operator not in self.tables:
            raise QueryError(f"query {self.query.name!r} has no route-key operator named {operator!r}"
                             f"{did_you_mean(operator, self.tables)} "
                             f"(a stateful operator with by=/on= keys on more than one instance); "
                             f"bin tables: {sorted(self.tables)}", "UNKNOWN_OPERATOR")
        return self.tables[operator]

    def _run(self) -> None:
        """Run every instance until nothing moves (in-process: results are out when this returns).

        An operator that raises fails the deployment (:class:`~sparkcep.errors.OperatorError`);
        the epoch it was in never reaches the outputs. A subscriber that raises: :meth:`poll_sink`.
        """
        runners = self.runners
        try:
            while True:
                moved = sum(r.poll(budget=1 << 30) for r in runners)
                if not moved:
                    break
        except OperatorError as e:
            self.fail(e)
            raise
        self.poll_sink()

    def poll_sink(self) -> int:
        """Move what the output channels hold into the output logs. A subscriber that raises fails the
        deployment (``SINK``, naming its error) once its rows are out: the next call on it raises."""
        try:
            return self.sink.poll()
        except SubscriberError as e:
            error = EngineError(f"query {self.query.name!r}: {e}", "SINK")
            error.__cause__ = e.__cause__
            self.fail(error)
            return 0

    def fail(self, error: EngineError) -> None:
        """Mark the deployment failed with ``error`` (the first one wins) and say so to ``on_fail``."""
        if self.error is None:
            self.error = error
            for fn in self.on_fail:
                fn(error)

    def wait(self, timeout: float | None = None) -> None:
        """Return once the outputs reflect every epoch closed so far (in-process: at once)."""
        self.check()

    def check(self) -> None:
        """Raise the deployment's error, if it failed, or EngineError UNDEPLOYED once it is closed (a
        migration under way when the query is undeployed stops there)."""
        if self.error is not None:
            raise self.error
        self._check_open()

    def _check_open(self) -> None:
        if self.closed:
            raise EngineError(f"query {self.query.name!r} is undeployed", "UNDEPLOYED")

    def close(self) -> None:
        """Drop the deployment's instances: their state is freed now, not at the next cyclic collection."""
        self.closed = True
        for g in [self.gen, *self.retiring]:
            g.close()
        self.retiring = []

    # --- state -----------------------------------------------------------------
    def instance_metrics(self) -> dict[Endpoint, dict]:
        """Per instance: counters (rows, batches, busy time, latency histogram, epoch) and queues."""
        return {r.endpoint: {**r.counters.snapshot(), "queue": r.queued(), "late": r.late()}
                for r in self.gen.runners}
