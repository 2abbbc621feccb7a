"""What a migration reports: bins, bytes, steps, duration, and the latency of the input meanwhile.

Latency is measured per epoch (one ``send``), as the sink sees it: from the
epoch's arrival at the engine to the moment its results were all in the
output logs (:attr:`sparkcep.runtime.sink.Sink.epoch_log`). A migration's
latency summarises the epochs that arrived while it ran, each waited for
until it is out (a stall caused by the migration shows in the epochs that
queued behind it).
"""

from __future__ import annotations

import time

import numpy as np

SETTLE_S = 10.0  # after a migration, wait at most this long for the epochs that arrived meanwhile


class Watch:
    """Measures one migration of the deployment whose running replicas ``replicas()`` gives, from
    construction to :meth:`report`."""

    def __init__(self, replicas, kind: str, operator: str, strategy: str):
        self.replicas, self.kind, self.operator, self.strategy = replicas, kind, operator, strategy
        self.query = replicas()[0].query.name
        self.bins = self.bytes = self.steps = 0
        self.total: int | None = None  # bins it plans to move, once known
        self.restart()

    def restart(self) -> None:
        """Start the clock now (the migration waited for another one to finish)."""
        self.t0 = time.monotonic_ns()
        self.first_epoch = self._epoch()

    def report(self, error=None) -> dict:
        """The report of the migration, which ended now (waits for the epochs it covers to be out); one
        that failed with ``error`` says so under ``"error"``, with what it did before (waits for nothing).

        An epoch's latency is the output's: with replicas, that of the one that delivered it first
        (a replica paused meanwhile makes no latency the readers saw)."""
        t1 = time.monotonic_ns()
        last_epoch = self._epoch() - 1
        deadline = time.monotonic() + (0 if error is not None else SETTLE_S)
        while time.monotonic() < deadline and (reps := [d for d in self.replicas() if d.error is None and not d.closed]) \
                and max(d.sink.done_epoch for d in reps) < last_epoch:
            time.sleep(0.002)
        first: dict[int, int] = {}
        for d in self.replicas():
            for _, epoch, ns in list(d.sink.epoch_log):
                if self.first_epoch <= epoch <= last_epoch:
                    first[epoch] = min(ns, first.get(epoch, ns))
        lat = np.array(list(first.values()), np.float64) / 1e6
        return {"query": self.query, "operator": self.operator, "kind": self.kind,
                "strategy": self.strategy, "bins": self.bins, "bytes": self.bytes, "steps": self.steps,
                "duration_s": round((t1 - self.t0) / 1e9, 6),
                "max_latency_ms": round(float(lat.max()), 3) if lat.size else 0.0,
                "p99_latency_ms": round(float(np.percentile(lat, 99)), 3) if lat.size else 0.0,
                "latency_epochs": int(lat.size), "finished": time.time(),
                **({} if error is None else {"error": f"{error} [{getattr(error, 'code', type(error).__name__)}]"})}

    def _epoch(self) -> int:
        """The next epoch (send) the deployment takes."""
        return max(d.epoch for d in self.replicas())
