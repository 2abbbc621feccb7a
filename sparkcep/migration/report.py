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
    """Measures one migration of deployment ``dep`` from construction to :meth:`report`."""

    def __init__(self, dep, kind: str, operator: str, strategy: str):
        self.dep, self.kind, self.operator, self.strategy = dep, kind, operator, strategy
        self.bins = self.bytes = self.steps = 0
        self.total: int | None = None  # bins it plans to move, once known
        self.restart()

    def restart(self) -> None:
        """Start the clock now (the migration waited for another one to finish)."""
        self.t0 = time.monotonic_ns()
        self.first_epoch = self.dep.epoch

    def report(self) -> dict:
        """The report of the migration, which ended now (waits for the epochs it covers to be out)."""
        t1 = time.monotonic_ns()
        last_epoch = self.dep.epoch - 1
        deadline = time.monotonic() + SETTLE_S
        while self.dep.sink.done_epoch < last_epoch and time.monotonic() < deadline and self.dep.error is None \
                and not self.dep.closed:
            time.sleep(0.002)
        lat = np.array([ns for _, epoch, ns in list(self.dep.sink.epoch_log)
                        if self.first_epoch <= epoch <= last_epoch], np.float64) / 1e6
        return {"query": self.dep.query.name, "operator": self.operator, "kind": self.kind,
                "strategy": self.strategy, "bins": self.bins, "bytes": self.bytes, "steps": self.steps,
                "duration_s": round((t1 - self.t0) / 1e9, 6),
                "max_latency_ms": round(float(lat.max()), 3) if lat.size else 0.0,
                "p99_latency_ms": round(float(np.percentile(lat, 99)), 3) if lat.size else 0.0,
                "latency_epochs": int(lat.size), "finished": time.time()}
