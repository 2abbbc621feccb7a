"""The loopback endpoint: an engine served to other processes of this machine, to its owner only.

Started by :meth:`sparkcep.Engine.local`, listening on ``127.0.0.1`` at an
ephemeral port. It writes the engine's token (:mod:`sparkcep.auth`) to
``$SPARKCEP_HOME/engine-HOST-PORT.token`` (mode 0600) and publishes
its address in ``local.json`` (see :mod:`sparkcep.gateway.discovery`).
Spark's Python workers, the JVM plugin's instance-manager launcher and
``sparkcep status`` use it through :class:`sparkcep.gateway.client.EngineClient`.
One thread per connection; engine calls that change state are serialised by
:attr:`Endpoint.lock`.

Every connection opens with the handshake every listener of the engine
uses (:mod:`sparkcep.runtime.channels.hello`: each side proves it holds
the token with an HMAC of both sides' nonces, the token never travels): a
connection without the proof is refused before anything else is read,
counted (``unauthenticated``) and logged once per peer host. A frame over
the size limits of :mod:`sparkcep.gateway.protocol` gets
``FRAME_TOO_LARGE`` before anything is allocated for it, and its
connection is closed too. Payloads are Arrow IPC, headers JSON; only
``deploy`` carries a pickle (the query), from a peer that proved the token, and
only ``deployed`` answers with one, to a peer that proved it.

Operations (the ``op`` of a request):

=================  ============================================================
hello              pid, address, version, engine run id
streams            input and output streams with their fields
schema             fields of one stream (input, output or ``$metrics``)
send               ingest an Arrow payload into an input stream (one engine send)
stage              append a chunk of a writer's (batch, partition) rows
commit_stage       one engine send of a batch's staged partitions, in order
abort_stage        drop a batch's staged rows
end                end of input for a stream
offsets            earliest/latest retained position per output partition (``settle``:
                   once the output reflects every send made so far; ``whole``: refused
                   unless the log keeps every row, as collect(); ``failed``: its query's error)
read               rows [start, end) of one output partition, up to a byte budget
register           hold an output's rows for a consumer from now on
commit             a consumer is past these positions: release what all passed
metrics            the engine's metrics plus the endpoint's counters
register_im        use the instance manager serving at ``address`` (an executor's)
instance_managers  the engine's instance managers
deploy             deploy the query pickled in the payload, with ``deploy()``'s options
deployed           the id of a deployed query, the query pickled in the payload
deployment         call a method of a deployed query (``migrate``, ``rescale``, ...), of the
                   deployment its ``deployment`` names: ``UNDEPLOYED`` once that is gone
undeploy           stop a deployed query
shutdown           stop the process serving the engine (an engine host only)
=================  ============================================================

Requests about output positions (``offsets``, ``read``, ``register``,
``commit``) may name the engine run and deployment the positions belong
to (``engine``, ``deployment``): positions of another run or deployment are
refused with ``OFFSET_ENGINE`` / ``OFFSET_DEPLOYMENT``, never applied.

The stream ``$metrics`` is a log of metric samples (the dotted names of
:meth:`Endpoint.snapshot`'s numbers), sampled when a reader asks for its
offsets and the last sample is older than :attr:`Endpoint.metrics_interval`
seconds (or the request's ``interval``). Its requests may name a ``form``:
``long`` (default), one row per metric and sample (``time, name, value``);
``wide``, one row per sample (``time, names, values``: two lists), whose
``schema`` is ``time`` and one ``float64`` field per metric reported now.
Each form is a log of its own, sampled when its readers ask.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
import traceback

import cloudpickle
import numpy as np
import pyarrow as pa

from sparkcep import auth
from sparkcep.arguments import did_you_mean, host_port
from sparkcep.deployed import CALLS
from sparkcep.gateway import discovery
from sparkcep.gateway.deployed import from_wire, options_from_wire, to_wire
from sparkcep.gateway.protocol import ProtocolError, from_ipc, read_head, read_payload, send_frame, to_ipc
from sparkcep.gateway.staging import Staging
from sparkcep.core.pages import scratch
from sparkcep.errors import EngineError, InputError, SparkcepError, UnknownStreamError
from sparkcep.runtime.channels import hello
from sparkcep.runtime.output_log import OutputLog
from sparkcep.runtime.send_ids import send_id_of
from sparkcep.schema import type_name

METRICS = "$metrics"
CHANGES = frozenset({"send", "stage", "commit_stage", "abort_stage", "end", "register", "commit", "deploy",
                     "undeploy"})  # operations whose answer says a change was taken
METRICS_SCHEMA = pa.schema([("time", pa.timestamp("us")), ("name", pa.string()), ("value", pa.float64())])
SAMPLES_SCHEMA = pa.schema([("time", pa.timestamp("us")), ("names", pa.list_(pa.string())),
                           ("values", pa.list_(pa.float64()))])  # $metrics in the wide form
VERSION = 2

log = logging.getLogger(__name__)


class Endpoint:
    """Serves ``engine`` on ``host:port`` (port 0: any free port) until :meth:`close`."""

    def __init__(self, engine, host: str = "127.0.0.1", port: int = 0, publish: bool = True):
        self.engine = engine
        self.lock = threading.RLock()
        self.staging = Staging()
        self.metrics_logs = {"long": OutputLog(METRICS_SCHEMA, METRICS), "wide": OutputLog(SAMPLES_SCHEMA, METRICS)}
        self.metrics_interval = 1.0
        self._last_sample = dict.fromkeys(self.metrics_logs, 0.0)
        self.counters = {"requests": 0, "rows_in": 0, "rows_out": 0, "unauthenticated": 0, "bad_frames": 0,
                         "batch_commits": 0, "committed_partitions": 0, "duplicate_batches": 0, "duplicate_sends": 0}
        self.gate = hello.Gate(engine.token)
        self._server = socket.create_server((host, port))
        self.address = f"{host}:{self._server.getsockname()[1]}"
        self.token = engine.token  # the engine's: its instance managers hold the same
        self.token_file = auth.write(discovery.token_file(self.address), self.token)
        self._conns: set[socket.socket] = set()
        self._closed = False
        self._ops = {name[4:]: getattr(self, name) for name in dir(self) if name.startswith("_op_")}
        self._thread = threading.Thread(target=self._accept, name=f"sparkcep-endpoint-{self.address}", daemon=True)
        self._thread.start()
        self._published = publish
        self.on_shutdown = None  # set by a process that may be stopped through its endpoint (an engine host)
        self.guard = None  # guard(op) raises for an operation this process does not serve now (a standby's)
        self.role = None  # role() names what the engine host serving here is now, for metrics (see snapshot)
        if publish:
            discovery.publish(self.address, self.token_file)

    def close(self) -> None:
        """Stop serving: close the listening socket and every connection; unpublish, remove the token file."""
        if self._closed:
            return
        self._closed = True
        if self._published:
            discovery.unpublish(self.address)
        try:
            if auth.read(self.token_file) == self.token:
                self.token_file.unlink()
        except (SparkcepError, OSError):
            pass
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
                conn, peer = self._server.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn, peer[0]), daemon=True,
                             name="sparkcep-endpoint-conn").start()

    def _serve(self, conn: socket.socket, peer: str) -> None:
        try:
            try:
                greeting = self.gate.accept(conn)  # the token proved before anything else is read
            except SparkcepError:
                self._refused(peer)
                return
            if greeting.role != hello.CLIENT:
                self.gate.refuse(greeting, "this is an engine's endpoint: only clients connect to it")
                return
            hello.send_frame(conn, {"ok": True}, time.monotonic() + hello.HELLO_TIMEOUT_S)
            conn.settimeout(None)
            while True:
                try:
                    head = read_head(conn)
                except ProtocolError as e:  # garbage or an oversized frame: say so, then hang up
                    self.counters["bad_frames"] += 1
                    _reply_error(conn, e)
                    return
                if head is None:
                    return
                header, size = head
                payload = read_payload(conn, size, scratch)
                try:
                    reply, data = self._dispatch(header, payload)
                except SparkcepError as e:
                    _reply_error(conn, e)
                    continue
                except Exception as e:  # a bug: report it to the caller, keep serving
                    traceback.print_exc(file=sys.stderr)
                    _reply_error(conn, EngineError(f"{header.get('op')}: {e!r}", "INTERNAL"))
                    continue
                send_frame(conn, {"ok": True, **reply}, data)  # a peer gone meanwhile ends the connection
        except (OSError, SparkcepError):  # the peer went away, or a frame was cut short
            return
        finally:
            self._conns.discard(conn)
            conn.close()

    def _refused(self, peer: str) -> None:
        """A connection that did not prove the token (the gate answered it no and logged it once per host)."""
        self.counters["unauthenticated"] += 1

    def _dispatch(self, header: dict, payload) -> tuple[dict, object]:
        self.counters["requests"] += 1
        name = header.get("op")
        op = self._ops.get(name)
        if op is None:
            raise EngineError(f"unknown endpoint operation {name!r}; known: {sorted(self._ops)}", "UNKNOWN_OP")
        if self.guard is not None:
            self.guard(name)
        reply = op(header, payload)
        if name in CHANGES and self.engine.journal is not None:
            self.engine.journal.confirm()  # a cluster's data path: acknowledged once its standby holds it
        return reply

    # --- streams -----------------------------------------------------------------------
    def _input_schema(self, stream: str):
        deps = self.engine.streams.get(stream)
        if not deps:
            return None
        return deps[0].query.sources[stream]

    def _output_log(self, h: dict) -> OutputLog:
        """The log of output ``h["stream"]``, checked against the run and deployment ``h`` names."""
        stream = h["stream"]
        if stream == METRICS:
            log_ = self.metrics_logs[_form(h)]
        else:
            log_ = self.engine.outputs.get(stream)
            if log_ is None:
                hint = " (an input stream: write to it, read one of its query's outputs)" \
                    if self._input_schema(stream) is not None else did_you_mean(stream, [*self.engine.outputs, METRICS])
                raise UnknownStreamError(f"no deployed query has an output stream named {stream!r}{hint}; "
                                         f"outputs: {sorted(self.engine.outputs) + [METRICS]}")
        run, dep = h.get("engine"), h.get("deployment")
        if run is not None and run != self.engine.run_id:
            raise EngineError(f"positions of stream {stream!r} belong to engine run {run}, but the engine at "
                              f"{self.address} is run {self.engine.run_id}: the engine restarted since they were "
                              "taken, and its positions start over. Start the query with a new "
                              "checkpointLocation (rows the old run had not committed are not in this engine)",
                              "OFFSET_ENGINE")
        if dep is not None and dep != log_.deployment:
            raise EngineError(f"positions of stream {stream!r} belong to deployment {dep!r}, but the stream is now "
                              f"produced by deployment {log_.deployment!r} (its query was undeployed and deployed "
                              "again), whose positions start over. Start the query with a new checkpointLocation",
                              "OFFSET_DEPLOYMENT")
        return log_

    def _identity(self, log_: OutputLog) -> dict:
        return {"engine": self.engine.run_id, "deployment": log_.deployment}

    # --- operations --------------------------------------------------------------------
    def _op_hello(self, h, _):
        return {"pid": os.getpid(), "address": self.address, "version": VERSION, "engine": self.engine.run_id}, b""

    def _op_streams(self, h, _):
        with self.lock:
            inputs = {n: dict(self._input_schema(n).schema.fields) for n in self.engine.streams}
            outputs = {n: _fields(log_.schema) for n, log_ in self.engine.outputs.items()}
        return {"inputs": inputs, "outputs": outputs}, b""

    def _op_schema(self, h, _):
        stream = h["stream"]
        with self.lock:
            if stream == METRICS:
                fields = _fields(METRICS_SCHEMA)
                if _form(h) == "wide":
                    fields = {"time": "timestamp", **{name: "float64" for name, _ in _flatten(series(self.snapshot()))}}
                return {"kind": "metrics", "fields": fields, "time_field": "time", "retained": True}, b""
            if stream in self.engine.outputs:
                log_ = self.engine.outputs[stream]
                return {"kind": "output", "fields": _fields(log_.schema), "time_field": None,
                        "retained": log_.retain}, b""
            src = self._input_schema(stream)
            if src is not None:
                return {"kind": "input", "fields": dict(src.schema.fields), "time_field": src.time_field}, b""
            named = [*self.engine.streams, *self.engine.outputs, METRICS]
            raise UnknownStreamError(f"no deployed query has a stream named {stream!r}{did_you_mean(stream, named)}; "
                                     f"inputs: {sorted(self.engine.streams)}, outputs: "
                                     f"{sorted(self.engine.outputs) + [METRICS]}")

    def _op_send(self, h, payload):
        table, send_id = from_ipc(payload), h.get("send_id")
        if table is None or not table.num_rows:
            return {"rows": 0, "duplicate": False}, b""
        with self.lock:
            if send_id is None:
                n, duplicate = self.engine.send(h["stream"], table), False
            else:
                n, duplicate = self.engine._send_once(h["stream"], table, send_id_of(send_id))
            if duplicate:
                self.counters["duplicate_sends"] += 1
            else:
                self.counters["rows_in"] += n
        return {"rows": n, "duplicate": duplicate}, b""

    def _op_stage(self, h, payload):
        stream = h["stream"]
        if self._input_schema(stream) is None:
            raise UnknownStreamError(f"no deployed query reads a stream named {stream!r}"
                                     f"{did_you_mean(stream, self.engine.streams)}; "
                                     f"streams: {sorted(self.engine.streams)}")
        table = from_ipc(payload)
        table = table if table is not None else pa.table({})
        key = (str(h["writer"]), int(h["batch"]), int(h["partition"]), str(h["attempt"]), int(h["chunk"]))
        reply = self.staging.stage(*key, stream, table)
        if self.engine.journal is not None and not reply["duplicate"]:
            self.engine.journal.staged(*key, stream, table)
        return {**reply, "engine": self.engine.run_id}, b""

    def _op_commit_stage(self, h, _):
        writer, batch, stream = str(h["writer"]), int(h["batch"]), h["stream"]
        parts = [(int(p), str(attempt), int(rows)) for p, attempt, rows, _ in h["parts"]]
        lost = [(p, run) for p, _, rows, run in h["parts"] if rows and run != self.engine.run_id]
        with self.lock:
            if lost and batch > self.staging.committed.get(writer, -1):
                p, run = lost[0]
                raise InputError(f"writer {writer} batch {batch}: partition {p} was staged in engine run {run}, but "
                                 f"the engine at {self.address} is run {self.engine.run_id}: it restarted between "
                                 "the task's write and the commit, and the staged rows are gone. Restart the "
                                 "query: Spark writes the batch again", "STAGE_MISSING")
            table = self.staging.take(writer, batch, stream, parts)
            if table is None:
                self.counters["duplicate_batches"] += 1
                return {"rows": 0, "duplicate": True}, b""
            n = self.engine._take(stream, table, ("stage", writer, batch)) if table.num_rows else 0
            self.staging.settle(writer, batch)
            self.counters["rows_in"] += n
            self.counters["batch_commits"] += 1
            self.counters["committed_partitions"] += sum(1 for p in parts if p[2])
        return {"rows": n, "duplicate": False}, b""

    def _op_abort_stage(self, h, _):
        writer, batch = str(h["writer"]), int(h["batch"])
        rows = self.staging.abort(writer, batch)
        if self.engine.journal is not None:
            self.engine.journal.unstaged(writer, batch)
        return {"rows": rows}, b""

    def _op_end(self, h, _):
        with self.lock:
            self.engine.end(h["stream"])
        return {}, b""

    def _op_offsets(self, h, _):
        if h.get("settle"):  # as collect(): once the output reflects every send and end made so far (an
            self.engine._settle(h["stream"], h.get("timeout"))  # unknown one refused as collect() refuses it)
        log_ = self._output_log(h)
        if h["stream"] == METRICS:
            self._sample_metrics(_form(h), h.get("interval"))
        if h.get("whole"):  # as collect(): the rows of an output that keeps none, or lost some, are no answer
            log_.check_whole()
        earliest, latest = log_.earliest(), log_.latest()
        if h.get("positions") is not None:
            _check_positions(h["stream"], {int(p): int(v) for p, v in h["positions"].items()}, earliest, latest)
        failed = {} if log_.error is None else {"failed": {"code": getattr(log_.error, "code", "INTERNAL"),
                                                           "message": str(log_.error)}}
        return {"earliest": _keys(earliest), "latest": _keys(latest), **self._identity(log_), **failed}, b""

    def _op_read(self, h, _):
        log_ = self._output_log(h)
        start, end = int(h["start"]), int(h["end"])
        batches = _within(log_.read(int(h["partition"]), start, end, seq=True), int(h.get("max_bytes") or 0))
        rows = sum(b.num_rows for b in batches)
        self.counters["rows_out"] += rows
        return {"rows": rows}, to_ipc(batches, batches[0].schema if batches else _stored_schema(log_))

    def _op_register(self, h, _):
        log_ = self._output_log(h)
        positions = h.get("positions")
        log_.register(str(h["consumer"]), None if positions is None else {int(p): int(v) for p, v in positions.items()})
        return self._identity(log_), b""

    def _op_commit(self, h, _):
        log_ = self._output_log(h)
        log_.commit({int(p): int(v) for p, v in h["positions"].items()}, str(h.get("consumer") or "default"))
        return {}, b""

    def _op_metrics(self, h, _):
        return {"metrics": self.snapshot()}, b""

    def _op_register_im(self, h, _):
        address = h.get("address")
        if not isinstance(address, str) or ":" not in address:
            raise InputError(f"register_im needs the 'address' (host:port) of a serving instance manager, "
                             f"got {address!r}", "IM_INFO")
        return {"instance_manager": self.engine.add_instance_manager(address)}, b""

    def _op_instance_managers(self, h, _):
        return {"instance_managers": self.engine.instance_managers()}, b""

    def _op_deploy(self, h, payload):
        """Deploy the query pickled in the payload (the caller proved the token) with ``options``."""
        query = cloudpickle.loads(memoryview(payload))
        dep = self.engine.deploy(query, **options_from_wire(h.get("options", {})))
        return {"deployment": dep.id, "explain": dep.explain(), "streams": sorted(query.sources),
                "outputs": sorted(query.outputs)}, b""

    def _op_deployment(self, h, _):
        """Call ``method`` (one of :data:`sparkcep.deployed.CALLS`) of deployed query ``query`` with ``args``;
        of its deployment ``deployment`` when named, undeployed since or not."""
        method = h.get("method")
        if method not in CALLS:
            raise EngineError(f"a deployed query has no method {method!r}; methods: {', '.join(CALLS)}", "UNKNOWN_OP")
        handle = self.engine._handle(h.get("query"), h.get("deployment"))
        args = from_wire(method, h.get("args") or {})
        try:
            result = handle.parallelism if method == "parallelism" else getattr(handle, method)(**args)
        except TypeError as e:
            raise InputError(f"deployment {method}: {e}", "BAD_REQUEST") from None
        return {"result": to_wire(method, result, result=True)}, b""

    def _op_deployed(self, h, _):
        """The id of deployed query ``query``; the payload: the query, pickled."""
        handle = self.engine.deployment(h.get("query"))
        return {"deployment": handle.id}, cloudpickle.dumps(handle.query)

    def _op_undeploy(self, h, _):
        self.engine.undeploy(h.get("query"))
        return {}, b""

    def _op_shutdown(self, h, _):
        """Stop the process serving this engine, when it allows it (an engine host does)."""
        if self.on_shutdown is None:
            raise EngineError(f"the engine at {self.address} is not stopped from afar", "NOT_ALLOWED")
        threading.Thread(target=self.on_shutdown, daemon=True).start()
        return {}, b""

    # --- metrics -----------------------------------------------------------------------
    def snapshot(self) -> dict:
        """The engine's metrics with the endpoint's counters under ``"endpoint"``; on an engine host, its
        role under ``"role"`` (``taking-over``: its queries are not all replayed yet)."""
        m = dict(self.engine.metrics())  # not under the lock: it waits for an instance manager that is slow
        with self.lock:
            m["endpoint"] = dict(self.counters, staged_rows=self.staging.rows,
                                 retained_rows=sum(log_.retained for log_ in self.engine.outputs.values()))
        if self.role is not None:
            m["role"] = self.role()
        return m

    def _sample_metrics(self, form: str, interval=None) -> None:
        """Append a sample to the ``form`` log of ``$metrics`` unless its last is under ``interval`` s old."""
        now = time.time()
        with self.lock:
            if now - self._last_sample[form] < (self.metrics_interval if interval is None else float(interval)):
                return
            self._last_sample[form] = now
        names, values = zip(*_flatten(series(self.snapshot())))
        stamp, log_ = int(now * 1e6), self.metrics_logs[form]
        rows = {"time": [stamp] * len(names), "name": names, "value": values} if form == "long" else \
            {"time": [stamp], "names": [names], "values": [values]}
        log_.append(0, pa.RecordBatch.from_pydict(rows, schema=log_.schema))


def start_endpoint(engine, listen: str = "127.0.0.1:0", publish: bool = True) -> Endpoint:
    """Serve ``engine`` on ``listen`` (``host:port``; port 0: any free one), what :meth:`sparkcep.Engine.local`
    calls. Loopback unless the caller opts for an address other hosts reach."""
    host, port = host_port(listen, "OPTION")
    try:
        return Endpoint(engine, host, port, publish=publish)
    except OSError as e:  # a host that does not resolve, a port in use or not ours
        raise EngineError(f"listen={listen!r}: cannot listen there: {e.strerror or e}", "LISTEN_FAILED") from None


def _form(h: dict) -> str:
    """The form of ``$metrics`` a request asks for; ``OPTION`` unless long or wide."""
    form = h.get("form") or "long"
    if form not in ("long", "wide"):
        raise InputError(f"form={form!r} of stream {METRICS}: expected 'long' or 'wide'", "OPTION")
    return form


def _reply_error(conn: socket.socket, e: SparkcepError) -> None:
    send_frame(conn, {"ok": False, "error": {"type": type(e).__name__, "code": e.code, "message": str(e)}})


def _check_positions(stream: str, positions: dict[int, int], earliest: dict[int, int],
                     latest: dict[int, int]) -> None:
    """Positions a reader resumes from must be retained: never clamped, never skipped."""
    for p, pos in sorted(positions.items()):
        if pos < earliest.get(p, 0):
            raise EngineError(f"stream {stream!r} partition {p}: position {pos} was released (every consumer "
                              f"committed past it); the first retained row is at {earliest[p]}. Rows were lost "
                              "to this reader: start it with a new checkpointLocation", "OFFSET_RELEASED")
        if pos > latest.get(p, 0):
            raise EngineError(f"stream {stream!r} partition {p}: position {pos} is past the last row the engine "
                              f"produced ({latest.get(p, 0)}); the positions come from elsewhere", "OFFSET_RANGE")


def _within(batches: list[pa.RecordBatch], budget: int) -> list[pa.RecordBatch]:
    """The leading rows of ``batches`` that fit in ``budget`` bytes (at least one row; 0: no budget)."""
    if not budget:
        return batches
    out, size = [], 0
    for b in batches:
        if size + b.nbytes <= budget:
            out.append(b)
            size += b.nbytes
            continue
        rows = (budget - size) // max(b.nbytes // max(b.num_rows, 1), 1)
        if rows or not out:
            out.append(b.slice(0, max(rows, 1)))
        break
    return out


REPORT_FIGURES = ("bins", "bytes", "steps", "duration_s", "max_latency_ms", "p99_latency_ms", "latency_epochs",
                  "finished")  # of a finished migration's report, in $metrics


def series(m: dict) -> dict:
    """A metrics snapshot with its lists turned into what a time series of numbers can show:
    ``migrations.<query>.<operator>.running.*`` (bins done and planned, steps: the migration under way),
    ``migrations.<query>.<operator>.last.*`` (the figures of the last one finished, ``finished`` its Unix
    time), ``balancer.busy.<im>`` / ``balancer.queued_bytes.<im>`` (each instance manager's busy share and
    input waiting, last sample) and ``balancer.decisions`` / ``balancer.deciding`` (decisions kept, one under
    way: 0 or 1), ``replication.<query>.*`` (replicas running, catching up, failed; failovers and catch-ups
    so far, the last catch-up's duration and bytes)."""
    out = dict(m)
    migrations = {}
    for q, mig in (m.get("migrations") or {}).items():
        ops: dict = {}
        for r in mig.get("finished", []):  # oldest first: the last one of each operator stays
            ops.setdefault(r["operator"], {})["last"] = {k: r[k] for k in REPORT_FIGURES if k in r}
        for r in mig.get("running", []):
            ops.setdefault(r["operator"], {})["running"] = {k: r[k] for k in ("bins", "planned_bins", "steps")
                                                            if r.get(k) is not None}
        if ops:
            migrations[q] = ops
    out["migrations"] = migrations
    replication = {}
    for q, d in (m.get("queries") or {}).items():
        rep = d.get("replication")
        if rep:
            states = [r["state"] for r in rep["replicas"]]
            done = [c for c in rep["catchups"] if "duration_s" in c]
            replication[q] = {"running": states.count("running"), "catching_up": states.count("catching-up"),
                              "failed": states.count("failed"), "failovers": len(rep["failovers"]),
                              "catchups": len(done), **({"last_catchup_s": done[-1]["duration_s"],
                                                        "last_catchup_bytes": done[-1]["bytes"]} if done else {})}
    out["replication"] = replication
    balancer = m.get("balancer")
    if balancer:
        decisions = balancer.get("decisions", [])
        out["balancer"] = {"busy": balancer.get("busy", {}), "queued_bytes": balancer.get("queued_bytes", {}),
                           "decisions": len(decisions),
                           "deciding": sum(1 for d in decisions if d.get("state") == "running")}
    return out


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


def _stored_schema(log_: OutputLog) -> pa.Schema:
    return pa.schema(list(log_.schema) + [pa.field("__seq", pa.int64())])
