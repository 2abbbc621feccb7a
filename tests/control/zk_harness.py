"""Helpers for tests against a real ZooKeeper server: sessions, expiry, processes holding a registry.

The server itself is the session fixture ``zookeeper`` (``conftest.py``),
started by ``sparkcep zookeeper``'s own code.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time

from kazoo.client import KazooClient

from sparkcep.control.registry import EmbeddedRegistry, Registry, State, ZkRegistry

SESSION_TIMEOUT = 2.0  # seconds; the test server (tick 200 ms) allows 0.4-4 s
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def expire_session(registry: Registry, timeout: float = 10.0) -> None:
    """End ``registry``'s session as the server does on expiry; return once it has heard LOST and
    reconnected with a new session.

    On ZooKeeper, as kazoo's own test harness did: a second client joins the
    session with its id and password, then closes it, so the server ends the
    session (its ephemeral nodes go) and the first client is told it expired.
    """
    if isinstance(registry, EmbeddedRegistry):
        registry.expire_session()
        return
    assert isinstance(registry, ZkRegistry)
    lost, back = threading.Event(), threading.Event()

    def listen(state: State) -> None:
        if state is State.LOST:
            lost.set()
        elif state is State.CONNECTED and lost.is_set():
            back.set()
    registry.add_listener(listen)
    try:
        session_id, password = registry._client.client_id  # as kazoo's harness, reaching into the client
        other = KazooClient(hosts=registry.hosts, client_id=(session_id, password), timeout=SESSION_TIMEOUT)
        other.start(timeout=timeout)
        other.stop()
        other.close()
        assert lost.wait(timeout), f"{registry} was not told its session expired within {timeout} s"
        assert back.wait(timeout), f"{registry} did not reconnect within {timeout} s of its session expiring"
    finally:
        registry.remove_listener(listen)


HOLDER = """
import os, sys, time
from sparkcep.control.registry import ZkRegistry
hosts, root, what = sys.argv[1:4]
registry = ZkRegistry(hosts, root, session_timeout=float(sys.argv[4]))
if what == "member":
    registry.create("/members/child", {"pid": os.getpid()}, ephemeral=True)
else:
    registry.lease("orchestrator", "child").acquire(timeout=30)
print("ready", flush=True)
time.sleep(600)
"""


class Holder:
    """A child Python process holding a ZkRegistry session with an ephemeral member node or the
    ``orchestrator`` lease, until it is killed."""

    def __init__(self, hosts: str, root: str, what: str, timeout: float = 30.0):
        self.process = subprocess.Popen([sys.executable, "-c", HOLDER, hosts, root, what, str(SESSION_TIMEOUT)],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        line = self.process.stdout.readline() if ready else ""
        if line.strip() != "ready":
            self.kill()
            raise AssertionError(f"holder process not ready within {timeout} s: {self.process.stderr.read()[-2000:]}")

    def kill(self) -> float:
        """SIGKILL the process (if still running); the monotonic time it was killed."""
        killed = time.monotonic()
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        self.process.stdout.close()
        self.process.stderr.close()
        return killed

    def __enter__(self) -> "Holder":
        return self

    def __exit__(self, *exc) -> None:
        self.kill()


class Recorder:
    """A callback that records the values it is called with, and waits for one."""

    def __init__(self):
        self.values: list = []
        self._changed = threading.Condition()

    def __call__(self, value=None) -> None:
        with self._changed:
            self.values.append(value)
            self._changed.notify_all()

    def wait_for(self, predicate, timeout: float = 10.0, since: int = 0):
        """The first value recorded (from the ``since``-th on) satisfying ``predicate`` (a value, or a
        function of one), waiting up to ``timeout`` seconds; AssertionError naming what was seen otherwise."""
        test = predicate if callable(predicate) else (lambda v: v == predicate)
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = next((v for v in self.values[since:] if test(v)), _NONE)
                if found is not _NONE:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no value matching {predicate!r} within {timeout} s; seen {self.values}")
                self._changed.wait(left)

    @property
    def last(self):
        with self._changed:
            return self.values[-1] if self.values else None


_NONE = object()
