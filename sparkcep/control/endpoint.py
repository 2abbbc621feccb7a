"""The loopback endpoint: an engine served to other processes of this machine.

Started by :meth:`sparkcep.Engine.local`, listening on ``127.0.0.1`` at an
ephemeral port, published in the local-engine file (see
:mod:`sparkcep.control.discovery`). Spark's Python workers, the JVM plugin's
instance-manager launcher and ``sparkcep status`` use it through
:class:`sparkcep.control.client.EngineClient`. One thread per connection;
engine calls that change state are serialised by :attr:`Endpoint.lock`.

Operations (the ``op`` of a request; framing in :mod:`sparkcep.control.protocol`):

=================  ============================================================
hello              pid, address, version
streams            input and output streams with their fields
schema             fields of one stream (input, output or ``$metrics``)
send               ingest an Arrow payload into an input stream; with ``key``
                   (writer, batch, partition) a key seen before ingests nothing
end                end of input for a stream
commit_write       the writer committed a batch: its keys are settled
offsets            earliest/latest retained position per output partition
read               rows [start, end) of one output partition (Arrow payload)
commit             a consumer is past these positions: release what all passed
metrics            the engine's metrics plus the endpoint's counters
register_im        record a running instance manager (``deregister_im``)
instance_managers  the registered instance managers
=================  ============================================================

The stream ``$metrics`` is a log of metric samples, one row per metric
(``time, name, value``), sampled when a reader asks for its offsets and the
last sample is older than :attr:`Endpoint.metrics_interval` seconds.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import traceback

import numpy as np
import pyarrow as pa

from sparkcep.control import discovery
from sparkcep.control.protocol import from_ipc, recv_frame, send_frame, to_ipc
from sparkcep.errors import EngineError, InputError, SparkcepError, UnknownStreamError
from sparkcep.runtime.output_log import OutputLog
from sparkcep.schema import type_name

METRICS = "$metrics"
METRICS_SCHEMA = pa.schema([("time", pa.timestamp("us")), ("name", pa.string()), ("value", pa.float64())])


class WriteLedger:
    """Which idempotent sends were applied, per writer: ``(batch, partition)`` keys.

    A key is a duplicate when its batch is at or before the writer's last
    committed batch (Spark never replays those) or when it was applied already.
    """

    def __init__(self):
        self.committed: dict[str, int] = {}
        self.applied: dict[str, set[tuple[int, int]]] = {}

    def seen(self, writer: str, batch: int, partition: int) -> bool:
        return batch <= self.committed.get(writer, -1) or (batch, partition) in self.applied.get(writer, ())

    def add(self, writer: str, batch: int, partition: int) -> None:
        self.applied.setdefault(writer, set()).add((batch, partition))

    def commit(self, writer: str, batch: int) -> None:
        self.committed[writer] = max(self.committed.get(writer, -1), batch)
        self.applied[writer] = {k for k in self.applied.get(writer, ()) if k[0] > batch}


class Endpoint:
    """Serves ``engine`` on ``host:port`` (port 0: any free port) until :meth:`close`."""

    def __init__(self, engine, host: str = "127.0.0.1", port: int = 0, publish: bool = True):
        self.engine = engine
        self.lock = threading.RLock()
        self.ledger = WriteLedger()
        self.metrics_log = OutputLog(METRICS_SCHEMA)
        self.metrics_interval = 1.0
        self._last_sample = 0.0
        self.instance_managers: dict[str, dict] = {}
        self.counters = {"requests": 0, "rows_in": 0, "rows_out": 0, "duplicate_sends": 0}
        self._server = socket.create_server((host, port))
        self.address = f"{host}:{self._server.getsockname()[1]}"
        self._conns: set[socket.socket] = set()
        self._closed = False
        self._ops = {name[4:]: getattr(self, name) for name in dir(self) if name.startswith("_op_")}
        self._thread = threading.Thread(target=self._accept, name=f"sparkcep-endpoint-{self.address}", daemon=True)
        self._thread.start()
        self._published = publish
        if publish:
            discovery.publish(self.address)

    def close(self) -> None:
        """Stop serving: close the listening socket and every connection; unpublish."""
        if self._closed:
            return
        self._closed = True
        if self._published:
            discovery.unpublish(self.address)
        try:
            self._server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._server.close()
        for c in list(self._conns):
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(timeout=5)

    # --- serving -----------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True, name="sparkcep-endpoint-conn").start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            while True:
                frame = recv_frame(conn)
                if frame is None:
                    return
                header, payload = frame
                try:
                    reply, data = self._dispatch(header, payload)
                    send_frame(conn, {"ok": True, **reply}, data)
                except SparkcepError as e:
                    send_frame(conn, {"ok": False, "error": {"type": type(e).__name__, "code": e.code,
                                                             "message": str(e)}})
                except Exception as e:  # a bug: report it to the caller, keep serving
                    traceback.print_exc(file=sys.stderr)
                    send_frame(conn, {"ok": False, "error": {"type": "EngineError", "code": "INTERNAL",
                                                             "message": f"{header.get('op')}: {e!r}"}})
        except OSError:
            return
        except SparkcepError:  # malformed frame: drop the connection
            return
        finally:
            self._conns.discard(conn)
            conn.close()

    def _dispatch(self, header: dict, payload) -> tuple[dict, object]:
        self.counters["requests"] += 1
        op = self._ops.get(header.get("op"))
        if op is None:
            raise EngineError(f"unknown endpoint operation {header.get('op')!r}; known: {sorted(self._ops)}",
                              "UNKNOWN_OP")
        return op(header, payload)

    # --- streams -----------------------------------------------------------------------
    def _input_schema(self, stream: str):
        deps = self.engine.streams.get(stream)
        if not deps:
            return None
        return deps[0].query.sources[stream]

    def _output_log(self, stream: str) -> OutputLog:
        if stream == METRICS:
            return self.metrics_log
        log = self.engine.outputs.get(stream)
        if log is None:
            hint = " (an input stream: write to it, read one of its query's outputs)" \
                if self._input_schema(stream) is not None else ""
            raise UnknownStreamError(f"no deployed query has an output stream named {stream!r}{hint}; "
                                     f"outputs: {sorted(self.engine.outputs) + [METRICS]}")
        return log

    # --- operations --------------------------------------------------------------------
    def _op_hello(self, h, _):
        return {"pid": os.getpid(), "address": self.address, "version": 1}, b""

    def _op_streams(self, h, _):
        with self.lock:
            inputs = {n: dict(self._input_schema(n).schema.fields) for n in self.engine.streams}
            outputs = {n: _fields(log.schema) for n, log in self.engine.outputs.items()}
        return {"inputs": inputs, "outputs": outputs}, b""

    def _op_schema(self, h, _):
        stream = h["stream"]
        with self.lock:
            if stream == METRICS:
                return {"kind": "metrics", "fields": _fields(METRICS_SCHEMA), "time_field": "time"}, b""
            if stream in self.engine.outputs:
                return {"kind": "output", "fields": _fields(self.engine.outputs[stream].schema),
                        "time_field": None}, b""
            src = self._input_schema(stream)
            if src is not None:
                return {"kind": "input", "fields": dict(src.schema.fields), "time_field": src.time_field}, b""
            raise UnknownStreamError(f"no deployed query has a stream named {stream!r}; inputs: "
                                     f"{sorted(self.engine.streams)}, outputs: "
                                     f"{sorted(self.engine.outputs) + [METRICS]}")

    def _op_send(self, h, payload):
        stream, key = h["stream"], h.get("key")
        table = from_ipc(payload)
        if table is None:
            return {"rows": 0, "duplicate": False}, b""
        with self.lock:
            if key is not None:
                writer, batch, part = str(key[0]), int(key[1]), int(key[2])
                if self.ledger.seen(writer, batch, part):
                    self.counters["duplicate_sends"] += 1
                    return {"rows": 0, "duplicate": True}, b""
            n = self.engine.send(stream, table) if table.num_rows else 0
            if key is not None:
                self.ledger.add(writer, batch, part)
            self.counters["rows_in"] += n
        return {"rows": n, "duplicate": False}, b""

    def _op_end(self, h, _):
        with self.lock:
            self.engine.end(h["stream"])
        return {}, b""

    def _op_commit_write(self, h, _):
        with self.lock:
            self.ledger.commit(str(h["writer"]), int(h["batch"]))
        return {}, b""

    def _op_offsets(self, h, _):
        log = self._output_log(h["stream"])
        if log is self.metrics_log:
            self._sample_metrics(h.get("interval"))
        return {"earliest": _keys(log.earliest()), "latest": _keys(log.latest())}, b""

    def _op_read(self, h, _):
        log = self._output_log(h["stream"])
        batches = log.read(int(h["partition"]), int(h["start"]), int(h["end"]), seq=True)
        rows = sum(b.num_rows for b in batches)
        self.counters["rows_out"] += rows
        return {"rows": rows}, to_ipc(batches, batches[0].schema if batches else _stored_schema(log))

    def _op_commit(self, h, _):
        log = self._output_log(h["stream"])
        log.commit({int(p): int(v) for p, v in h["positions"].items()}, str(h.get("consumer") or "default"))
        return {}, b""

    def _op_metrics(self, h, _):
        return {"metrics": self.snapshot()}, b""

    def _op_register_im(self, h, _):
        info = dict(h["info"])
        if "id" not in info or "pid" not in info:
            raise InputError(f"register_im needs 'id' and 'pid', got {sorted(info)}", "IM_INFO")
        info.setdefault("registered", time.time())
        with self.lock:
            self.instance_managers[str(info["id"])] = info
        return {}, b""

    def _op_deregister_im(self, h, _):
        with self.lock:
            self.instance_managers.pop(str(h["id"]), None)
        return {}, b""

    def _op_instance_managers(self, h, _):
        with self.lock:
            return {"instance_managers": list(self.instance_managers.values())}, b""

    # --- metrics -----------------------------------------------------------------------
    def snapshot(self) -> dict:
        """The engine's metrics with the endpoint's counters under ``"endpoint"``."""
        with self.lock:
            m = dict(self.engine.metrics())
            m["endpoint"] = dict(self.counters, instance_managers=len(self.instance_managers),
                                 retained_rows=sum(log.retained for log in self.engine.outputs.values()))
        return m

    def _sample_metrics(self, interval=None) -> None:
        now = time.time()
        with self.lock:
            if now - self._last_sample < (self.metrics_interval if interval is None else float(interval)):
                return
            self._last_sample = now
            rows = list(_flatten(self.snapshot()))
        n = len(rows)
        self.metrics_log.append(0, pa.RecordBatch.from_arrays(
            [pa.array(np.full(n, int(now * 1e6), np.int64)).cast(pa.timestamp("us")),
             pa.array([r[0] for r in rows], pa.string()), pa.array([r[1] for r in rows], pa.float64())],
            schema=METRICS_SCHEMA))


def start_endpoint(engine, publish: bool = True) -> Endpoint:
    """Serve ``engine`` on 127.0.0.1 at an ephemeral port (what :meth:`sparkcep.Engine.local` calls)."""
    return Endpoint(engine, publish=publish)


def _flatten(d: dict, prefix: str = ""):
    """(dotted name, value) of every numeric leaf of a nested dict, sorted by name."""
    for k in sorted(d, key=str):
        v = d[k]
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from _flatten(v, name + ".")
        elif isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
            yield name, float(v)


def _fields(schema: pa.Schema) -> dict[str, str]:
    out = {}
    for f in schema:
        try:
            out[f.name] = type_name(f.type)
        except SparkcepError:
            out[f.name] = str(f.type)
    return out


def _keys(positions: dict[int, int]) -> dict[str, int]:
    return {str(p): int(v) for p, v in sorted(positions.items())}


def _stored_schema(log: OutputLog) -> pa.Schema:
    return pa.schema(list(log.schema) + [pa.field("__seq", pa.int64())])
