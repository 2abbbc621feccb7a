"""The duplicate-filtering sink of an actively replicated deployment (UPM-CEP §6).

Every replica gets every input and computes the same rows with the same
output ids (DESIGN §4), epoch by epoch: each replica's sink hands over an
epoch's rows only once all its instances closed that epoch, so an epoch
arrives whole or not at all. The first replica to deliver an epoch has its
rows published — the first copy of each of their output ids — and the other
replica's copy of that epoch, arriving later, is dropped. Nothing is held
for matching: the only state is the last epoch published, which holds
because epochs arrive in order: each replica's in its own order, and a
rebuilt replica's only once the survivor's earlier ones are out
(:mod:`.catchup`). When a replica stops, the survivor's epochs simply keep
coming first: no gap, no duplicate.
"""

from __future__ import annotations

import threading

from sparkcep.runtime.output_log import SubscriberError, extend_logs


class DedupSink:
    """Publishes each epoch's rows once, from whichever replica delivers the epoch first."""

    def __init__(self, logs: dict):
        self.logs = logs
        self.published = 0  # the last epoch whose rows reached the logs
        self.first: dict[int, int] = {}  # replica -> epochs it delivered first
        self.dropped_rows = 0  # rows of second copies, dropped
        self._lock = threading.Lock()

    def deliverer(self, replica: int):
        """The ``deliver`` callback of replica ``replica``'s sink."""
        def deliver(epoch: int, per_log: dict[str, list]) -> SubscriberError | None:
            with self._lock:
                if epoch <= self.published:
                    self.dropped_rows += sum(b.num_rows for batches in per_log.values() for _, b in batches)
                    return None
                failed = extend_logs(self.logs, per_log, epoch)  # a log refusing them (NotHeld): offered again later
                self.published = epoch
                self.first[replica] = self.first.get(replica, 0) + 1
                return failed
        return deliver

    def snapshot(self, lags: dict[int, int]) -> dict:
        """For metrics: ``lags`` is how many epochs each replica's sink has closed."""
        with self._lock:
            return {"published_epoch": self.published, "held_rows": 0, "dropped_rows": self.dropped_rows,
                    "first_copies": dict(self.first),
                    "lag_epochs": {r: max(0, self.published - done) for r, done in lags.items()}}
