"""The in-process registry backend: sessions on a node tree in this process's memory.

For ``Engine.local()`` on one machine, and for tests: several
:class:`EmbeddedRegistry` objects on one :class:`Store` stand for several
sessions, each with its own ephemeral nodes, watches and event thread. The
semantics are ZkRegistry's (see :mod:`~sparkcep.control.registry.base`);
nothing outlives the process, and the connection never drops (states are
CONNECTED, then LOST at close or :meth:`EmbeddedRegistry.expire_session`).
"""

from __future__ import annotations

import itertools
import queue
import threading
from typing import Callable

from sparkcep.arguments import checked
from sparkcep.control.registry.base import Op, Registry, Watch, log
from sparkcep.control.registry.nodes import RegistryError, State, ancestors, check_path, decode, node_error, parent


class _Node:
    """A node: its encoded document, the session owning it if ephemeral, its children's names."""

    __slots__ = ("data", "owner", "children", "next_sequence", "version")

    def __init__(self, data: bytes = b"", owner: int | None = None):
        self.data, self.owner = data, owner
        self.children: set[str] = set()
        self.next_sequence = self.version = 0

    def copy(self) -> "_Node":
        node = _Node(self.data, self.owner)
        node.children, node.next_sequence, node.version = set(self.children), self.next_sequence, self.version
        return node


class _Edit:
    """Changes to a node tree that can be undone: each node's former state saved before its first change."""

    def __init__(self, nodes: dict[str, _Node], root: str):
        self.nodes, self.root = nodes, root
        self.saved: dict[str, _Node | None] = {}

    def apply(self, op: Op, owner: int) -> str:
        """Perform ``op`` for session ``owner``; the path it made (relative to the root)."""
        full = self.root if op.path == "/" else self.root + op.path
        if op.kind == "delete":
            if full not in self.nodes:
                raise node_error("NO_NODE", op.kind, op.path)
            if self.nodes[full].children:
                raise node_error("NOT_EMPTY", op.kind, op.path)
            self._remove(full)
            return op.path
        if op.kind == "check":
            if full not in self.nodes or self.nodes[full].version != op.version:
                raise node_error("BAD_VERSION", op.kind, op.path)
            return op.path
        if op.kind == "set" and full in self.nodes:
            node = self._touch(full)
            node.data, node.version = op.data, node.version + 1
            return op.path
        for path in ancestors(full):
            if path not in self.nodes:
                self._add(path, _Node(), op)
        if op.sequence:
            above = self._touch(parent(full))
            full, above.next_sequence = f"{full}{above.next_sequence:010d}", above.next_sequence + 1
        if full in self.nodes:
            raise node_error("NODE_EXISTS", op.kind, op.path)
        self._add(full, _Node(op.data, owner if op.ephemeral else None), op)
        return full[len(self.root):] or "/"

    def remove_tree(self, full: str) -> None:
        """Remove ``full`` and its descendants."""
        for child in list(self.nodes[full].children):
            self.remove_tree(f"{full.rstrip('/')}/{child}")
        self._remove(full)

    def undo(self) -> None:
        for path, node in self.saved.items():
            if node is None:
                self.nodes.pop(path, None)
            else:
                self.nodes[path] = node

    def _touch(self, full: str) -> _Node | None:
        if full not in self.saved:
            node = self.nodes.get(full)
            self.saved[full] = node.copy() if node is not None else None
        return self.nodes.get(full)

    def _add(self, full: str, node: _Node, op: Op) -> None:
        above = self._touch(parent(full))
        if above.owner is not None:
            raise node_error("EPHEMERAL_PARENT", op.kind, op.path)
        above.children.add(full.rsplit("/", 1)[1])
        self._touch(full)
        self.nodes[full] = node

    def _remove(self, full: str) -> None:
        self._touch(parent(full)).children.discard(full.rsplit("/", 1)[1])
        self._touch(full)
        del self.nodes[full]


