"""Automatic balancing (UPM-CEP §5, dynamic migration) of the queries deployed with ``balance=True``.

Every :data:`INTERVAL_S` the balancer samples each instance manager: how
busy it was (the share of wall time its loop spent working: a process that
shares its core with others needs more of it for the same input), how much
input waits for its instances, and per instance the rows it took and its
part of the busy time. Then it acts, one decision at a time:

* **Unload.** An instance manager saturated — busy above :data:`HIGH`, or
  :data:`QUEUED_BYTES` of input waiting for instances whose outputs are free
  — for :data:`SUSTAIN` samples in a row, while another one running the same
  route-key operator is at least :data:`GAP` less loaded: bins of the
  saturated instance move to the least loaded one, in one step. How many:
  the two instances' bins are shared in proportion to the rows per second
  each could take — its instance manager's time not spent on other
  instances over its time per row, measured over the last interval for the
  saturated one, the best of the last few for the other (the demand itself
  is unknown: back-pressure throttles both once one falls behind) — at
  most :data:`MAX_SHARE` of the saturated one's bins per decision; without
  rates yet (a new generation), the share that would even the two busy
  shares out. An instance manager bins moved off takes none back for
  :data:`HOLD_S`: what slowed it (another process on its core) may well
  still be there, it reads idle once relieved, and bins sent back would
  saturate it again.
* **Join.** A newly added instance manager: each balanced operator gets one
  more instance there, its bins spread evenly (:data:`JOIN_STRATEGY`).
* **Co-locate.** Sub-queries that exchange the most rows placed on
  different NUMA nodes: an instance moves (State Transfer) where the
  placement would now put it.

A decision runs on a thread of its own (sampling goes on meanwhile); after
it the balancer waits :data:`COOLDOWN_S` and :data:`SUSTAIN` fresh samples,
so it judges the load the move left, not the one it answered. Every
decision is logged with its reason and kept with its report, or its error
(:meth:`Balancer.snapshot`, ``engine.metrics()["balancer"]``, ``sparkcep
status``).

Why these values (measured on 2 shared cores, ``tests/migration/test_balancer.py``):
an instance manager that keeps up reads 0.1-0.6, one that falls behind
0.75-1.0 — not always above 0.85: on a crowded core it waits to be
scheduled after each sleep, which its loop counts as idle (beside 15 busy
processes it read 0.75-0.83 while seconds behind), so its input piling up
(one send's worth while it keeps up, megabytes once behind) says it too.
Three samples ignore a busy second (a GC pause, a burst, another process).
A saturated owner reaches a step's epoch only after its whole backlog (up to
its input channels' capacity, seconds of its slowed work), so a move off it
pays that wait per step: ``fluid`` (a bin per step) moved about one bin a
second there; the balancer moves them all at once. A join is a generation
switch, which holds the input until the new instance is deployed, then the
bins' moves, all at once: 1,365 of 4,096 bins (4 MB of window state, 50,000
records/s flowing) in 0.21 s, the largest latency 56 ms, where ``batched``,
16 bins a step, took 87 steps, 5.4 s, and 120 ms (``examples/live_rescale.py``
on the 2-core machine).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from sparkcep.errors import SparkcepError
from sparkcep.runtime.placement import place

log = logging.getLogger("sparkcep")

INTERVAL_S = 1.0  # between two samples of every instance manager
HIGH = 0.85  # busy share above which an instance manager counts as saturated
QUEUED_BYTES = 1 << 20  # input waiting for instances with free outputs: saturated (half a channel at most)
GAP = 0.3  # how much less loaded (busy share; 1.0 when saturated) the receiving one must be
SUSTAIN = 3  # samples in a row saturated before bins move
COOLDOWN_S = 3.0  # after a decision, let the load settle before the next
MAX_SHARE = 0.75  # of the saturated instance's bins, moved by one decision at most
HOLD_S = 30.0  # an instance manager bins moved off takes none back for this long
JOIN_STRATEGY = "all-at-once"  # how bins move onto a new instance manager


class Balancer:
    """Watches the instance managers of ``cluster`` and migrates the deployments it is given."""

    def __init__(self, cluster, interval: float = INTERVAL_S):
        self.cluster, self.interval = cluster, interval
        self.watched: dict[str, tuple] = {}  # query -> (runtime deployment, its Migrator)
        self.decisions: deque = deque(maxlen=128)
        self.busy: dict[int, float] = {}  # instance manager -> busy share over the last interval
        self.queued: dict[int, int] = {}  # instance manager -> input bytes waiting for its unblocked instances
        self.load: dict[int, float] = {}  # instance manager -> its busy share, 1.0 while its input piles up
        self.parts: dict[int, dict] = {}  # instance manager -> {(generation, endpoint): (busy part, rows/s)}
        self._capacity: dict[tuple, deque] = {}  # (instance manager, generation, endpoint) -> the last capacities
        self._hot: dict[int, int] = {}  # instance manager -> samples in a row saturated
        self._last: dict[int, tuple] = {}  # instance manager -> (busy ns, time, {(gen, ep): (busy ns, rows)})
        self._joined: list[int] = []  # instance managers added since the last look
        self._shares: list[tuple[int, str, str]] = []  # (newcomer, query, operator) still to rescale onto it
        self._unloaded: dict[int, float] = {}  # instance manager -> when bins last moved off it
        # input piles up to at most a channel's capacity: half of it counts with small channels
        self._queued_bytes = min(QUEUED_BYTES, getattr(cluster, "ring_bytes", QUEUED_BYTES) // 2)
        self._quiet_until = 0.0
        self._deciding: threading.Thread | None = None  # the decision under way
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
        if self._deciding is not None:
            self._deciding.join(10)

    # --- the loop --------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._sample()
                if self.watched and not self._busy_deciding() and time.monotonic() >= self._quiet_until:
                    self._act()
            except SparkcepError as e:  # a deployment failed or went away meanwhile: look again later
                log.warning("balancer: %s [%s]", e, e.code)
            except Exception:  # a bug here must not stop the engine: say it, keep going
                log.exception("balancer failed; it keeps watching")

    def _busy_deciding(self) -> bool:
        return self._deciding is not None and self._deciding.is_alive()

    def _sample(self) -> None:
        for i, snap in self.cluster.snapshots().items():
            counters = {(wire, ep): (c["busy_ns"], c["rows_in"])
                        for wire, eps in snap["deployments"].items() for ep, c in eps.items()}
            now = (snap["busy_ns"], snap["time"], counters)
            before, self._last[i] = self._last.get(i), now
            if before is None or now[1] <= before[1]:
                continue
            busy_ns, seconds = now[0] - before[0], now[1] - before[1]
            self.busy[i] = min(1.0, busy_ns / 1e9 / seconds)
            # input waiting for instances whose outputs are free: they lack CPU, not room downstream
            self.queued[i] = sum(c["queue"]["input_bytes"] for eps in snap["deployments"].values()
                                 for c in eps.values() if not c["queue"]["backlog_bytes"])
            self.load[i] = 1.0 if self.queued[i] >= self._queued_bytes else self.busy[i]
            self._hot[i] = self._hot.get(i, 0) + 1 if self.load[i] > HIGH else 0
            self.parts[i] = {k: (min(1.0, (b - before[2][k][0]) / busy_ns) if busy_ns > 0 else 0.0,
                                 (n - before[2][k][1]) / seconds)
                             for k, (b, n) in counters.items() if k in before[2]}
            for key in [key for key in self._capacity if key[0] == i and key[1:] not in counters]:
                del self._capacity[key]  # of a generation gone
            for k, (part, rate) in self.parts[i].items():
                if part > 0 and rate > 0:  # rows/s it could take: the time its manager leaves it / its time per row
                    capacity = (1.0 - self.busy[i] * (1.0 - part)) / (self.busy[i] * part / rate)
                    self._capacity.setdefault((i, *k), deque(maxlen=SUSTAIN + 2)).append(capacity)

    def _act(self) -> None:
        while self._joined:  # a newcomer: one more instance of each balanced operator, there
            im = self._joined.pop(0)
            self._shares += [(im, q, op) for q, (dep, _) in self.watched.items() for op in sorted(dep.tables)]
        while self._shares:
            im, q, op = self._shares.pop(0)
            if q not in self.watched or self.cluster.ims[im].dead is not None:
                continue
            dep, migrator = self.watched[q]
            n = dep.parallelism[dep.plan.sq_of[op].name]
            self._decide(q, op, "rescale", f"instance manager {self.cluster.ims[im].name} joined: {op} goes from "
                         f"{n} to {n + 1} instances, the new one there with a share of its bins",
                         lambda: migrator.rescale(op, n + 1, strategy=JOIN_STRATEGY))
            return
        for q, (dep, migrator) in list(self.watched.items()):
            if self._unload(q, dep, migrator) or self._colocate(q, dep, migrator):
                return

    def _unload(self, q: str, dep, migrator) -> bool:
        """Bins off a saturated instance manager, to the least loaded one running the same operator."""
        for op in sorted(dep.tables):
            sq = dep.plan.sq_of[op].name
            where = {i: at for (name, i), at in dep.assignment.items() if name == sq}
            hot = [i for i, at in where.items() if self._hot.get(at, 0) >= SUSTAIN]
            if not hot:
                continue
            load = self.load
            src = max(hot, key=lambda i: load.get(where[i], 0.0))
            now = time.monotonic()
            takers = [i for i, at in where.items() if now - self._unloaded.get(at, -HOLD_S) >= HOLD_S] or [src]
            dst = min(takers, key=lambda i: load.get(where[i], 1.0))
            gap = load.get(where[src], 0.0) - load.get(where[dst], 1.0)
            owners = dep.bin_owners(op)
            held = [b for b, o in enumerate(owners) if o == src]
            if dst == src or gap < GAP or len(held) < 2:
                continue
            n, how = self._how_many(dep, sq, op, src, dst, len(held), owners.count(dst), gap)
            moving = held[:n]
            ims = self.cluster.ims
            queued = self.queued.get(where[src], 0)
            reason = (f"instance manager {ims[where[src]].name} is saturated (busy {self.busy[where[src]]:.0%}"
                      f"{f', {queued / 2**20:.1f} MiB of input waiting' if queued >= self._queued_bytes else ''} for "
                      f"{self._hot[where[src]] * self.interval:g} s) while {ims[where[dst]].name} is busy "
                      f"{self.busy[where[dst]]:.0%}; {how}: {len(moving)} of the {len(held)} bins of {op}[{src}] "
                      f"go to {op}[{dst}]")
            self._unloaded[where[src]] = now
            self._decide(q, op, "migrate", reason,
                         lambda: migrator.migrate(op, dict.fromkeys(moving, dst), "all-at-once"))
            return True
        return False

    def _how_many(self, dep, sq: str, op: str, src: int, dst: int, held: int, dst_held: int,
                  gap: float) -> tuple[int, str]:
        """How many of ``src``'s ``held`` bins move to ``dst`` (holding ``dst_held``), and why."""
        # the saturated one's capacity now; the other's best of the last samples (another process's burst
        # on its core lowers it for a while: it could take that much again)
        last = {i: self._capacity.get((dep.assignment[(sq, i)], dep.gen.wire, (sq, i))) for i in (src, dst)}
        capacity = {i: (max(c) if i == dst else c[-1]) for i, c in last.items() if c}
        if len(capacity) == 2:  # the bins of the two in proportion to what each can take
            keep = int((held + dst_held) * capacity[src] / (capacity[src] + capacity[dst]))
            rates = f"{op}[{src}] could take {capacity[src]:,.0f} rows/s, {op}[{dst}] {capacity[dst]:,.0f}"
            if keep < held:
                how = f"{rates}, so {op}[{src}] keeps {keep} of their {held + dst_held} bins"
            else:  # rows are not spread evenly over the bins: the saturated one's carry more (skewed keys)
                how = (f"{rates}, so {op}[{src}] would keep {keep} of their {held + dst_held} bins, as many as it "
                       f"holds or more: its bins carry more rows than the other's (skewed keys), and one moves")
        else:  # no rates yet (a new generation): the share that evens the two out
            share = gap / (2 * self.load[dep.assignment[(sq, src)]])
            keep = held - int(held * share)
            how = f"a gap of {gap:.0%}"
        return max(1, min(held - keep, int(held * MAX_SHARE))), how

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
        """Record the decision and carry it out on a thread of its own; sampling goes on meanwhile."""
        log.warning("balancer: query %s: %s", q, reason)
        entry = {"time": time.time(), "query": q, "operator": op, "action": action, "reason": reason,
                 "state": "running"}
        self.decisions.append(entry)

        def carry_out():
            try:
                entry["report"] = run()
                entry["state"] = "done"
            except SparkcepError as e:  # the deployment failed or another migration runs: look again later
                entry["state"], entry["error"] = "failed", f"{e} [{e.code}]"
                log.warning("balancer: query %s: %s failed: %s [%s]", q, action, e, e.code)
            except Exception as e:  # a bug here must not stop the engine: say it, keep going
                entry["state"], entry["error"] = "failed", f"{type(e).__name__}: {e}"
                log.exception("balancer: query %s: %s failed", q, action)
            finally:
                self._quiet_until = time.monotonic() + COOLDOWN_S
                self._hot.clear()
        self._deciding = threading.Thread(target=carry_out, name="sparkcep-balancer-decision", daemon=True)
        self._deciding.start()

    def snapshot(self) -> dict:
        """For metrics and ``sparkcep status``: busy share per instance manager, the decisions made."""
        names = {im.index: im.name for im in self.cluster.ims}
        return {"busy": {names.get(i, str(i)): round(b, 3) for i, b in self.busy.items()},
                "queued_bytes": {names.get(i, str(i)): int(q) for i, q in self.queued.items()},
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
