"""A steady keyed input on a fixed schedule, for the benchmarks that act on a running query (migration,
replication) and measure the latency of the sends meanwhile."""

from __future__ import annotations

import threading
import time
from typing import Callable

import numpy as np

from sparkcep.errors import SparkcepError


class KeySender:
    """A thread sending ``rows`` random keys below ``keys`` (column ``k``) to ``stream`` ``rate`` times a
    second on a fixed schedule (a late send does not shift the next ones), until :meth:`stop`. Send ``i``
    has event time ``ts_us(i)`` (column ``ts``, microseconds)."""

    def __init__(self, engine, keys: int, rows: int, rate: float, ts_us: Callable[[int], int], stream: str = "ev"):
        self.engine, self.keys, self.rows, self.rate, self.ts_us, self.stream = engine, keys, rows, rate, ts_us, stream
        self.sent, self.error = 0, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sender", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        rng = np.random.default_rng(2)
        start = time.perf_counter()
        try:
            while not self._stop.is_set():
                ts = np.full(self.rows, self.ts_us(self.sent), "datetime64[us]")
                self.engine.send(self.stream, {"k": rng.integers(0, self.keys, self.rows), "ts": ts})
                self.sent += 1
                wait = start + self.sent / self.rate - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
        except SparkcepError as e:
            self.error = e

    def stop(self) -> SparkcepError | None:
        """Stop sending; returns the error that stopped it earlier, if any."""
        self._stop.set()
        self._thread.join()
        return self.error