class Store:
    """The node tree that EmbeddedRegistry sessions share: full path -> node, under one lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.nodes: dict[str, _Node] = {"/": _Node()}
        self.sessions: dict[int, EmbeddedRegistry] = {}
        self._ids = itertools.count(1)

    def join(self, session: "EmbeddedRegistry") -> int:
        """A new session id for ``session``, which is then told of changes."""
        with self.lock:
            sid = next(self._ids)
            self.sessions[sid] = session
            return sid

    def apply(self, ops: list[Op], root: str, owner: int) -> list[str]:
        """Apply ``ops`` for session ``owner``, all or none; the paths made."""
        with self.lock:
            edit = _Edit(self.nodes, root)
            try:
                paths = [edit.apply(op, owner) for op in ops]
            except RegistryError:
                edit.undo()
                raise
            self._changed(edit)
            return paths

    def remove_tree(self, full: str) -> bool:
        """Remove ``full`` and its descendants; False if it is missing."""
        with self.lock:
            if full not in self.nodes:
                return False
            edit = _Edit(self.nodes, "")
            edit.remove_tree(full)
            self._changed(edit)
            return True

    def leave(self, sid: int) -> None:
        """End session ``sid``: its ephemeral nodes go, it hears of changes no more."""
        with self.lock:
            self.sessions.pop(sid, None)
            edit = _Edit(self.nodes, "")
            for full in [p for p, node in self.nodes.items() if node.owner == sid]:
                edit.remove_tree(full)
            self._changed(edit)

    def read(self, full: str) -> bytes | None:
        with self.lock:
            node = self.nodes.get(full)
            return None if node is None else node.data

    def owner(self, full: str):
        """The session owning ``full`` (None: persistent; False: no such node)."""
        with self.lock:
            node = self.nodes.get(full)
            return False if node is None else node.owner

    def read_versioned(self, full: str) -> tuple[bytes | None, int | None]:
        with self.lock:
            node = self.nodes.get(full)
            return (None, None) if node is None else (node.data, node.version)

    def children(self, full: str) -> list[str]:
        with self.lock:
            node = self.nodes.get(full)
            return sorted(node.children) if node is not None else []

    def _changed(self, edit: _Edit) -> None:
        if edit.saved:
            for session in self.sessions.values():
                session._changed(edit.saved.keys())


class EmbeddedRegistry(Registry):
    """A session on a :class:`Store` (a new one unless given): the in-process registry backend."""

    @checked(RegistryError)
    def __init__(self, root: str = "/sparkcep", store: Store | None = None):
        super().__init__()
        self.root = check_path(root)
        if self.root == "/":
            raise RegistryError("the registry root must be below '/', e.g. '/sparkcep'", "BAD_PATH", root)
        self.address = "embedded"
        self.store = store if store is not None else Store()
        self._lock = threading.Lock()
        self._watches: dict[str, list[Watch]] = {}
        self._closed = False
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="sparkcep-registry-events", daemon=True)
        self._thread.start()
        self._sid = self.store.join(self)
        try:
            self.create("/", {})
        except RegistryError as e:
            if e.code != "NODE_EXISTS":
                raise

    def _full(self, path: str) -> str:
        if self._closed:
            raise RegistryError(f"the registry session on {self.root} is closed", "REGISTRY_CLOSED", path)
        return self.root if check_path(path) == "/" else self.root + path

    def get(self, path: str) -> dict | None:
        data = self.store.read(self._full(path))
        return None if data is None else decode(data, path)

    def owned(self, path: str) -> bool | None:
        owner = self.store.owner(self._full(path))
        return None if owner is False else owner == self._sid

    def versioned(self, path: str) -> tuple[dict | None, int | None]:
        data, version = self.store.read_versioned(self._full(path))
        return (None, None) if data is None else (decode(data, path), version)

    def delete(self, path: str, recursive: bool = False) -> None:
        if not recursive:
            self._commit([Op("delete", check_path(path))])
        elif not self.store.remove_tree(self._full(path)):
            raise node_error("NO_NODE", "delete", path)

    def children(self, path: str) -> list[str]:
        return self.store.children(self._full(path))

    def _commit(self, ops: list[Op]) -> list[str]:
        self._full(ops[0].path)  # REGISTRY_CLOSED once closed
        return self.store.apply(ops, self.root, self._sid)

    def watch(self, path: str, callback: Callable[[dict | None], object]) -> Watch:
        full = self._full(path)
        return self._watch(full, Watch(path, lambda: self.get(path), callback))

    def watch_children(self, path: str, callback: Callable[[list[str]], object]) -> Watch:
        full = self._full(path)
        return self._watch(full, Watch(path, lambda: self.store.children(full), callback))

    def _watch(self, full: str, watch: Watch) -> Watch:
        with self._lock:
            self._watches.setdefault(full, []).append(watch)
        try:
            watch.refresh()
        except BaseException:
            watch.cancel()
            raise
        return watch

    def _changed(self, paths) -> None:
        """Nodes at ``paths`` changed (called under the store's lock): queue their watches' refreshes."""
        with self._lock:
            for full in paths:
                watches = self._watches.get(full)
                if watches:
                    watches[:] = [w for w in watches if not w.cancelled]
                    for w in watches:
                        self._queue.put(w.refresh)

    def call_soon(self, fn: Callable[[], object]) -> None:
        self._queue.put(fn)

    def _run(self) -> None:
        """The event thread: runs queued callbacks one at a time until the session closes."""
        while (fn := self._queue.get()) is not None:
            if not self._closed:
                try:
                    fn()
                except Exception:
                    log.exception("registry callback %r failed", fn)

    def expire_session(self) -> None:
        """End this session as a ZooKeeper server expiring it would (for tests): its ephemeral nodes go,
        listeners hear LOST, then a new session starts (CONNECTED)."""
        self.store.leave(self._sid)
        self._set_state(State.LOST)
        self._sid = self.store.join(self)
        self._set_state(State.CONNECTED)
        self._changed(list(self._watches))  # as kazoo's watches, renewed with the new session

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._state = State.LOST
        self.store.leave(self._sid)
        self._queue.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)
