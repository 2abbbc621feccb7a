"""Client of the loopback endpoint: how other processes (Spark workers, the CLI) use an engine.

>>> from sparkcep.gateway.client import EngineClient
>>> with EngineClient.connect() as c:            # doctest: +SKIP
...     c.schema("per_ip")["fields"]
{'window_start': 'timestamp', ...}

A client holds one TCP connection, opened on first use; requests on it are
serialised by a lock, so one client may be shared by threads. The
connection opens with the engine's handshake: both sides prove they hold
the token (see :func:`find_token`), which never travels. Errors the engine
raised come back as the same sparkcep error class with the same ``code``;
an unreachable engine raises ``EngineNotFoundError``.

Sends and reads of any size work: the client splits them into requests of
at most :func:`sparkcep.gateway.protocol.chunk_bytes` each. A large
:meth:`EngineClient.send` is staged in pieces and committed at once, so it
is still one engine send, taken whole or not at all.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid

import cloudpickle
import pyarrow as pa

from sparkcep import errors
from sparkcep import auth
from sparkcep.arguments import integer
from sparkcep.core.ingest import to_batches
from sparkcep.gateway import discovery
from sparkcep.gateway.discovery import EngineNotFoundError
from sparkcep.gateway.protocol import ProtocolError, chunk_bytes, chunks, from_ipc, recv_frame, send_frame, to_ipc
from sparkcep.runtime.channels import hello
from sparkcep.schema import as_schema

TOKEN_FILE_ENV = "SPARKCEP_TOKEN_FILE"
_HANG_UP = ("UNAUTHENTICATED", "FRAME_TOO_LARGE", "PROTOCOL")  # errors after which the endpoint closes
_ERRORS = {cls.__name__: cls for cls in (errors.SparkcepError, errors.SchemaError, errors.QueryError,
                                         errors.InputError, errors.UnknownStreamError, errors.EngineError,
                                         EngineNotFoundError, ProtocolError, auth.AuthError)}


def resolve(engine: str | None) -> str:
    """``host:port`` of the engine named by the ``engine`` option.

    ``None``, ``""`` or ``"local"``: the local engine (see :mod:`sparkcep.gateway.discovery`);
    ``"host:port"``: that endpoint. A cluster's engine (``zk://...``) is found through its registry:
    ``sparkcep.Engine.connect``, ``sparkcep status --zk``, Spark's ``engine=zk://...``.
    """
    if engine is None or engine.strip() in ("", "local"):
        return discovery.local_address()
    engine = engine.strip()
    if engine.startswith("zk://"):
        raise errors.EngineError(f"engine {engine!r} is a cluster: reach it with sparkcep.Engine.connect({engine!r}, "
                                 "token_file=...), sparkcep status --zk, or Spark's engine option", "ENGINE_OPTION")
    host, sep, port = engine.rpartition(":")
    if not sep or not host or not port.isdecimal():
        raise errors.EngineError(f"engine option {engine!r} is not host:port, 'local' or a zk:// URL",
                                 "ENGINE_OPTION")
    return engine


def find_token(address: str, token_file: str | None = None) -> str:
    """The token of the engine at ``address``.

    In order: the file ``token_file``; the file the engine serving
    ``address`` wrote under ``$SPARKCEP_HOME`` (every engine of this machine
    does); the file named by ``$SPARKCEP_TOKEN_FILE``. AuthError
    ``TOKEN_NOT_FOUND`` when there is none.
    """
    if token_file:
        return auth.read(token_file)
    own = discovery.token_file(address)
    if own.exists():
        return auth.read(own)
    if os.environ.get(TOKEN_FILE_ENV):
        return auth.read(os.environ[TOKEN_FILE_ENV])
    raise auth.AuthError(f"no token for the engine at {address}: {own} does not exist (engines of this machine "
                         f"write it there while they run, under $SPARKCEP_HOME). For an engine elsewhere, copy "
                         f"its token file here and pass it (Spark option tokenFile, or ${TOKEN_FILE_ENV})",
                         "TOKEN_NOT_FOUND")


class EngineClient:
    """Talks to one engine endpoint at ``address`` (``host:port``), with its token.

    ``token``: the token itself; else it is read from ``token_file`` or found
    as :func:`find_token` says, once the engine is reached (so an address
    nobody serves gives ``ENGINE_NOT_FOUND``, not a missing token).
    """

    def __init__(self, address: str, timeout: float = 60.0, token: str | None = None,
                 token_file: str | None = None):
        self.address = address
        self.timeout = timeout
        self.token = token
        self._token_file = token_file
        self._sock: socket.socket | None = None
        self._opening: socket.socket | None = None  # a connection in its handshake, for abort()
        self._aborted: str | None = None  # why abort() ended the request under way
        self._lock = threading.Lock()
        self._schemas: dict = {}  # input stream -> (its Schema, its time field), as the engine said

    @classmethod
    def connect(cls, engine: str | None = None, timeout: float = 60.0, token: str | None = None,
                token_file: str | None = None) -> "EngineClient":
        """A client of the engine named like the ``engine`` option (see :func:`resolve`), checked reachable."""
        client = cls(resolve(engine), timeout, token, token_file)
        client.hello()
        return client

    def __enter__(self) -> "EngineClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._drop()

    def abort(self, why: str | None = None) -> None:
        """From another thread: end the request under way, which then raises ``EngineNotFoundError``; given
        ``why`` (e.g. another engine serves), saying that its engine stopped answering and why."""
        self._aborted = why
        for sock in (self._sock, self._opening):
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    # --- operations ------------------------------------------------------------------
    def hello(self) -> dict:
        """``{"pid", "address", "version", "engine"}`` of the engine process (``engine``: its run id)."""
        return self.request("hello")[0]

    def streams(self) -> dict:
        """``{"inputs": {name: fields}, "outputs": {name: fields}}`` of the deployed queries."""
        return self.request("streams")[0]

    def schema(self, stream: str, form: str | None = None) -> dict:
        """``{"kind": "input"|"output"|"metrics", "fields": {name: type}, "time_field"}``; UnknownStreamError.

        ``form``: of ``$metrics``, ``long`` (default) or ``wide`` (see :mod:`sparkcep.gateway.endpoint`).
        """
        return self.request("schema", stream=stream, **_drop_none({"form": form}))[0]

    def send(self, stream: str, data, send_id: str | None = None) -> int:
        """Send ``data`` into input ``stream`` as one engine send; returns the rows taken.

        ``data`` is what :meth:`sparkcep.Engine.send` takes (an Arrow table or
        record batch, a pandas DataFrame with any index, a dict of lists or
        numpy arrays), converted and checked here as the engine does
        (:mod:`sparkcep.core.ingest`, against the stream's schema), so bad
        input gets the same error before anything travels. ``send_id``: the
        engine takes a send id once; sent again, it answers what it took
        (a retry after a lost reply takes nothing twice). Data larger than
        one request is staged in pieces under a writer id of the send and
        committed at once: still all or nothing.
        """
        table = self._validated(stream, data)
        if not table.num_rows:
            return 0
        send_id = send_id or uuid.uuid4().hex
        pieces = list(chunks(table.to_batches(), chunk_bytes()))
        try:
            if len(pieces) <= 1:
                return self.request("send", to_ipc(table.to_batches(), table.schema), stream=stream,
                                    send_id=send_id)[0]["rows"]
            writer = f"client-{send_id}"
            for k, piece in enumerate(pieces):
                run = self.stage(stream, writer, 0, 0, "0", k, piece)["engine"]
            try:
                reply = self.commit_stage(stream, writer, 0, [(0, "0", table.num_rows, run)])
            except errors.SparkcepError as e:
                if not isinstance(e, EngineNotFoundError):  # refused for good: what it staged goes
                    self.abort_stage(writer, 0)
                raise
            return table.num_rows if reply["duplicate"] else reply["rows"]
        except (errors.InputError, errors.UnknownStreamError):
            self._schemas.pop(stream, None)  # the stream may have been deployed again since it was looked up
            raise

    def _validated(self, stream: str, data) -> pa.Table:
        """``data`` as the stream's Arrow table, converted and checked as the engine does. Refused by a schema
        looked up before, it is checked again with the stream's schema now (it may have been deployed again
        since, with another schema)."""
        looked_up = stream in self._schemas
        try:
            return self._converted(stream, data)
        except errors.InputError:
            if not looked_up:
                raise
            self._schemas.pop(stream)
            return self._converted(stream, data)

    def _converted(self, stream: str, data) -> pa.Table:
        """``data`` checked against the stream's schema, looked up once and kept."""
        if stream not in self._schemas:
            h = self.schema(stream)
            if h["kind"] != "input":
                raise errors.UnknownStreamError(f"no deployed query reads a stream named {stream!r} (it is an "
                                                f"{h['kind']} stream)", "UNKNOWN_STREAM")
            self._schemas[stream] = (as_schema(h["fields"]), h.get("time_field"))
        schema, time_field = self._schemas[stream]
        return pa.Table.from_batches(to_batches(stream, schema, data, time_field), schema.to_arrow())

    def stage(self, stream: str, writer: str, batch: int, partition: int, attempt: str, chunk: int,
              batches: list[pa.RecordBatch]) -> dict:
        """Stage chunk ``chunk`` of ``(writer, batch, partition)``; chunk 0 replaces what the key held.

        Returns ``{"rows": staged for the key so far, "duplicate": batch committed before, "engine": run id}``.
        """
        return self.request("stage", to_ipc(batches, batches[0].schema), stream=stream, writer=writer,
                            batch=batch, partition=partition, attempt=attempt, chunk=chunk)[0]

    def commit_stage(self, stream: str, writer: str, batch: int, parts: list[tuple[int, str, int, str]]) -> dict:
        """Send the staged ``parts`` (partition, attempt, rows, engine run) of a batch as one engine send.

        Returns ``{"rows", "duplicate"}``; a batch at or before the writer's
        last committed one takes nothing (``duplicate``).
        """
        return self.request("commit_stage", stream=stream, writer=writer, batch=batch,
                            parts=[list(p) for p in parts])[0]

    def abort_stage(self, writer: str, batch: int) -> int:
        """Drop what is staged for ``batch`` of ``writer``; the rows dropped."""
        return self.request("abort_stage", writer=writer, batch=batch)[0]["rows"]

    def end(self, stream: str) -> None:
        self.request("end", stream=stream)

    def offsets(self, stream: str, **identity) -> dict:
        """``{"earliest", "latest", "engine", "deployment"}`` of output ``stream`` (positions per partition).

        ``identity`` (``engine``, ``deployment``, ``positions``) is checked by
        the engine: positions of another run or deployment, or no longer
        retained, are refused. Every request about positions (this one,
        ``read``, ``register``, ``commit``) of ``$metrics`` may name its ``form``.
        """
        h = self.request("offsets", stream=stream, **_drop_none(identity))[0]
        h["earliest"] = {int(p): v for p, v in h["earliest"].items()}
        h["latest"] = {int(p): v for p, v in h["latest"].items()}
        return h

    def read(self, stream: str, partition: int, start: int, end: int, **identity) -> pa.Table:
        """Rows ``[start, end)`` of ``partition`` of output ``stream``, with the ``__seq`` column last.

        Read in as many requests as the reply size limit needs.
        """
        tables = []
        while True:
            header, payload = self.request("read", stream=stream, partition=partition, start=start, end=end,
                                           max_bytes=chunk_bytes(), **_drop_none(identity))
            tables.append(from_ipc(payload))
            start += header["rows"]
            if start >= end or not header["rows"]:
                break
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables)

    def register(self, stream: str, consumer: str, positions: dict[int, int] | None = None, **identity) -> dict:
        """Hold the rows of ``stream`` for ``consumer`` from ``positions`` (default: the earliest retained)."""
        pos = None if positions is None else {str(p): plain_position(v) for p, v in positions.items()}
        return self.request("register", stream=stream, consumer=consumer, positions=pos, **_drop_none(identity))[0]

    def commit(self, stream: str, positions: dict[int, int], consumer: str = "default", **identity) -> None:
        """Release the rows of ``stream`` before ``positions`` once every consumer passed them."""
        self.request("commit", stream=stream, consumer=consumer,
                     positions={str(p): plain_position(v) for p, v in positions.items()}, **_drop_none(identity))

    def metrics(self) -> dict:
        """The engine's metrics plus the endpoint's counters, numbered as the engine numbers them (JSON
        keys are strings: instance managers and replicas are numbers again)."""
        m = self.request("metrics")[0]["metrics"]
        m["instance_managers"] = {int(k): v for k, v in m.get("instance_managers", {}).items()}
        for q in m.get("queries", {}).values():
            dedup = (q.get("replication") or {}).get("dedup") or {}
            for key in ("first_copies", "lag_epochs"):
                if key in dedup:
                    dedup[key] = {int(r): v for r, v in dedup[key].items()}
        return m

    def register_im(self, address: str) -> dict:
        """Have the engine use the instance manager serving at ``address`` (it must hold the engine's token)."""
        return self.request("register_im", address=address)[0]["instance_manager"]

    def instance_managers(self) -> list[dict]:
        return self.request("instance_managers")[0]["instance_managers"]

    def deploy(self, query, **options) -> dict:
        """Deploy ``query`` on the engine with ``deploy()``'s ``options``: its id, plan and streams."""
        return self.request("deploy", cloudpickle.dumps(query), options=options)[0]

    def undeploy(self, query: str) -> None:
        self.request("undeploy", query=query)

    def shutdown(self) -> None:
        """Stop the process serving the engine (an engine host)."""
        self.request("shutdown")

    # --- transport ---------------------------------------------------------------------
    def request(self, op: str, payload=b"", **fields) -> tuple[dict, pa.Buffer | None]:
        """One request/response; raises the engine's error, or EngineNotFoundError when unreachable."""
        with self._lock:
            self._aborted = None
            try:
                sock = self._socket()
                send_frame(sock, {"op": op, **fields}, payload)
                reply = recv_frame(sock)
            except OSError as e:
                self._drop()
                raise EngineNotFoundError(self._lost(op, f"is unreachable ({op}): {e}")) from None
            except ProtocolError:
                self._drop()
                raise
            if reply is None:
                self._drop()
                raise EngineNotFoundError(self._lost(op, f"closed the connection during {op!r}"))
            header, data = reply
            err = header.get("error") or {}
            if err.get("code") in _HANG_UP:
                self._drop()  # the engine closed the connection after this reply
        if not header.get("ok"):
            cls = _ERRORS.get(err.get("type"), errors.EngineError)
            raise cls(err.get("message", "unknown error"), err.get("code"))
        header.pop("ok")
        return header, data

    def _socket(self) -> socket.socket:
        """The connection, opened with the handshake: both sides prove they hold the engine's token."""
        if self._sock is None:
            host, _, port = self.address.rpartition(":")
            sock = socket.create_connection((host, int(port)), timeout=self.timeout)  # unreachable: said first
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._opening = sock  # a hung engine accepts (its kernel does) and never answers the hello
            try:
                self.token = self.token or find_token(self.address, self._token_file)
                answer = hello.greet(sock, {"role": hello.CLIENT}, self.token, time.monotonic() + self.timeout,
                                     f"the engine at {self.address}")
            except (OSError, ValueError, errors.SparkcepError):
                sock.close()
                raise
            finally:
                self._opening = None
            if not answer.get("ok"):
                sock.close()
                raise auth.AuthError(f"the engine at {self.address} refused this client: {answer.get('error')} "
                                     "(its token is not the one this client holds)")
            self._sock = sock
        return self._sock

    def _lost(self, op: str, what: str) -> str:
        """What a request that got no answer says: ``what`` happened, or why :meth:`abort` ended it."""
        if self._aborted is not None:
            return f"engine at {self.address} stopped answering during {op!r}; {self._aborted}"
        return f"engine at {self.address} {what}"

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def plain_position(value) -> int:
    """A position as JSON holds it: an integer (numpy's too) >= 0; floats and bools refused."""
    return integer(value, "a position", minimum=0, error=errors.EngineError, code="OFFSET_RANGE")


def _drop_none(fields: dict) -> dict:
    return {k: v for k, v in fields.items() if v is not None}
