"""The metric server of the control plane: an engine's metrics as a Prometheus text endpoint.

:class:`EngineCollector` reads a ``metrics()`` dict at each scrape — the one
:meth:`sparkcep.Engine.metrics` returns, or :meth:`EngineClient.metrics
<sparkcep.gateway.client.EngineClient.metrics>` fetched from another
process — and turns it into metric families; :func:`serve` serves them
through ``prometheus_client``'s HTTP server, on a registry of its own, bound
to loopback unless told otherwise. The endpoint has no authentication:
binding an address other hosts reach is an explicit choice.

    >>> server, address = serve(engine.metrics)                     # doctest: +SKIP
    >>> urllib.request.urlopen(f"http://{address}/metrics").read()  # doctest: +SKIP
    b'# HELP sparkcep_up ...'
    >>> server.shutdown()                                           # doctest: +SKIP

Names follow Prometheus' conventions: base units (seconds, bytes), counters
end in ``_total``, rates are gauges ending in ``_per_second``, latency
percentiles are gauges labelled ``quantile``. Labels: ``query``,
``subquery``, ``operator``, ``output``, ``stream``, ``instance_manager``
(its name, e.g. ``im-0``), ``replica``. A figure absent from the dict (an
operator that emits nothing) gives no sample; an instance manager that died
or did not answer in time gives ``sparkcep_instance_manager_up 0`` and its
``info``, no other figure.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sparkcep.arguments import host_port
from sparkcep.errors import EngineError, SparkcepError
from sparkcep.replication.replicas import CATCHING_UP, FAILED, RUNNING
from sparkcep.runtime.metrics import answered

log = logging.getLogger("sparkcep")

GAUGE, COUNTER = GaugeMetricFamily, CounterMetricFamily
QUANTILES = {"p50": "0.5", "p90": "0.9", "p99": "0.99", "p99.9": "0.999"}  # metrics() key -> quantile label
REPLICA_STATES = (RUNNING, CATCHING_UP, FAILED)


class EngineCollector(Collector):
    """A collector calling ``metrics()`` once per scrape (from the server's threads; it must be thread-safe).

    A :class:`~sparkcep.errors.SparkcepError` from ``metrics()`` (the engine is gone) is logged and the
    scrape gives ``sparkcep_up 0`` alone; any other exception is a bug and fails the scrape.
    """

    def __init__(self, metrics: Callable[[], dict]):
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        out = _Families()
        try:
            m = self.metrics()
        except SparkcepError as e:
            log.warning("metric server: cannot read the engine's metrics: %s [%s]", e, e.code)
            m = None
        out(GAUGE, "sparkcep_up", "1 when the engine's metrics were read at this scrape, 0 when that failed",
            {}, m is not None)
        if m is not None:
            _engine(out, m)
        yield from out.families.values()


class MetricsServer:
    """A running metric server: ``address`` is the ``host:port`` it is bound to."""

    def __init__(self, httpd, thread: threading.Thread):
        self._httpd, self._thread = httpd, thread
        host, port = httpd.server_address[:2]
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def shutdown(self) -> None:
        """Stop serving (a scrape under way finishes first) and free the port; safe to call twice."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> "MetricsServer":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def registry(metrics: Callable[[], dict]) -> CollectorRegistry:
    """A registry of its own (not ``prometheus_client``'s global one) holding an :class:`EngineCollector`."""
    reg = CollectorRegistry()
    reg.register(EngineCollector(metrics))
    return reg


def exposition(metrics: Callable[[], dict]) -> str:
    """The Prometheus text of one ``metrics()`` read (what a scrape returns)."""
    return generate_latest(registry(metrics)).decode()


def serve(metrics: Callable[[], dict], listen: str = "127.0.0.1:0") -> tuple[MetricsServer, str]:
    """Serve ``metrics()`` in Prometheus text format at ``http://ADDRESS/metrics`` until ``server.shutdown()``.

    ``listen``: ``HOST:PORT`` to bind (loopback by default; port 0: any free
    port). Returns the server and the address it is bound to. EngineError
    ``BAD_LISTEN`` for an address that does not parse or a host that does not
    resolve, ``LISTEN_FAILED`` when the address cannot be bound (in use, not ours).
    """
    host, port = host_port(listen)
    try:
        httpd, thread = start_http_server(port, addr=host, registry=registry(metrics))
    except socket.gaierror as e:
        raise EngineError(f"listen={listen!r}: host {host!r} does not resolve ({e.strerror})", "BAD_LISTEN") from None
    except OSError as e:
        raise EngineError(f"listen={listen!r}: cannot listen there: {e.strerror or e}", "LISTEN_FAILED") from None
    server = MetricsServer(httpd, thread)
    if not ipaddress.ip_address(httpd.server_address[0].split("%")[0]).is_loopback:
        log.warning("metric server on %s: reachable from other hosts, without authentication", server.address)
    return server, server.address


# --- the mapping: metrics() dict -> families ---------------------------------------------------------
class _Families:
    """The families of one scrape by name, each made at its first sample; ``None`` values give no sample."""

    def __init__(self):
        self.families: dict[str, Metric] = {}

    def __call__(self, kind, name: str, doc: str, labels: dict, value) -> None:
        if value is None:
            return
        fam = self.families.get(name)
        if fam is None:
            fam = self.families[name] = kind(name, doc, labels=list(labels))
        fam.add_metric([str(v) for v in labels.values()], float(value))


def _ms(x):
    """Milliseconds -> seconds (rounded to the nanosecond: no float noise in the text)."""
    return None if x is None else round(x / 1000.0, 9)


def _engine(out: _Families, m: dict) -> None:
    out(COUNTER, "sparkcep_tuples_in_total", "Tuples the engine took in (its last sequence number)", {},
        m.get("sequence"))
    for name, rows in (m.get("outputs") or {}).items():
        out(COUNTER, "sparkcep_output_rows_total", "Rows appended to the log of an output", {"output": name}, rows)
    late = m.get("late") or {}
    for q, ops in late.items():
        for op, n in ops.items():
            out(COUNTER, "sparkcep_late_tuples_total", "Late tuples (behind the watermark) at a stateful operator",
                {"query": q, "operator": op}, n)
    for stream, ops in (m.get("late_by_stream") or {}).items():
        for key, n in ops.items():  # key: "query.operator"
            q = max((q for q in late if key.startswith(q + ".")), key=len, default="")
            out(COUNTER, "sparkcep_stream_late_tuples_total", "Late tuples per input stream and stateful operator",
                {"stream": stream, "query": q, "operator": key[len(q) + 1:] if q else key}, n)
    for q, d in (m.get("queries") or {}).items():
        _query(out, q, d)
    for name, im in _by_name(m.get("instance_managers") or {}).items():
        _instance_manager(out, name, im)
    for q, mig in (m.get("migrations") or {}).items():
        _migrations(out, q, mig)
    _balancer(out, m.get("balancer"))
    _endpoint(out, m.get("endpoint"))


def _rows(out: _Families, level: str, labels: dict, d: dict) -> None:
    """Rows in/out, their rates and latency percentiles of one query, sub-query or operator."""
    p = f"sparkcep_{level}"
    out(COUNTER, f"{p}_rows_in_total", f"Rows that entered the {level}", labels, d.get("rows_in"))
    out(COUNTER, f"{p}_rows_out_total", f"Rows that left the {level}", labels, d.get("rows_out"))
    out(GAUGE, f"{p}_input_rate_rows_per_second", f"Rows in per second over the last few seconds, {level}",
        labels, d.get("input_rate"))
    out(GAUGE, f"{p}_throughput_rows_per_second", f"Rows out per second over the last few seconds, {level}",
        labels, d.get("throughput"))
    _latency(out, f"{p}_latency_seconds", f"Latency percentiles, arrival at the engine to leaving the {level}",
             labels, d.get("latency_ms"))
    queue = d.get("queue")
    if queue is not None:
        for kind in ("input", "backlog"):
            out(GAUGE, f"{p}_queue_bytes", f"Bytes queued for the {level}: in its input channels (queue=input), "
                "held by writers under back-pressure (queue=backlog)", {**labels, "queue": kind},
                queue.get(f"{kind}_bytes"))
        out(GAUGE, f"{p}_stashed_rows", f"Rows the {level} holds back until their epoch or bin is ready",
            labels, queue.get("stashed_rows"))


def _latency(out: _Families, name: str, doc: str, labels: dict, pct: dict | None) -> None:
    for key, quantile in QUANTILES.items():
        out(GAUGE, name, doc, {**labels, "quantile": quantile}, _ms((pct or {}).get(key)))


def _query(out: _Families, q: str, d: dict) -> None:
    labels = {"query": q}
    _rows(out, "query", labels, d)
    out(GAUGE, "sparkcep_query_epoch", "Last epoch the query's sources closed", labels, d.get("epoch"))
    out(GAUGE, "sparkcep_query_done_epoch", "Last epoch whose results all left the query", labels,
        d.get("done_epoch"))
    for name, o in (d.get("outputs") or {}).items():
        ol = {"query": q, "output": name}
        out(COUNTER, "sparkcep_query_output_rows_total", "Rows the query's sink delivered to an output", ol,
            o.get("rows"))
        _latency(out, "sparkcep_query_output_latency_seconds", "Latency percentiles of an output's rows", ol,
                 o.get("latency_ms"))
    for name, s in (d.get("subqueries") or {}).items():
        sl = {"query": q, "subquery": name}
        _rows(out, "subquery", sl, s)
        out(GAUGE, "sparkcep_subquery_instances", "Instances of the sub-query", sl, s.get("instances"))
        out(COUNTER, "sparkcep_subquery_busy_seconds_total", "Time the sub-query's instances spent working", sl,
            s.get("busy_s"))
        out(GAUGE, "sparkcep_subquery_epoch", "Last epoch every instance of the sub-query closed", sl,
            s.get("epoch"))
    for name, o in (d.get("operators") or {}).items():
        _rows(out, "operator", {"query": q, "subquery": o.get("subquery", ""), "operator": name}, o)
    if d.get("replication"):
        _replication(out, q, d["replication"])


_IM = (  # (name, type, help, path in the instance manager's section, scale)
    ("sparkcep_instance_manager_cpu_percent", GAUGE, "CPU use over the last few seconds, percent of one core",
     ("cpu_percent",), 1),
    ("sparkcep_instance_manager_cpu_seconds_total", COUNTER, "CPU time used", ("cpu_s",), 1),
    ("sparkcep_instance_manager_rss_bytes", GAUGE, "Resident memory", ("rss_bytes",), 1),
    ("sparkcep_instance_manager_received_bytes_total", COUNTER, "Bytes received on channels", ("bytes_in",), 1),
    ("sparkcep_instance_manager_sent_bytes_total", COUNTER, "Bytes sent on channels", ("bytes_out",), 1),
    ("sparkcep_instance_manager_received_bytes_per_second", GAUGE, "Bytes received per second, last few seconds",
     ("bytes_in_rate",), 1),
    ("sparkcep_instance_manager_sent_bytes_per_second", GAUGE, "Bytes sent per second, last few seconds",
     ("bytes_out_rate",), 1),
    ("sparkcep_instance_manager_instances", GAUGE, "Sub-query instances it runs", ("instances",), 1),
    ("sparkcep_instance_manager_refused_connections_total", COUNTER, "Connections refused (bad token)",
     ("refused_connections",), 1),
    ("sparkcep_instance_manager_gc_collections_total", COUNTER, "Python GC collections", ("gc", "collections"), 1),
    ("sparkcep_instance_manager_gc_pause_seconds_total", COUNTER, "Time paused in Python GC",
     ("gc", "pause_ms_total"), 1e-3),
    ("sparkcep_instance_manager_gc_pause_max_seconds", GAUGE, "Longest Python GC pause", ("gc", "pause_ms_max"), 1e-3),
    ("sparkcep_instance_manager_gc_frozen_objects", GAUGE, "Objects frozen out of the Python GC",
     ("gc", "frozen_objects"), 1),
)


def _by_name(ims: dict) -> dict[str, dict]:
    """The instance managers by name, one each: of several of a name (a worker restarted under its name),
    the live one, else the last."""
    out: dict[str, dict] = {}
    for key, im in sorted(ims.items(), key=lambda kv: int(kv[0])):  # keys are str after JSON
        name = im.get("name", str(key))
        if im.get("alive") or not out.get(name, {}).get("alive"):
            out[name] = im
    return out


def _instance_manager(out: _Families, name: str, im: dict) -> None:
    labels = {"instance_manager": name}
    out(GAUGE, "sparkcep_instance_manager_info", "Where an instance manager runs (value 1)",
        {**labels, "address": im.get("address", ""), "pid": im.get("pid", ""), "cpu": im.get("cpu", ""),
         "node": im.get("node", "")}, 1)
    up = bool(im.get("alive")) and answered(im)
    out(GAUGE, "sparkcep_instance_manager_up", "1 while the instance manager lives and answers, 0 once it died or "
        "when it did not answer the metrics request in time (then it gives no other figure)", labels, up)
    if not up:
        return
    for metric, kind, doc, path, scale in _IM:
        value = im
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        out(kind, metric, doc, labels, None if value is None else value * scale)


def _migrations(out: _Families, q: str, mig: dict) -> None:
    finished = mig.get("finished") or []
    for kind in sorted({r["kind"] for r in finished}):
        out(COUNTER, "sparkcep_migrations_total", "Finished migrations (move, migrate, rescale) in the engine's "
            "report history, which keeps the last 256", {"query": q, "kind": kind},
            sum(r["kind"] == kind for r in finished))
    last = {r["operator"]: r for r in finished}  # the latest report per operator
    for op, r in last.items():
        labels = {"query": q, "operator": op}
        out(GAUGE, "sparkcep_migration_last_duration_seconds", "Duration of the operator's last migration", labels,
            r.get("duration_s"))
        out(GAUGE, "sparkcep_migration_last_bins", "Bins the operator's last migration moved", labels, r.get("bins"))
        out(GAUGE, "sparkcep_migration_last_bytes", "State bytes the operator's last migration moved", labels,
            r.get("bytes"))
        out(GAUGE, "sparkcep_migration_last_max_latency_seconds", "Highest epoch latency during the operator's "
            "last migration", labels, _ms(r.get("max_latency_ms")))
    for w in mig.get("running") or []:
        labels = {"query": q, "operator": w["operator"], "kind": w["kind"], "strategy": w["strategy"]}
        out(GAUGE, "sparkcep_migration_running_bins", "Bins moved so far by a migration under way", labels,
            w.get("bins"))
        out(GAUGE, "sparkcep_migration_running_planned_bins", "Bins a migration under way plans to move", labels,
            w.get("planned_bins"))


def _balancer(out: _Families, b: dict | None) -> None:
    if not b:
        return
    for name, share in (b.get("busy") or {}).items():
        out(GAUGE, "sparkcep_balancer_busy_ratio", "Busy share of an instance manager over the balancer's last "
            "interval (0-1)", {"instance_manager": name}, share)
    decisions = b.get("decisions") or []
    out(GAUGE, "sparkcep_balancer_deciding", "1 while a balancer decision is carried out", {},
        any(d.get("state") == "running" for d in decisions))
    counts: dict[tuple, int] = {}
    for d in decisions:
        key = (d.get("query", ""), d.get("action", ""))
        counts[key] = counts.get(key, 0) + 1
    for (q, action), n in sorted(counts.items()):
        out(COUNTER, "sparkcep_balancer_decisions_total", "Balancer decisions in its history, which keeps the "
            "last 128", {"query": q, "action": action}, n)


def _replication(out: _Families, q: str, rep: dict) -> None:
    for r in rep.get("replicas") or []:
        for state in REPLICA_STATES:
            out(GAUGE, "sparkcep_replica_state", "1 for the state a replica is in (running, catching-up, failed)",
                {"query": q, "replica": r["replica"], "state": state}, r["state"] == state)
    dedup = rep.get("dedup") or {}
    labels = {"query": q}
    out(COUNTER, "sparkcep_replication_dedup_dropped_rows_total", "Rows of second copies the dedup sink dropped",
        labels, dedup.get("dropped_rows"))
    out(GAUGE, "sparkcep_replication_published_epoch", "Last epoch the dedup sink published", labels,
        dedup.get("published_epoch"))
    out(GAUGE, "sparkcep_replication_held_rows", "Rows the dedup sink holds", labels, dedup.get("held_rows"))
    replicas = [r["replica"] for r in rep.get("replicas") or []]
    first = {str(r): n for r, n in (dedup.get("first_copies") or {}).items()}  # keys are str after JSON
    lag = {str(r): n for r, n in (dedup.get("lag_epochs") or {}).items()}
    for r in replicas:
        out(COUNTER, "sparkcep_replication_first_copies_total", "Epochs a replica delivered first (published)",
            {"query": q, "replica": r}, first.get(str(r), 0))
        out(GAUGE, "sparkcep_replication_lag_epochs", "Epochs a replica's sink is behind the published one",
            {"query": q, "replica": r}, lag.get(str(r)))
    for name, events, doc in (("failovers", rep.get("failovers") or [], "Failures of a replica"),
                              ("catchups", rep.get("catchups") or [], "Catch-ups (rebuilds) of a replica, ended"),
                              ("catchup_errors", [c for c in rep.get("catchups") or [] if "error" in c],
                               "Catch-ups of a replica that failed")):
        for r in replicas:
            out(COUNTER, f"sparkcep_replication_{name}_total", doc, {"query": q, "replica": r},
                sum(e.get("replica") == r for e in events))
    done = {c["replica"]: c for c in rep.get("catchups") or [] if "error" not in c}
    for r, c in done.items():
        labels = {"query": q, "replica": r}
        out(GAUGE, "sparkcep_replication_last_catchup_seconds", "Duration of a replica's last catch-up", labels,
            c.get("duration_s"))
        out(GAUGE, "sparkcep_replication_last_catchup_bytes", "State bytes copied by a replica's last catch-up",
            labels, c.get("bytes"))


_ENDPOINT_COUNTERS = ("requests", "rows_in", "rows_out", "unauthenticated", "bad_frames", "batch_commits",
                      "committed_partitions", "duplicate_batches", "duplicate_sends")


def _endpoint(out: _Families, e: dict | None) -> None:
    """The engine endpoint's counters, present when the metrics came through it (``EngineClient.metrics()``)."""
    if not e:
        return
    for key in _ENDPOINT_COUNTERS:
        out(COUNTER, f"sparkcep_endpoint_{key}_total", f"Engine endpoint: {key.replace('_', ' ')}", {}, e.get(key))
    out(GAUGE, "sparkcep_endpoint_staged_rows", "Engine endpoint: rows of sends staged, not committed yet", {},
        e.get("staged_rows"))
    out(GAUGE, "sparkcep_endpoint_retained_rows", "Engine endpoint: rows retained in the output logs", {},
        e.get("retained_rows"))
