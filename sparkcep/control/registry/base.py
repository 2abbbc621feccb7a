"""The registry's contract: a tree of small JSON documents with watches, transactions and sessions.

The registry holds the control plane's shared state (DESIGN.md §6):
deployments, bin tables, the live instance managers (ephemeral nodes), the
orchestrator lease. Two backends keep the same semantics:
:class:`~sparkcep.control.registry.zk.ZkRegistry` (a ZooKeeper server through
kazoo: clusters, fail-over) and
:class:`~sparkcep.control.registry.embedded.EmbeddedRegistry` (in-process:
``Engine.local()`` on one machine).

**Paths** are absolute within the registry's root (``/members/im-1``; ``/`` is
the root itself). **Documents** are JSON objects (dicts) of at most
:data:`MAX_DOCUMENT` bytes encoded; a node made as a missing parent reads as
``{}``. A registry object is one **session**: the ephemeral nodes it creates
last until the session ends (:meth:`Registry.close`, its process dying, or
expiry).

**Session states** (:class:`State`, as kazoo's), and what a caller may assume:

* ``CONNECTED``: operations go through; this session's ephemeral nodes and
  leases are held.
* ``SUSPENDED``: the connection dropped; the session may still be alive on the
  server (its ephemeral nodes stay until the session timeout), or not.
  Operations wait for a reconnection, up to the registry's timeout. Start
  nothing that needs a lease: :attr:`Lease.is_leader` is False meanwhile.
* ``LOST``: the session ended; its ephemeral nodes and leases are gone and
  other sessions may hold them already. Each lease of the session calls its
  ``on_lost``. The registry reconnects with a new session (``CONNECTED``):
  re-create ephemeral nodes and contend again; watches carry over.

**Callbacks** (watches, state listeners, lease callbacks) run one at a time on
the registry's event thread, never under a lock of the registry: they may
call the registry, but should return quickly (a blocking call holds every
other callback back) and must not close it. After :meth:`Registry.close`
returns, none runs.
"""

from __future__ import annotations

import abc
import logging
import threading
from dataclasses import dataclass
from typing import Callable

from sparkcep.control.registry.lease import Lease, holder
from sparkcep.control.registry.nodes import State, check_path, encode

log = logging.getLogger("sparkcep.control.registry")

@dataclass(frozen=True)
class Op:
    """One operation of a transaction, its document already encoded."""

    kind: str  # "create", "set" (create or replace), "delete" or "check" (the node is at ``version``)
    path: str
    data: bytes = b""
    ephemeral: bool = False
    sequence: bool = False
    version: int = -1


_UNSET = object()


class Watch:
    """A watch on one node: ``callback(value)`` at registration, then whenever the value changes.

    The value is the node's document (None while it is missing) or its sorted
    children ([] while it is missing); a watch survives the node's deletion,
    its re-creation and session losses. Successive changes may be reported as
    one call with the latest value; a value equal to the last reported one is
    not reported again. The first call runs in the registering thread before
    ``watch()`` returns, the next ones on the event thread.
    """

    def __init__(self, path: str, read: Callable[[], object], callback: Callable[[object], object]):
        self.path = path
        self._read, self._callback = read, callback
        self._lock = threading.Lock()
        self._last = _UNSET
        self.cancelled = False

    def refresh(self) -> None:
        """Read the node and report its value if it changed; called by the backend after each event."""
        with self._lock:
            if self.cancelled:
                return
            value = self._read()
            if value == self._last:
                return
            self._last = value
            try:
                self._callback(value)
            except Exception:
                log.exception("watch callback on %s failed", self.path)

    def cancel(self) -> None:
        """Stop the watch: the callback is not called after this returns (unless it is running now)."""
        self.cancelled = True


