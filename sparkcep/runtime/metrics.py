"""Metrics (the paper's metric server, in-process): what instances count and how the engine sums it.

Instances count rows in and out, batches, busy time and latency — from the
arrival of an event at the engine (its epoch's arrival time, found through
its sequence number) to the moment a result leaves the instance. The
engine asks each instance manager for a :func:`snapshot` (plain dicts,
counters only), adds what it sees itself (sources, output logs, per-process
CPU and memory from psutil) and turns counters into rates over the recent
past (:class:`MetricServer`).
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np
from numba import njit

# latency histogram: bucket b holds values in [2**(b/SUB), 2**((b+1)/SUB)) microseconds
SUB = 4
BUCKETS = 40 * SUB
PERCENTILES = (50, 90, 99, 99.9)
RATE_WINDOW_S = 5.0


class Histogram:
    """Log-scale histogram of latencies in microseconds (about 19% bucket width)."""

    def __init__(self, counts=None):
        self.counts = np.zeros(BUCKETS, np.int64) if counts is None else np.asarray(counts, np.int64)

    def merge(self, other: "Histogram") -> None:
        self.counts += other.counts

    @property
    def n(self) -> int:
        return int(self.counts.sum())

    def percentiles(self) -> dict[str, float]:
        """``{"p50": ms, ...}`` (upper bucket edges; NaN-free: empty -> {})."""
        n = self.n
        if not n:
            return {}
        cum = np.cumsum(self.counts)
        out = {}
        for p in PERCENTILES:
            b = int(np.searchsorted(cum, np.ceil(n * p / 100.0)))
            out[f"p{p:g}"] = round(2 ** ((b + 1) / SUB) / 1000.0, 3)
        return out


class EpochClock:
    """Arrival time of each epoch at the engine, looked up by sequence number.

    Epoch ``k`` covers the sequence numbers up to its frontier ``F_k``; an
    event with sequence number ``s`` arrived with the first epoch whose
    frontier is >= ``s``. Keeps the last ``keep`` epochs (older events count
    from the oldest epoch kept, so their latency is under-stated).
    """

    def __init__(self, keep: int = 1 << 16):
        self.keep = keep
        self.last = 0
        self.epochs = np.zeros(1024, np.int64)
        self.frontier = np.zeros(1024, np.int64)
        self.arrival = np.zeros(1024, np.int64)
        self.n = 0

    def note(self, epoch: int, frontier: int, arrival: int) -> None:
        if epoch <= self.last:
            return
        self.last = epoch
        if self.n == len(self.frontier):
            if self.n >= self.keep:
                half = self.n // 2
                for a in (self.epochs, self.frontier, self.arrival):
                    a[:half] = a[half:self.n]
                self.n -= half
            else:
                self.epochs, self.frontier, self.arrival = (np.concatenate([a, np.zeros_like(a)]) for a in
                                                            (self.epochs, self.frontier, self.arrival))
        self.epochs[self.n] = epoch
        self.frontier[self.n] = frontier
        self.arrival[self.n] = arrival
        self.n += 1

    def arrival_of(self, epoch: int) -> int | None:
        """When ``epoch`` arrived at the engine (ns), if it is kept."""
        i = self.n - 1 - (self.last - epoch)  # where it is when no epoch since was skipped (aborted)
        if not 0 <= i < self.n or self.epochs[i] != epoch:
            i = int(np.searchsorted(self.epochs[:self.n], epoch))
        return int(self.arrival[i]) if i < self.n and self.epochs[i] == epoch else None


def record_latency(hist: Histogram, clock: EpochClock, seq: np.ndarray, now_ns: int, sample: int = 64) -> None:
    """Add to ``hist`` the latencies (from the arrival of their epoch, by ``clock``, to ``now_ns``) of
    rows with sequence numbers ``seq``, sampled when there are many.

    One kernel call over at most about ``sample`` rows: with numpy's log2, clip and bincount over
    512 it took 10-15 us a batch, on every batch an instance sends.
    """
    n = len(seq)
    if n and clock.n:
        _record(hist.counts, clock.frontier, clock.arrival, clock.n, seq, max(1, n // sample), now_ns)


@njit(nogil=True, cache=True)
def _record(counts, frontier, arrival, epochs, seq, step, now_ns):
    """Count in ``counts`` the latency in microseconds of every ``step``-th of ``seq``, each weighing
    ``step``: the time from its epoch's arrival (the first of the clock's ``epochs`` whose frontier
    reaches it) to ``now_ns``."""
    last = len(counts) - 1
    e = -1
    for i in range(0, len(seq), step):
        s = seq[i]
        if e < 0 or s > frontier[e] or (e > 0 and s <= frontier[e - 1]):  # rows of a batch share epochs
            e = min(np.searchsorted(frontier[:epochs], s), epochs - 1)
        us = max((now_ns - arrival[e]) // 1000, 1)
        counts[min(max(np.int64(np.log2(us) * SUB), 0), last)] += step


class Counters:
    """What one sub-query instance counts; ``rows_out`` and ``latency`` per exiting operator."""

    __slots__ = ("rows_in", "batches_in", "rows_out", "busy_ns", "latency", "epoch")

    def __init__(self):
        self.rows_in = self.batches_in = self.busy_ns = self.epoch = 0
        self.rows_out: dict[str, int] = {}
        self.latency: dict[str, Histogram] = {}

    def absorb(self, other: "Counters") -> None:
        """Add what ``other`` counted (an instance taking over from its predecessor keeps its totals)."""
        self.rows_in += other.rows_in
        self.batches_in += other.batches_in
        self.busy_ns += other.busy_ns
        self.epoch = max(self.epoch, other.epoch)
        for name, n in other.rows_out.items():
            self.rows_out[name] = self.rows_out.get(name, 0) + n
        for name, hist in other.latency.items():
            self.latency.setdefault(name, Histogram()).merge(hist)

    @classmethod
    def of(cls, snapshot: dict) -> "Counters":
        """The counters a :meth:`snapshot` holds."""
        c = cls()
        c.rows_in, c.batches_in, c.busy_ns = snapshot["rows_in"], snapshot["batches_in"], snapshot["busy_ns"]
        c.epoch, c.rows_out = snapshot["epoch"], dict(snapshot["rows_out"])
        c.latency = {name: Histogram(counts) for name, counts in snapshot["latency"].items()}
        return c

    def snapshot(self) -> dict:
        return {"rows_in": self.rows_in, "batches_in": self.batches_in, "rows_out": dict(self.rows_out),
                "busy_ns": self.busy_ns, "epoch": self.epoch,
                "latency": {k: h.counts.tolist() for k, h in self.latency.items()}}


class MetricServer:
    """Keeps recent snapshots of counters and turns them into rates.

    ``rate(key, value)``: per second over the last :data:`RATE_WINDOW_S`
    seconds of samples taken by :meth:`sample` (or since the first sample).
    """

    def __init__(self):
        self.history: deque = deque()  # (time, {key: value})
        self.t0 = time.monotonic()

    def sample(self, values: dict) -> dict:
        """Record ``values`` (flat {key: counter}) now; returns {key: rate per second}."""
        now = time.monotonic()
        while self.history and now - self.history[0][0] > RATE_WINDOW_S and len(self.history) > 1:
            self.history.popleft()
        if self.history:
            t, old = self.history[0]
        else:
            t, old = self.t0, {}
        self.history.append((now, dict(values)))
        dt = max(now - t, 1e-3)
        return {k: (v - old.get(k, 0)) / dt for k, v in values.items()}


def late_counts(plan, late: dict) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """Late tuples per stateful operator, and per input stream and operator.

    ``late``: per instance, (late tuples, late tuples per input port) or None.
    Every instance sees all of a broadcast input: its late tuples count once.
    A port fed by several streams (a union) counts under their names joined by ``+``.
    """
    from sparkcep.query.planner import BROADCAST
    per_op: dict[str, int] = {}
    per_stream: dict[str, dict[str, int]] = {}
    for sq in plan.subqueries:
        broadcast = {e.port for e in sq.inputs if e.balancer == BROADCAST}
        head = sq.head
        for (name, i), value in sorted(late.items()):
            if name != sq.name or value is None:
                continue
            n, by_port = value
            for port, k in enumerate(by_port):
                if i and port in broadcast:
                    n -= k
                    continue
                if k:
                    stream = "+".join(_streams_into(head.inputs[port]))
                    ops = per_stream.setdefault(stream, {})
                    ops[head.name] = ops.get(head.name, 0) + k
            per_op[head.name] = per_op.get(head.name, 0) + n
    return per_op, per_stream


def _streams_into(op) -> list[str]:
    """The input streams whose tuples reach ``op``'s output, sorted."""
    if not op.inputs:
        return [op.name]
    return sorted({s for i in op.inputs for s in _streams_into(i)})


