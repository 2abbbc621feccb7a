"""Client of the loopback endpoint: how other processes (Spark workers, the CLI) use an engine.

>>> from sparkcep.control.client import EngineClient
>>> with EngineClient.connect() as c:            # doctest: +SKIP
...     c.schema("per_ip")["fields"]
{'window_start': 'timestamp', ...}

A client holds one TCP connection, opened on first use; requests on it are
serialised by a lock, so one client may be shared by threads. Errors the
engine raised come back as the same sparkcep error class with the same
``code``; an unreachable engine raises ``EngineNotFoundError``.
"""

from __future__ import annotations

import socket
import threading

import pyarrow as pa

from sparkcep import errors
from sparkcep.control import discovery
from sparkcep.control.discovery import EngineNotFoundError
from sparkcep.control.protocol import ProtocolError, from_ipc, recv_frame, send_frame, to_ipc

_ERRORS = {cls.__name__: cls for cls in (errors.SparkcepError, errors.SchemaError, errors.QueryError,
                                         errors.InputError, errors.UnknownStreamError, errors.EngineError,
                                         EngineNotFoundError, ProtocolError)}


def resolve(engine: str | None) -> str:
    """``host:port`` of the engine named by the ``engine`` option.

    ``None``, ``""`` or ``"local"``: the local engine (see :mod:`sparkcep.control.discovery`);
    ``"host:port"``: that endpoint; ``zk://...``: a registry, once the control plane provides it.
    """
    if engine is None or engine.strip() in ("", "local"):
        return discovery.local_address()
    engine = engine.strip()
    if engine.startswith("zk://"):
        raise errors.EngineError(f"engine {engine!r}: engines registered in ZooKeeper are not supported "
                                 "yet; pass the engine's endpoint as host:port or leave the option unset "
                                 "for the local engine", "ENGINE_ZK_UNSUPPORTED")
    host, sep, port = engine.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise errors.EngineError(f"engine option {engine!r} is not host:port, 'local' or a zk:// URL",
                                 "ENGINE_OPTION")
    return engine


class EngineClient:
    """Talks to one engine endpoint at ``address`` (``host:port``)."""

    def __init__(self, address: str, timeout: float = 60.0):
        self.address = address
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    @classmethod
    def connect(cls, engine: str | None = None, timeout: float = 60.0) -> "EngineClient":
        """A client of the engine named like the ``engine`` option (see :func:`resolve`), checked reachable."""
        client = cls(resolve(engine), timeout)
        client.hello()
        return client

    def __enter__(self) -> "EngineClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    # --- operations ------------------------------------------------------------------
    def hello(self) -> dict:
        """``{"pid", "address", "version"}`` of the engine process."""
        return self.request("hello")[0]

    def streams(self) -> dict:
        """``{"inputs": {name: fields}, "outputs": {name: fields}}`` of the deployed queries."""
        return self.request("streams")[0]

    def schema(self, stream: str) -> dict:
        """``{"kind": "input"|"output"|"metrics", "fields": {name: type}, "time_field"}``; UnknownStreamError."""
        return self.request("schema", stream=stream)[0]

    def send(self, stream: str, data: pa.Table | pa.RecordBatch, key: list | None = None) -> dict:
        """Send ``data`` into input ``stream``; ``key`` (any JSON list) makes the send idempotent.

        Returns ``{"rows": n, "duplicate": bool}``; a duplicate key ingests nothing.
        """
        table = pa.Table.from_batches([data]) if isinstance(data, pa.RecordBatch) else data
        return self.request("send", to_ipc(table.to_batches(), table.schema), stream=stream, key=key)[0]

    def end(self, stream: str) -> None:
        self.request("end", stream=stream)

    def offsets(self, stream: str) -> tuple[dict[int, int], dict[int, int]]:
        """``(earliest, latest)`` retained positions per partition of output ``stream``."""
        h = self.request("offsets", stream=stream)[0]
        return ({int(p): v for p, v in h["earliest"].items()}, {int(p): v for p, v in h["latest"].items()})

    def read(self, stream: str, partition: int, start: int, end: int) -> pa.Table:
        """Rows ``[start, end)`` of ``partition`` of output ``stream``, with the ``__seq`` column last."""
        header, payload = self.request("read", stream=stream, partition=partition, start=start, end=end)
        return from_ipc(payload)

    def commit(self, stream: str, positions: dict[int, int], consumer: str = "default") -> None:
        """Release the rows of ``stream`` before ``positions`` once every consumer passed them."""
        self.request("commit", stream=stream, consumer=consumer,
                     positions={str(p): int(v) for p, v in positions.items()})

    def commit_write(self, writer: str, batch: int) -> None:
        """Writer ``writer`` committed batch ``batch``: keys of batches up to it are settled."""
        self.request("commit_write", writer=writer, batch=batch)

    def metrics(self) -> dict:
        """The engine's metrics plus the endpoint's counters and instance managers."""
        return self.request("metrics")[0]["metrics"]

    def register_im(self, info: dict) -> None:
        """Record a running instance manager: ``info`` has at least ``id`` and ``pid``."""
        self.request("register_im", info=info)

    def deregister_im(self, im_id: str) -> None:
        self.request("deregister_im", id=im_id)

    def instance_managers(self) -> list[dict]:
        return self.request("instance_managers")[0]["instance_managers"]

    # --- transport ---------------------------------------------------------------------
    def request(self, op: str, payload=b"", **fields) -> tuple[dict, pa.Buffer | None]:
        """One request/response; raises the engine's error, or EngineNotFoundError when unreachable."""
        with self._lock:
            try:
                sock = self._socket()
                send_frame(sock, {"op": op, **fields}, payload)
                reply = recv_frame(sock)
            except OSError as e:
                self._drop()
                raise EngineNotFoundError(f"engine at {self.address} is unreachable ({op}): {e}") from None
            except ProtocolError:
                self._drop()
                raise
            if reply is None:
                self._drop()
                raise EngineNotFoundError(f"engine at {self.address} closed the connection during {op!r}")
        header, data = reply
        if not header.get("ok"):
            err = header.get("error", {})
            cls = _ERRORS.get(err.get("type"), errors.EngineError)
            raise cls(err.get("message", "unknown error"), err.get("code"))
        header.pop("ok")
        return header, data

    def _socket(self) -> socket.socket:
        if self._sock is None:
            host, _, port = self.address.rpartition(":")
            self._sock = socket.create_connection((host, int(port)), timeout=self.timeout)
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self._sock

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
