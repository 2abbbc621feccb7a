"""A sender for failure tests: it keeps sending in a thread, and a fault is injected while one of its sends
is under way, so a test can show that its fault landed in the middle of the input, not in a pause.

    sender = Sender(lambda item: engine.send(*item), items, pace_s=0.02).start()
    hit = sender.during_send(lambda: os.kill(pid, signal.SIGKILL))   # True: a send was under way
"""

from __future__ import annotations

import threading
import time


class Sender:
    """Calls ``send(item)`` for each of ``items`` (an iterable, endless if the test stops it), ``pace_s``
    apart, in a thread of its own, until the items run out, :meth:`stop` or a send raises (kept in
    ``errors``). ``begun`` and ``done`` count the sends that started and that returned."""

    def __init__(self, send, items, pace_s: float = 0.02):
        self.send, self.items, self.pace_s = send, items, pace_s
        self.begun = self.done = 0
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()  # held to count a send in or out, and by during_send's act
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="sender", daemon=True)

    def start(self) -> "Sender":
        self.thread.start()
        return self

    def _run(self) -> None:
        for item in self.items:
            if self._stop.is_set():
                return
            with self._lock:
                self.begun += 1
            try:
                self.send(item)
            except BaseException as e:  # noqa: BLE001 - the test asserts on it
                self.errors.append(e)
                return
            with self._lock:
                self.done += 1
            time.sleep(self.pace_s)

    def during_send(self, act, timeout: float = 10.0) -> bool:
        """Run ``act()`` while a send is under way (begun, not returned: it cannot return before ``act``
        does); whether one was. After ``timeout`` s with none, ``act()`` runs anyway and this is False."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                under_way = self.begun > self.done
                if under_way or time.monotonic() > deadline or not self.thread.is_alive():
                    act()
                    return under_way
            time.sleep(0.0005)

    def wait_done(self, n: int, timeout: float) -> None:
        """Return once ``n`` sends returned; AssertionError after ``timeout`` s or if the sender stopped."""
        deadline = time.monotonic() + timeout
        while self.done < n:
            assert not self.errors, self.errors
            assert self.thread.is_alive() and time.monotonic() < deadline, \
                f"{self.done} sends returned of the {n} waited for ({timeout:.0f} s)"
            time.sleep(0.005)

    def stop(self, timeout: float = 60.0) -> None:
        """Stop after the send under way; AssertionError if it does not return within ``timeout`` s."""
        self._stop.set()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"a send did not return within {timeout:.0f} s"
