"""Active replication (UPM-CEP §6): a deployment run as several replicas, each fed every input.

:class:`ReplicaSet` stands for the deployment where the engine keeps one:
each ``send`` is pushed to every replica that runs (stamped once: the same
sequence numbers, event times and watermarks), and their outputs meet in
a :class:`~sparkcep.replication.dedup.DedupSink`. A replica that fails —
noticed on the data path, a channel whose peer died or an instance
manager's command connection closing — is dropped from the feed at once;
the send goes on with the others and :mod:`sparkcep.replication.catchup`
rebuilds it. The set fails only when no replica runs.
"""

from __future__ import annotations

import logging
import threading
import time

from sparkcep.errors import EngineError
from sparkcep.replication.dedup import DedupSink

log = logging.getLogger("sparkcep")

RUNNING, FAILED, CATCHING_UP = "running", "failed", "catching-up"


class ReplicaSet:
    """The replicas (``members``: runtime deployments) of one query; ``sides[r]``: the instance managers of replica r
    (empty in one process). ``rebuild(r)`` starts the catch-up of a failed replica (in a thread)."""

    def __init__(self, members: list, sides: list[set[int]], logs: dict):
        self.members, self.sides, self.logs = members, sides, logs
        self.states = [RUNNING] * len(members)
        self.dedup = DedupSink(logs)
        self.failovers: list[dict] = []  # each replica failure: when, which, why
        self.catchups: list[dict] = []  # each rebuild: which, state size, duration
        self.rebuild = None  # set by the engine: rebuild(r) starts a catch-up
        self.on_fail: list = []  # called with the error when no replica is left
        self.error: EngineError | None = None
        self.closed = False  # undeployed
        self._lock = threading.Lock()
        for r, dep in enumerate(members):
            dep.sink.deliver = self.dedup.deliverer(r)
            dep.on_fail.append(lambda e, r=r: self.lost(r, e))

    # --- which replica -------------------------------------------------------------------
    def fed(self) -> list:
        """The replicas the sources feed: running, or catching up."""
        return [d for d, s in zip(self.members, self.states) if s != FAILED]

    def running(self) -> list:
        """The replicas running in step (migrations act on them)."""
        return [d for d, s in zip(self.members, self.states) if s == RUNNING]

    @property
    def primary(self):
        """The replica whose view (metrics, plan, bin tables) the set shows: the first running one."""
        return next(iter(self.running() or self.fed() or self.members))

    def lost(self, r: int, error: EngineError) -> None:
        """Replica ``r`` failed: stop feeding it, rebuild it if the others run, else (or when a subscriber
        raised) fail the set."""
        with self._lock:
            if self.states[r] == FAILED:
                return
            self.states[r] = FAILED
            survivors = self.running()  # one catching up cannot carry the query: its source is gone
            if error.code == "SINK":  # a subscriber raised: every replica would meet it, the query fails
                survivors = []
            self.failovers.append({"time": time.time(), "replica": r, "error": str(error), "code": error.code})
        if not survivors:
            self.fail(error)
            return
        log.warning("query %s: replica %d failed (%s); %d replica(s) run on; rebuilding it where there is room",
                    self.query.name, r, error, len(survivors))
        if self.rebuild is not None:
            self.rebuild(r)

    def fail(self, error: EngineError) -> None:
        if self.error is None:
            self.error = error
            for fn in self.on_fail:
                fn(error)

    def describe(self) -> list[dict]:
        """Per replica: its state and the instance managers it runs on."""
        out = []
        for r, (dep, state) in enumerate(zip(self.members, self.states)):
            ims = sorted({dep.gen.names[i] for i in dep.gen.hosts}) if hasattr(dep.gen, "names") else []
            out.append({"replica": r, "state": state, "instance_managers": ims})
        return out

    def explain(self) -> str:
        """The plan with every replica's instances, where each runs, and the replica's state."""
        lines: dict[str, list[str]] = {}
        for r, (dep, state) in enumerate(zip(self.members, self.states)):
            for sq, where in dep.placement_lines().items():
                lines.setdefault(sq, []).extend(f"replica {r} ({state}) {w}" for w in where)
        return self.primary.plan.explain(lines, self.primary.parallelism)

    # --- the data path, as the engine drives one deployment --------------------------------
    def _each(self, act) -> None:
        """``act(replica)`` for every fed replica; one that fails is lost, the rest go on."""
        for r, dep in enumerate(self.members):
            if self.states[r] == FAILED:
                continue
            try:
                act(dep)
            except EngineError as e:
                dep.fail(e)
                self.lost(r, e)
        self.check()

    def push(self, stream, batch, max_ts, frontier) -> None:
        self._each(lambda d: d.push(stream, batch, max_ts, frontier))

    def flush(self) -> None:
        self._each(lambda d: d.flush())

    def abort(self) -> None:
        self._each(lambda d: d.abort())

    def progress(self, frontier: int) -> None:
        self._each(lambda d: d.progress(frontier))

    def end(self, stream: str, frontier: int) -> None:
        self._each(lambda d: d.end(stream, frontier))

    def wait(self, timeout: float | None = None) -> None:
        """Return once the outputs reflect every epoch closed so far: once one replica delivered them."""
        deadline = time.monotonic() + (120.0 if timeout is None else timeout)
        while True:
            self.check()
            fed = self.fed()
            target = max(d.epoch for d in fed) - 1
            if any(d.sink.done_epoch >= target for d in fed):
                return
            if time.monotonic() > deadline:
                raise EngineError(f"query {self.query.name}: outputs are behind epoch {target} after "
                                  f"{timeout or 120:.0f} s", "WAIT_TIMEOUT")
            time.sleep(0.002)

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        self.closed = True
        self.states = [FAILED] * len(self.members)
        for dep in self.members:
            dep.close()

    def metrics(self) -> dict:
        """Replica states, the dedup sink, failovers and catch-ups."""
        return {"replicas": self.describe(),
                "dedup": self.dedup.snapshot({r: d.sink.done_epoch for r, d in enumerate(self.members)}),
                "failovers": list(self.failovers), "catchups": list(self.catchups)}

    @property
    def sources(self):
        return self.primary.sources

    def __getattr__(self, name: str):
        return getattr(self.primary, name)