class Presence:
    """An ephemeral node kept by a process: made now, and made again in each new session once the node of
    the former one is gone (after an expiry, or a ZooKeeper restarted empty). A thread of its own looks
    every :data:`KEEP_EVERY_S` while connected. NODE_EXISTS at once if another process holds the node."""

    def __init__(self, registry: "Registry", path: str, doc: dict):
        self.registry, self.path, self.doc = registry, check_path(path), dict(doc)
        self._stop = threading.Event()
        registry.create(path, self.doc, ephemeral=True)
        self._thread = threading.Thread(target=self._keep, name=f"sparkcep-keep-{path}", daemon=True)
        self._thread.start()

    def update(self, doc: dict) -> None:
        """Hold ``doc`` from now on."""
        self.doc = dict(doc)
        if self.registry.owned(self.path):
            self.registry.set(self.path, self.doc)

    def _keep(self) -> None:
        while not self._stop.wait(KEEP_EVERY_S):
            if self.registry.state is not State.CONNECTED:
                continue
            try:
                if self.registry.owned(self.path) is None:
                    self.registry.create(self.path, self.doc, ephemeral=True)
                    log.info("registry: %s made again in a new session", self.path)
            except Exception as e:  # the connection dropped again, or a former session's node is still there
                log.debug("registry: keeping %s: %s", self.path, e)

    def cancel(self, delete: bool = True) -> None:
        """Stop keeping the node; ``delete`` it now (if this session holds it and the registry answers),
        else it goes when the session is closed."""
        self._stop.set()
        try:
            if delete and self.registry.state is State.CONNECTED and self.registry.owned(self.path):
                self.registry.delete(self.path)
        except Exception as e:
            log.debug("registry: dropping %s: %s", self.path, e)


KEEP_EVERY_S = 0.25


class Transaction:
    """Operations applied together or not at all, at :meth:`commit` (or at the end of a ``with`` block).

    Missing parents are created as part of the transaction; a failing
    operation raises its error (``NODE_EXISTS``, ``NO_NODE``, ...) naming its
    path, and leaves the registry as it was.

    >>> with registry.transaction() as t:            # doctest: +SKIP
    ...     t.create("/deployments/d1", spec)
    ...     t.create("/deployments/d1/placement/sq0-0", {"member": "im-1"})
    """

    def __init__(self, registry: "Registry"):
        self._registry = registry
        self._ops: list[Op] = []
        self.paths: list[str] | None = None  # after commit: each operation's path (sequential names filled in)

    def create(self, path: str, doc: dict, ephemeral: bool = False, sequence: bool = False) -> "Transaction":
        """Add the creation of ``path`` (as :meth:`Registry.create`)."""
        self._ops.append(Op("create", check_path(path), encode(doc, path), ephemeral, sequence))
        return self

    def set(self, path: str, doc: dict) -> "Transaction":
        """Add the creation or replacement of ``path`` (as :meth:`Registry.set`)."""
        self._ops.append(Op("set", check_path(path), encode(doc, path)))
        return self

    def delete(self, path: str) -> "Transaction":
        """Add the deletion of ``path``, which must exist and have no children."""
        self._ops.append(Op("delete", check_path(path)))
        return self

    def check(self, path: str, version: int) -> "Transaction":
        """Apply the transaction only if ``path`` exists at ``version`` (as :meth:`Registry.versioned` read
        it): BAD_VERSION otherwise. How a holder fences its writes: they fail once someone else changed
        the node, or once its lease node (version 0, an ephemeral) went with its session."""
        self._ops.append(Op("check", check_path(path), version=version))
        return self

    def commit(self) -> list[str]:
        """Apply every operation or none; the path of each (with sequence numbers filled in)."""
        self.paths = self._registry._commit(list(self._ops)) if self._ops else []
        return self.paths

    def __enter__(self) -> "Transaction":
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            self.commit()


