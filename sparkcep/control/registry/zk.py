"""The ZooKeeper registry backend, through kazoo: sessions that the processes of a cluster share.

One :class:`ZkRegistry` is one kazoo client, so one ZooKeeper session: its
ephemeral nodes go when it closes, or ``session_timeout`` after its process
dies or loses the server. Operations are retried over connection losses
(kazoo's ``KazooRetry``) for up to ``timeout`` seconds, then fail with
REGISTRY_UNREACHABLE naming the operation (as with any remote store, a write
that failed so may still be applied if the connection comes back within the
session). Requests are sent only while connected, so no call waits longer.
Callbacks run on kazoo's callback thread.

**Only token holders write.** Opened with the cluster's ``token``, a
session authenticates with a ZooKeeper digest derived from it
(:func:`acl_password`; the token itself never travels) and every node it
creates may be changed or deleted by digest holders only, read by anyone
(``sparkcep status`` needs no token). A session without the token reads;
its writes fail with NOT_ALLOWED. Still seal what must not be forged
(:func:`sparkcep.auth.seal`), and never store a token.

**A restarted ZooKeeper.** A session cut off for longer than its timeout
is over on the server, so the registry starts a new one itself (LOST, then
CONNECTED): a server restarted with empty data (a development server's
temporary directory) refuses clients that saw later transactions than it
has, and kazoo would retry the old session with them forever.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
import time
from typing import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import (BadVersionError, ConnectionClosedError, ConnectionLoss, KazooException,
                              NoAuthError, NoChildrenForEphemeralsError, NodeExistsError, NoNodeError, NotEmptyError,
                              RolledBackError, RuntimeInconsistency)
from kazoo.security import make_acl, make_digest_acl
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import Callback
from kazoo.retry import KazooRetry, RetryFailedError

from sparkcep.arguments import checked
from sparkcep.control.registry.base import Op, Registry, Watch, log
from sparkcep.control.registry.nodes import RegistryError, State, ancestors, check_path, decode, node_error

_CODES = ((NoNodeError, "NO_NODE"), (NodeExistsError, "NODE_EXISTS"), (NotEmptyError, "NOT_EMPTY"),
          (NoChildrenForEphemeralsError, "EPHEMERAL_PARENT"), (BadVersionError, "BAD_VERSION"),
          (NoAuthError, "NOT_ALLOWED"))
ACL_USER = "sparkcep"
_REPLANS = 8  # a transaction planned on a tree that concurrent writers keep changing fails after this many plans


def acl_password(token: str) -> str:
    """The ZooKeeper digest password of a cluster's token holders: an HMAC of the token, never the token."""
    return hmac.new(token.encode(), b"sparkcep zookeeper acl", hashlib.sha256).hexdigest()


def _code(error: BaseException) -> str | None:
    return next((code for kind, code in _CODES if isinstance(error, kind)), None)