def _pct(hists) -> dict[str, float]:
    total = Histogram()
    for h in hists:
        total.merge(h if isinstance(h, Histogram) else Histogram(h))
    return total.percentiles()


def deployment_metrics(dep, instances: dict, counters: dict, held: dict, retired: dict) -> dict:
    """The section of one query: totals, then per sub-query and per operator.

    ``instances``: per instance, the snapshot of its counters (:meth:`Counters.snapshot`
    plus ``queue`` and ``late``); ``counters`` collects flat counters for rates. What instances
    that no longer run counted (``retired``, per sub-query: of the deployment, or of the replica
    ``instances`` are of) stays in the row counts, busy time and latency.
    ``held``: the counts this deployment gave before (the caller keeps it per deployment), below
    which none goes: instances being replaced, rebuilt from a replica, or not answering count less
    for a while.
    """
    q = dep.query.name

    def hold(key, n):
        n = held[key] = max(n, held.get(key, 0))
        return n

    rows_in = sum(s.rows for s in dep.sources.values())
    rows_out = sum(dep.sink.rows.values())
    counters[(q, "in")], counters[(q, "out")] = rows_in, rows_out
    sqs, ops = {}, {}
    for sq in dep.plan.subqueries:
        mine = {ep: m for ep, m in instances.items() if ep[0] == sq.name}
        gone = retired.get(sq.name)
        counted = [*mine.values(), *([gone.snapshot()] if gone else [])]
        s_in = hold((q, sq.name, "in"), sum(m["rows_in"] for m in counted))
        outs: dict[str, int] = {}
        lat: dict[str, list] = {}
        for m in counted:
            for op, n in m["rows_out"].items():
                outs[op] = outs.get(op, 0) + n
            for op, h in m["latency"].items():
                lat.setdefault(op, []).append(h)
        for op in sq.operators:
            if op.name in outs or (q, op.name, "op_out") in held:
                outs[op.name] = hold((q, op.name, "op_out"), outs.get(op.name, 0))
        s_out = hold((q, sq.name, "out"), sum(outs.values()))
        counters[(q, sq.name, "in")], counters[(q, sq.name, "out")] = s_in, s_out
        queue = {"input_bytes": 0, "stashed_rows": 0, "backlog_bytes": 0}
        for m in mine.values():
            for k in queue:
                queue[k] += m["queue"][k]
        sqs[sq.name] = {"operators": [op.name for op in sq.operators],
                        "instances": dep.parallelism[sq.name], "rows_in": s_in, "rows_out": s_out,
                        "busy_s": hold((q, sq.name, "busy"), sum(m["busy_ns"] for m in counted)) / 1e9,
                        "epoch": min((m["epoch"] for m in mine.values()), default=0),
                        "latency_ms": _pct([h for hs in lat.values() for h in hs]), "queue": queue,
                        "placement": dep.placement_lines().get(sq.name, [])}
        for op in sq.operators:
            entry = {"subquery": sq.name}
            if op is sq.head:
                entry["rows_in"] = s_in
                entry["queue"] = queue
                counters[(q, op.name, "op_in")] = s_in
            if op.name in outs:
                entry["rows_out"] = outs[op.name]
                entry["latency_ms"] = _pct(lat.get(op.name, []))
                counters[(q, op.name, "op_out")] = outs[op.name]
            ops[op.name] = entry
    return {"rows_in": rows_in, "rows_out": rows_out, "epoch": dep.epoch - 1, "done_epoch": dep.sink.done_epoch,
            "latency_ms": _pct(dep.sink.latency.values()),
            "outputs": {o: {"rows": n, "latency_ms": dep.sink.latency[o].percentiles()}
                        for o, n in dep.sink.rows.items()},
            "subqueries": sqs, "operators": ops}


def add_rates(sections: dict, rates: dict) -> None:
    """Put ``input_rate`` / ``throughput`` (rows/s) beside the row counters of every section."""
    for q, d in sections.items():
        d["input_rate"], d["throughput"] = rates.get((q, "in"), 0.0), rates.get((q, "out"), 0.0)
        for name, s in d["subqueries"].items():
            s["input_rate"], s["throughput"] = rates.get((q, name, "in"), 0.0), rates.get((q, name, "out"), 0.0)
        for name, o in d["operators"].items():
            if "rows_in" in o:
                o["input_rate"] = rates.get((q, name, "op_in"), 0.0)
            if "rows_out" in o:
                o["throughput"] = rates.get((q, name, "op_out"), 0.0)


def answered(im: dict) -> bool:
    """Did the instance manager of ``im`` (an entry of ``metrics()["instance_managers"]``) answer the
    metrics request? Only then are its figures (CPU, memory, bytes, instances) known."""
    return "cpu_s" in im