class Registry(abc.ABC):
    """A session on a tree of small JSON documents, shared by the control plane's processes.

    Implementations: ZkRegistry (kazoo), EmbeddedRegistry (in-process). Every
    method may raise :class:`RegistryError`; none blocks longer than the
    registry's timeout except :meth:`Lease.acquire`. Thread-safe.
    """

    address: str  # how open_registry() reaches it: "zk://HOST:PORT/PATH" or "embedded"

    def __init__(self) -> None:
        self._state = State.CONNECTED
        self._listeners: list[Callable[[State], object]] = []

    # -- documents ---------------------------------------------------------
    def create(self, path: str, doc: dict, ephemeral: bool = False, sequence: bool = False) -> str:
        """Create ``path`` holding ``doc`` (missing parents made as ``{}``); its path, with ``sequence`` the
        10-digit number appended (increasing within the parent). NODE_EXISTS if it exists; an ephemeral
        node goes with this session and cannot have children (EPHEMERAL_PARENT)."""
        return self._commit([Op("create", check_path(path), encode(doc, path), ephemeral, sequence)])[0]

    def set(self, path: str, doc: dict) -> None:
        """Create ``path`` holding ``doc``, or replace its document (missing parents made as ``{}``)."""
        self._commit([Op("set", check_path(path), encode(doc, path))])

    @abc.abstractmethod
    def get(self, path: str) -> dict | None:
        """The document at ``path``, or None if there is no such node."""

    @abc.abstractmethod
    def versioned(self, path: str) -> tuple[dict | None, int | None]:
        """The document at ``path`` and its version (it counts the document's changes from 0); ``(None,
        None)`` if there is no such node."""

    @abc.abstractmethod
    def owned(self, path: str) -> bool | None:
        """Whether the ephemeral node ``path`` belongs to this session (None: there is no such node; False:
        a persistent node, or another session's, such as this process's own former session that the server
        has not expired yet)."""

    def keep(self, path: str, doc: dict) -> "Presence":
        """Keep the ephemeral node ``path`` holding ``doc`` for as long as this session lives, and in every
        later session (:class:`Presence`)."""
        return Presence(self, path, doc)

    @abc.abstractmethod
    def delete(self, path: str, recursive: bool = False) -> None:
        """Delete ``path`` (with its descendants if ``recursive``); NO_NODE if missing, NOT_EMPTY if it has
        children and not ``recursive``."""

    @abc.abstractmethod
    def children(self, path: str) -> list[str]:
        """The names of ``path``'s children, sorted ([] if ``path`` is missing)."""

    @abc.abstractmethod
    def watch(self, path: str, callback: Callable[[dict | None], object]) -> Watch:
        """Call ``callback(doc)`` now and whenever the document at ``path`` changes (None: missing)."""

    @abc.abstractmethod
    def watch_children(self, path: str, callback: Callable[[list[str]], object]) -> Watch:
        """Call ``callback(children)`` now and whenever ``path``'s children change (sorted names)."""

    def transaction(self) -> Transaction:
        """A new :class:`Transaction`: operations applied all together or not at all."""
        return Transaction(self)

    @abc.abstractmethod
    def _commit(self, ops: list[Op]) -> list[str]:
        """Apply ``ops`` atomically (missing parents created too); the path of each; the first failing
        operation's RegistryError otherwise, nothing applied."""

    # -- leases ------------------------------------------------------------
    def lease(self, name: str, identity: str, on_lost: Callable[[], object] | None = None):
        """A :class:`~sparkcep.control.registry.lease.Lease` named ``name`` that this session contends for as
        ``identity``; ``on_lost()`` when its session ends while holding or waiting for it."""
        return Lease(self, name, identity, on_lost)

    def leader(self, name: str) -> str | None:
        """The identity holding the lease ``name``, or None if nobody does."""
        return holder(self, name)

    # -- session -----------------------------------------------------------
    @property
    def state(self) -> State:
        """The session's current :class:`State`."""
        return self._state

    def add_listener(self, callback: Callable[[State], object]) -> None:
        """Call ``callback(state)`` on the event thread at each change of :attr:`state`."""
        self._listeners.append(callback)

    def remove_listener(self, callback: Callable[[State], object]) -> None:
        """Stop calling ``callback`` (no error if it was not registered)."""
        try:
            self._listeners.remove(callback)
        except ValueError:
            pass

    def _set_state(self, state: State) -> None:
        """Record a state change now and tell the listeners on the event thread; called by the backend."""
        self._state = state
        for callback in list(self._listeners):
            self.call_soon(lambda callback=callback: callback(state))

    @abc.abstractmethod
    def call_soon(self, fn: Callable[[], object]) -> None:
        """Run ``fn()`` on the event thread, after the callbacks already queued."""

    @abc.abstractmethod
    def close(self) -> None:
        """End the session: its ephemeral nodes and leases go at once; no callback runs after this returns.
        Idempotent; later operations raise REGISTRY_CLOSED."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.address!r}, {self.state.value})"