class _PerAttempt(logging.Filter):
    """Leaves out the ZooKeeper client's line per failed connection attempt (a dozen in 10 s) while a
    registry is open: it says once that its connection was lost (and REGISTRY_UNREACHABLE, at start, that
    it found none). The clients of a process share kazoo's logger: another one's lines go unsaid too."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(("Connection dropped", "Failed connecting", "Transition to CONNECTING"))


class ZkRegistry(Registry):
    """A ZooKeeper session under ``root``, connected when the constructor returns.

    ``session_timeout`` (seconds) is how long the server keeps this session's
    ephemeral nodes and leases after losing touch with it; the server clamps
    it to [2, 20] x its tickTime. ``timeout`` bounds the connection at start
    and every operation's retries. REGISTRY_UNREACHABLE if no server answers.
    """

    @checked(RegistryError)
    def __init__(self, hosts: str = "127.0.0.1:2181", root: str = "/sparkcep", session_timeout: float = 10.0,
                 timeout: float = 10.0, token: str | None = None):
        super().__init__()
        self.root = check_path(root)
        if self.root == "/":
            raise RegistryError("the registry root must be below '/', e.g. '/sparkcep'", "BAD_PATH", root)
        self.hosts, self.address = hosts, f"zk://{hosts}{self.root}"
        self.session_timeout, self.timeout = session_timeout, timeout
        self._closed = False
        self._lock = threading.Lock()
        self._connected = threading.Event()
        self._watches: list[Watch] = []  # renewed at each CONNECTED
        self._retry = KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0, deadline=timeout)
        self._cut_since: float | None = None  # when the connection dropped, while it is down
        self._session_since: float | None = None  # when the current session's attempts began, while down
        acl = auth_data = None
        if token is not None:
            password = acl_password(token)
            acl = [make_digest_acl(ACL_USER, password, all=True), make_acl("world", "anyone", read=True)]
            auth_data = [("digest", f"{ACL_USER}:{password}")]
        try:
            self._client = KazooClient(hosts=hosts, timeout=session_timeout, default_acl=acl, auth_data=auth_data,
                                       connection_retry=dict(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0))
        except (ValueError, KazooException) as e:
            raise RegistryError(f"bad ZooKeeper hosts {hosts!r}: {e}; expected HOST:PORT[,HOST:PORT...]",
                                "BAD_ADDRESS") from None
        self._client.add_listener(self._on_kazoo_state)
        self._quiet = _PerAttempt()
        self._client.logger.addFilter(self._quiet)
        try:
            self._client.start(timeout=timeout)
        except KazooTimeoutError:
            self._client.logger.removeFilter(self._quiet)
            raise RegistryError(f"no ZooKeeper server answered at {hosts} within {timeout} s "
                                "(a local one for development: sparkcep zookeeper)", "REGISTRY_UNREACHABLE") from None
        try:
            self.create("/", {})
        except RegistryError as e:
            if e.code not in ("NODE_EXISTS", "NOT_ALLOWED"):
                self.close()
                raise
        threading.Thread(target=self._watchdog, name="sparkcep-registry-watchdog", daemon=True).start()

    def _full(self, path: str) -> str:
        return self.root if check_path(path) == "/" else self.root + path

    def _call(self, operation: str, path: str, fn: Callable):
        """``fn(ask)`` retried over connection losses until the registry's timeout has passed; ``ask(method,
        *args)`` sends one kazoo request once connected and waits for its answer until then. kazoo's node
        errors become RegistryErrors naming ``operation`` and ``path``."""
        if self._closed:
            raise RegistryError(f"{operation} {path}: the registry session on {self.address} is closed",
                                "REGISTRY_CLOSED", path)
        deadline = time.monotonic() + self.timeout

        def ask(method: Callable, *args, **kwargs):
            if not self._connected.wait(max(deadline - time.monotonic(), 0)):
                raise ConnectionLoss()  # retried until the deadline: a request sent now would wait for a reconnection
            if self._closed:
                raise ConnectionClosedError("closed")  # close() woke this wait: end it now
            return method(*args, **kwargs).get(timeout=max(deadline - time.monotonic(), 0.001))
        try:
            return self._retry.copy()(fn, ask)
        except (RetryFailedError, KazooTimeoutError):
            raise RegistryError(f"{operation} {path}: no answer from {self.address} within {self.timeout} s",
                                "REGISTRY_UNREACHABLE", path) from None
        except ConnectionClosedError:
            raise RegistryError(f"{operation} {path}: the registry session on {self.address} is closed",
                                "REGISTRY_CLOSED", path) from None
        except KazooException as e:
            if _code(e) is None:
                raise RegistryError(f"{operation} {path}: {type(e).__name__} {e}", path=path) from None
            raise node_error(_code(e), operation, path) from None

    def get(self, path: str) -> dict | None:
        full = self._full(path)
        try:
            data, _ = self._call("get", path, lambda ask: ask(self._client.get_async, full))
        except RegistryError as e:
            if e.code == "NO_NODE":
                return None
            raise
        return decode(data, path)

    def owned(self, path: str) -> bool | None:
        full = self._full(path)
        stat = self._call("exists", path, lambda ask: ask(self._client.exists_async, full))
        if stat is None:
            return None
        session = self._client.client_id
        return bool(stat.ephemeralOwner) and session is not None and stat.ephemeralOwner == session[0]

    def versioned(self, path: str) -> tuple[dict | None, int | None]:
        full = self._full(path)
        try:
            data, stat = self._call("get", path, lambda ask: ask(self._client.get_async, full))
        except RegistryError as e:
            if e.code == "NO_NODE":
                return None, None
            raise
        return decode(data, path), stat.version

    def delete(self, path: str, recursive: bool = False) -> None:
        """As one transaction: a recursive delete removes the whole subtree at once, or nothing."""
        for _ in range(_REPLANS):
            nodes = [check_path(path)]
            for node in nodes if recursive else ():
                nodes += [f"{node.rstrip('/')}/{child}" for child in self.children(node)]
            try:
                self._commit([Op("delete", node) for node in reversed(nodes)])
                return
            except RegistryError as e:  # a node added or removed meanwhile below ``path``: list again
                if not recursive or e.code not in ("NO_NODE", "NOT_EMPTY") or e.code == "NO_NODE" and e.path == path:
                    raise
        raise RegistryError(f"delete {path}: concurrent changes spoilt it {_REPLANS} times", "CONFLICT", path)

    def children(self, path: str) -> list[str]:
        full = self._full(path)
        try:
            return sorted(self._call("children", path, lambda ask: ask(self._client.get_children_async, full)))
        except RegistryError as e:
            if e.code == "NO_NODE":
                return []
            raise

    def _commit(self, ops: list[Op]) -> list[str]:
        operation = ops[0].kind if len(ops) == 1 else f"transaction ({len(ops)} operations)"
        for _ in range(_REPLANS):
            paths = self._call(operation, ops[0].path, lambda ask: self._attempt(ops, ask))
            if paths is not None:
                return paths
        raise RegistryError(f"{operation} {ops[0].path}: concurrent changes spoilt it {_REPLANS} times",
                            "CONFLICT", ops[0].path)

    def _attempt(self, ops: list[Op], ask: Callable) -> list[str] | None:
        """``ops`` as one kazoo transaction, missing parents created first: the paths made, or None if a
        concurrent change spoilt the plan (a parent created meanwhile, a node set removed...)."""
        txn, performs = self._client.transaction(), []  # performs[k]: (index in ops, is a planned parent)
        known: dict[str, bool] = {}

        def exists(full: str) -> bool:
            if full not in known:
                known[full] = ask(self._client.exists_async, full) is not None
            return known[full]
        for i, op in enumerate(ops):
            full = self._full(op.path)
            if op.kind == "check":
                txn.check(full, op.version)
            elif op.kind == "delete":
                txn.delete(full)
                known[full] = False
            else:
                for path in ancestors(full):
                    if not exists(path):
                        txn.create(path, b"")
                        known[path] = True
                        performs.append((i, True))
                if op.kind == "set" and exists(full):
                    txn.set_data(full, op.data)
                else:
                    txn.create(full, op.data, ephemeral=op.ephemeral, sequence=op.sequence)
                    if not op.sequence:
                        known[full] = True
            performs.append((i, False))
        results = ask(txn.commit_async)
        for (i, planned), result in zip(performs, results):
            if isinstance(result, Exception) and not isinstance(result, (RolledBackError, RuntimeInconsistency)):
                code, op = _code(result), ops[i]
                if code == "NO_NODE" and op.kind == "check":
                    code = "BAD_VERSION"
                elif code == "NO_NODE" and op.kind != "delete" or code == "NODE_EXISTS" and (planned or op.kind == "set"):
                    return None
                if code is None:
                    raise result
                raise node_error(code, op.kind, op.path)
        made = {i: result for (i, planned), result in zip(performs, results) if not planned}
        return [(made[i][len(self.root):] or "/") if op.kind == "create" else op.path for i, op in enumerate(ops)]

    def watch(self, path: str, callback: Callable[[dict | None], object]) -> Watch:
        full = self._full(path)

        def read(ask, on_event):
            while True:
                try:
                    return decode(ask(self._client.get_async, full, watch=on_event)[0], path)
                except NoNodeError:  # then watch for its creation
                    if ask(self._client.exists_async, full, watch=on_event) is None:
                        return None
        return self._watch(path, read, callback)

    def watch_children(self, path: str, callback: Callable[[list[str]], object]) -> Watch:
        full = self._full(path)

        def read(ask, on_event):
            while True:
                try:
                    return sorted(ask(self._client.get_children_async, full, watch=on_event))
                except NoNodeError:
                    if ask(self._client.exists_async, full, watch=on_event) is None:
                        return []
        return self._watch(path, read, callback)

    def _watch(self, path: str, read: Callable, callback: Callable) -> Watch:
        """A Watch whose reads leave a ZooKeeper watch (one-shot) that refreshes it on the next event."""
        def on_event(event) -> None:  # the same function each time: kazoo keeps one per node and kind
            self._refresh(watch)
        watch = Watch(path, lambda: self._call("watch", path, lambda ask: read(ask, on_event)), callback)
        with self._lock:
            self._watches = [w for w in self._watches if not w.cancelled] + [watch]
        try:
            watch.refresh()
        except BaseException:
            watch.cancel()
            raise
        return watch

    def _refresh(self, watch: Watch) -> None:
        if not self._closed:
            try:
                watch.refresh()
            except RegistryError as e:  # renewed at the next CONNECTED
                log.warning("watch on %s not renewed: %s", watch.path, e)

    def _on_kazoo_state(self, state) -> None:
        """kazoo's state listener, on its connection thread: record, tell listeners, renew the watches.

        It and the watchdog change the state under one lock: a reconnection the moment the watchdog starts a
        new session is told after that session's LOST, and does not leave the watchdog counting an outage."""
        if self._closed:
            return
        with self._lock:
            if state == "CONNECTED":
                self._connected.set()
                if self._cut_since is not None:
                    log.info("registry %s: connected again after %.1f s", self.address,
                             time.monotonic() - self._cut_since)
                self._cut_since = self._session_since = None
            else:
                self._connected.clear()
                if self._cut_since is None:
                    log.warning("registry %s: connection lost (%s); reconnecting", self.address, state)
                    self._cut_since = self._session_since = time.monotonic()
            self._set_state(State(state))  # under the lock: a new session's LOST is told before its CONNECTED
        if state == "CONNECTED":
            for watch in self._watches:
                self.call_soon(lambda watch=watch: self._refresh(watch))

    def _watchdog(self) -> None:
        """Start a new session once the connection has been down longer than the session timeout: the old
        one is over on the server (or the server restarted empty and refuses it). Said once an outage."""
        while not self._closed:
            time.sleep(0.2)
            with self._lock:
                now, since = time.monotonic(), self._session_since
                if since is None or now - since < self.session_timeout + 1.0:
                    continue
                log.log(logging.WARNING if since == self._cut_since else logging.DEBUG,
                        "registry %s: no connection for %.1f s: starting a new session", self.address,
                        now - self._cut_since)
                client = self._client
                client._session_id, client._session_passwd, client.last_zxid = None, b"\x00" * 16, 0
                self._session_since = now
                if self._state is not State.LOST:
                    self._set_state(State.LOST)

    def call_soon(self, fn: Callable[[], object]) -> None:
        def run():
            if not self._closed:
                try:
                    fn()
                except Exception:
                    log.exception("registry callback %r failed", fn)
        self._client.handler.dispatch_callback(Callback("sparkcep", run, ()))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._state = State.LOST
        self._connected.set()  # a call waiting for the connection ends now (REGISTRY_CLOSED)
        try:
            self._client.stop()
        finally:
            self._client.close()
            self._client.logger.removeFilter(self._quiet)
