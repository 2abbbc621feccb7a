"""Leases: one holder at a time among the sessions of a registry (leader election).

Each contender creates an ephemeral sequential node
``/leases/<name>/<uuid>-<number>`` holding ``{"identity": ...}``; the node
with the lowest number holds the lease. When the holder releases it or its
session ends (``close()``; its process dying, once the session timeout
passes; expiry), its node goes and the next contender, watching the
children, takes over. Built on the :class:`Registry` interface only, so both
backends share it. The uuid prefix lets a contender recognise its own nodes
even when a retried create left two.

>>> lease = registry.lease("orchestrator", "host-a:7077", on_lost=stop_acting)   # doctest: +SKIP
>>> lease.acquire(timeout=30)                                                     # doctest: +SKIP
>>> lease.is_leader                                                              # doctest: +SKIP
True
"""

from __future__ import annotations

import threading
import uuid
from typing import Callable

from sparkcep.control.registry.nodes import LEASES, RegistryError, State, check_path, sequence_number


def holder(registry, name: str) -> str | None:
    """The identity in the lowest node of lease ``name``, or None if nobody holds it."""
    folder = check_path(f"{LEASES}/{name}")
    for _ in range(10):  # the first node may go between the listing and the read
        nodes = registry.children(folder)
        if not nodes:
            return None
        doc = registry.get(f"{folder}/{min(nodes, key=sequence_number)}")
        if doc is not None:
            return doc.get("identity")
    return None


class Lease:
    """This session's place in the contest for lease ``name``; made by :meth:`Registry.lease`.

    ``on_lost()`` is called (on the event thread) when the session ends while
    the lease is held or awaited: the place is gone, act as leader no more;
    :meth:`acquire` or :meth:`contend` again to rejoin.
    """

    def __init__(self, registry, name: str, identity: str, on_lost: Callable[[], object] | None = None):
        self.registry, self.name, self.identity = registry, name, identity
        self.folder = check_path(f"{LEASES}/{name}")
        self._on_lost = on_lost
        self._on_gained: Callable[[], object] | None = None
        self._lock = threading.Lock()
        self._prefix: str | None = None  # while contending: the names of our nodes start with it
        self._held = False
        self._settled = threading.Event()  # set when held or lost
        self._watch = None

    @property
    def contending(self) -> bool:
        """Whether this session is in the contest (holding or awaiting the lease)."""
        return self._prefix is not None

    @property
    def node(self) -> str | None:
        """The path of this session's node in the contest (None when not contending): a holder conditions
        its writes on it (``transaction().check(lease.node, 0)``), so they fail once its lease is gone."""
        with self._lock:
            prefix = self._prefix
        if prefix is None:
            return None
        mine = [n for n in self.registry.children(self.folder) if n.startswith(prefix)]
        return f"{self.folder}/{min(mine, key=sequence_number)}" if mine else None

    @property
    def is_leader(self) -> bool:
        """Whether this session holds the lease and is connected (False while SUSPENDED: uncertain)."""
        return self._held and self.registry.state is State.CONNECTED

    def contend(self, on_gained: Callable[[], object] | None = None) -> None:
        """Join the contest and return at once; ``on_gained()`` runs on the event thread when the lease is
        gained. Does nothing if already contending."""
        with self._lock:
            if self._prefix is not None:
                return
            self._prefix, self._held, self._on_gained = uuid.uuid4().hex + "-", False, on_gained
            self._settled.clear()
            prefix = self._prefix
        self.registry.add_listener(self._on_state)
        try:
            self.registry.create(f"{self.folder}/{prefix}", {"identity": self.identity}, ephemeral=True,
                                 sequence=True)
            watch = self.registry.watch_children(self.folder, self._on_children)
        except BaseException:
            self.release()
            raise
        with self._lock:
            if self._prefix == prefix:
                self._watch = watch
                return
        watch.cancel()  # lost or released meanwhile

    def acquire(self, timeout: float | None = None) -> "Lease":
        """Block until the lease is held (not from a callback: it would wait for itself).
        LEASE_TIMEOUT after ``timeout`` seconds (leaving the contest), LEASE_LOST if the session ends first."""
        self.contend()
        if not self._settled.wait(timeout):
            self.release()
            raise RegistryError(f"lease {self.name}: not acquired within {timeout} s; held by "
                                f"{self.registry.leader(self.name)!r}", "LEASE_TIMEOUT", self.folder)
        if not self._held:
            raise RegistryError(f"lease {self.name}: the registry session ended while waiting for it",
                                "LEASE_LOST", self.folder)
        return self

    def release(self) -> None:
        """Leave the contest (giving the lease to the next contender if held). Idempotent."""
        with self._lock:
            prefix = self._stop()
        if prefix is None:
            return
        try:
            for node in self.registry.children(self.folder):
                if node.startswith(prefix):
                    self.registry.delete(f"{self.folder}/{node}")
        except RegistryError as e:
            if e.code not in ("NO_NODE", "REGISTRY_CLOSED"):  # gone already, or with the session
                raise

    def _stop(self) -> str | None:
        """Stop contending (under the lock); the prefix of our nodes, None if we were not contending."""
        prefix, self._prefix, self._held = self._prefix, None, False
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        self.registry.remove_listener(self._on_state)
        self._settled.set()
        return prefix

    def _on_children(self, nodes: list[str]) -> None:
        """The contenders changed: take the lease if our node is first; lost if our node is gone."""
        with self._lock:
            if self._prefix is None:
                return
            if not any(n.startswith(self._prefix) for n in nodes):
                callback = self._lost()
            elif min(nodes, key=sequence_number).startswith(self._prefix) and not self._held:
                self._held = True
                self._settled.set()
                callback = self._on_gained
            else:
                return
        if callback is not None:
            self.registry.call_soon(callback)

    def _on_state(self, state: State) -> None:
        if state is State.LOST:
            with self._lock:
                callback = self._lost() if self._prefix is not None else None
            if callback is not None:
                callback()

    def _lost(self) -> Callable[[], object] | None:
        """Our nodes went with the session (under the lock): stop, and the on_lost callback to call."""
        self._stop()
        return self._on_lost

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"Lease({self.name!r}, {self.identity!r}, leader={self.is_leader})"
