"""Automatic balancing (UPM-CEP §5, dynamic migration) of the queries deployed with ``balance=True``.

Every :data:`INTERVAL_S` the balancer reads how busy each instance manager
was (the share of wall time its loop spent working: a process that shares
its core with another one needs more of it for the same input) and acts:

* an instance manager saturated (busy > :data:`HIGH`) for :data:`SUSTAIN`
  samples in a row while another one running the same route-key operator is
  at least :data:`GAP` less busy: a quarter of the saturated instance's bins
  move to the least busy one, fluid;
* a newly added instance manager: each balanced operator gets one more
  instance there, and its bins are spread evenly (a share for the newcomer);
* sub-queries that exchange the most rows placed on different NUMA nodes:
  an instance moves (State Transfer) where the placement would now put it.

Every decision is logged with its reason and kept (:meth:`Balancer.snapshot`,
``engine.metrics()["balancer"]``, ``sparkcep status``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from sparkcep.errors import SparkcepError
from sparkcep.runtime.placement import place

log = logging.getLogger("sparkcep")

INTERVAL_S = 1.0
HIGH = 0.85  # busy share of a saturated instance manager
GAP = 0.3  # how much less busy the receiving one must be
SUSTAIN = 3  # samples in a row
COOLDOWN_S = 3.0  # after a decision, let the load settle before the next


class Balancer:
    """Watches the instance managers of ``cluster`` and migrates the deployments it is given."""

    def __init__(self, cluster, interval: float = INTERVAL_S):
        self.cluster, self.interval = cluster, interval
        self.watched: dict[str, tuple] = {}  # query -> (runtime deployment, its Migrator)
        self.decisions: deque = deque(maxlen=128)
        self.busy: dict[int, float] = {}  # instance manager -> busy share over the last interval
        self._hot: dict[int, int] = {}  # instance manager -> samples in a row above HIGH
        self._last: dict[int, tuple[int, float]] = {}  # instance manager -> (busy ns, time) of the last sample
        self._joined: list[int] = []  # instance managers added since the last look
        self._quiet_until = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sparkcep-balancer", daemon=True)
        self._thread.start()

    def watch(self, dep, migrator) -> None:
        self.watched[dep.query.name] = (dep, migrator)

    def forget(self, query: str) -> None:
        self.watched.pop(query, None)

    def joined(self, im: int) -> None:
        """Instance manager ``im`` was added to the engine."""
        self._joined.append(im)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)

    # --- the loop --------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._sample()
                if self.watched and time.monotonic() >= self._quiet_until:
                    self._act()
            except SparkcepError as e:  # a deployment failed or went away meanwhile: look again later
                log.warning("balancer: %s [%s]", e, e.code)
            except Exception:  # a bug here must not stop the engine: say it, keep going
                log.exception("balancer failed; it keeps watching")

    def _sample(self) -> None:
        for i, snap in self.cluster.snapshots().items():
            now = (snap["busy_ns"], snap["time"])
            before = self._last.get(i)
            self._last[i] = now
            if before is None or now[1] <= before[1]:
                continue
            self.busy[i] = min(1.0, (now[0] - before[0]) / 1e9 / (now[1] - before[1]))
            self._hot[i] = self._hot.get(i, 0) + 1 if self.busy[i] > HIGH else 0

    def _act(self) -> None:
        if self._joined:
            im = self._joined.pop(0)
            for q, (dep, migrator) in list(self.watched.items()):
                for op in sorted(dep.tables):
                    n = dep.parallelism[dep.plan.sq_of[op].name]
                    self._decide(q, op, "rescale", f"instance manager {self.cluster.ims[im].name} joined: it gets "
                                 f"a share of {op!r}", lambda: migrator.rescale(op, n + 1, strategy="fluid"))
            return
        for q, (dep, migrator) in list(self.watched.items()):
            if self._unload(q, dep, migrator) or self._colocate(q, dep, migrator):
                return

    def _unload(self, q: str, dep, migrator) -> bool:
        """Bins off a saturated instance manager, to the least busy one running the same operator."""
        for op in sorted(dep.tables):
            sq = dep.plan.sq_of[op].name
            where = {i: at for (name, i), at in dep.assignment.items() if name == sq}
            hot = [i for i, at in where.items() if self._hot.get(at, 0) >= SUSTAIN]
            if not hot:
                continue
            src = max(hot, key=lambda i: self.busy.get(where[i], 0.0))
            dst = min(where, key=lambda i: self.busy.get(where[i], 1.0))
            gap = self.busy.get(where[src], 0.0) - self.busy.get(where[dst], 1.0)
            owners = dep.bin_owners(op)
            held = [b for b, o in enumerate(owners) if o == src]
            if dst == src or gap < GAP or len(held) < 2:
                continue
            moving = held[:max(1, len(held) // 4)]
            ims = self.cluster.ims
            reason = (f"instance manager {ims[where[src]].name} is saturated (busy {self.busy[where[src]]:.0%} for "
                      f"{self._hot[where[src]]} s) while {ims[where[dst]].name} is busy "
                      f"{self.busy[where[dst]]:.0%}: {len(moving)} of the {len(held)} bins of {op}[{src}] go to "
                      f"{op}[{dst}]")
            self._decide(q, op, "migrate", reason, lambda: migrator.migrate(op, dict.fromkeys(moving, dst), "fluid"))
            return True
        return False

    def _colocate(self, q: str, dep, migrator) -> bool:
        """An instance whose sub-query exchanges most with sub-queries on another NUMA node moves there."""
        slots, topology = self.cluster.slots_and_topology()
        if len(topology.nodes) < 2:
            return False
        node = {s.index: s.node for s in slots}
        ideal = place(dep.layout, slots, topology, _traffic(dep), {})
        for ep, at in sorted(dep.assignment.items()):
            want = ideal.get(ep)
            if want is None or node.get(at) == node.get(want):
                continue
            op = dep.layout.sq[ep[0]].head.name
            reason = (f"{ep[0]}[{ep[1]}] runs on node {node.get(at)} but exchanges most rows with sub-queries "
                      f"on node {node.get(want)}: it moves to {self.cluster.ims[want].name}")
            self._decide(q, op, "move", reason, lambda: migrator.move(op, ep[1], self.cluster.ims[want].name))
            return True
        return False

    def _decide(self, q: str, op: str, action: str, reason: str, run) -> None:
        log.warning("balancer: query %s: %s", q, reason)
        entry = {"time": time.time(), "query": q, "operator": op, "action": action, "reason": reason}
        self.decisions.append(entry)
        try:
            entry["report"] = run()
        finally:
            self._quiet_until = time.monotonic() + COOLDOWN_S
            self._hot.clear()

    def snapshot(self) -> dict:
        """For metrics and ``sparkcep status``: busy share per instance manager, the decisions made."""
        names = {im.index: im.name for im in self.cluster.ims}
        return {"busy": {names.get(i, str(i)): round(b, 3) for i, b in self.busy.items()},
                "watched": sorted(self.watched), "decisions": list(self.decisions)}


def _traffic(dep) -> dict[tuple[str, str], float]:
    """Rows each sub-query sent to each other one so far, from the instances' counters."""
    rows: dict[str, int] = {}
    for m in dep.instance_metrics().values():
        for op, n in m["rows_out"].items():
            rows[op] = rows.get(op, 0) + n
    out: dict[tuple[str, str], float] = {}
    for e in dep.layout.edges:
        if e.src.name in dep.plan.sq_of and e.dst.name in dep.plan.sq_of:
            key = (dep.plan.sq_of[e.src.name].name, dep.plan.sq_of[e.dst.name].name)
            out[key] = out.get(key, 0.0) + float(rows.get(e.src.name, 0)) + 1.0
    return out
