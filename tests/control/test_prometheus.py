"""The Prometheus metric server: what a scrape of /metrics shows equals ``engine.metrics()`` read around it.

Engines: one in-process (a query rescaled live, for the migration figures); one
with two instance managers and a standby, running a query with two replicas
whose second replica's instance manager is SIGKILLed (failover, catch-up, a dead
instance manager), then a plain query. Sends stop before the reads, so every
counter must match exactly; only CPU, memory and rates may move between reads.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import time
import urllib.error
import urllib.request

import numpy as np
import psutil
import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

import sparkcep as cep
from sparkcep import auth
from sparkcep.control import metrics_cli
from sparkcep.gateway.client import EngineClient
from sparkcep.control.prometheus import exposition, serve
from sparkcep.errors import EngineError

QUANTILES = {"0.5": "p50", "0.9": "p90", "0.99": "p99", "0.999": "p99.9"}
UP = ("sparkcep_up", frozenset())


def make(name: str) -> cep.Query:
    q = cep.Query(name)
    s = q.stream(f"{name}_in", "k string, ts timestamp, v int64")
    kept = s.filter(cep.col("v") % 2 == 0, name="even")
    q.output(f"{name}_out", kept.aggregate(cep.TimeWindow("1s"), by="k", name="per_k", n=cep.count()))
    return q


def send(engine, name: str, lo: int, hi: int, batches: int = 4) -> None:
    for b in range(batches):
        a, z = lo + b * (hi - lo) // batches, lo + (b + 1) * (hi - lo) // batches
        engine.send(f"{name}_in", {"k": [f"k{i % 5}" for i in range(a, z)],
                                   "ts": pa.array(np.arange(a, z) * 1000, pa.timestamp("us")), "v": np.arange(a, z)})


# --- what the endpoint must show, read straight off metrics() -------------------------------------------
def expected(m: dict) -> dict:
    """Every sample the endpoint must carry for the metrics dict ``m``: {(name, labels): value}."""
    e = {}

    def put(name, value, **labels):
        if value is not None:
            e[name, frozenset((k, str(v)) for k, v in labels.items())] = float(value)

    def latency(name, pct, **labels):
        for quantile, key in QUANTILES.items():
            put(name, pct[key] / 1000 if key in (pct or {}) else None, quantile=quantile, **labels)

    def rows(level, d, **labels):
        p = f"sparkcep_{level}"
        put(f"{p}_rows_in_total", d.get("rows_in"), **labels)
        put(f"{p}_rows_out_total", d.get("rows_out"), **labels)
        put(f"{p}_input_rate_rows_per_second", d.get("input_rate"), **labels)
        put(f"{p}_throughput_rows_per_second", d.get("throughput"), **labels)
        latency(f"{p}_latency_seconds", d.get("latency_ms"), **labels)
        if "queue" in d:
            put(f"{p}_queue_bytes", d["queue"]["input_bytes"], queue="input", **labels)
            put(f"{p}_queue_bytes", d["queue"]["backlog_bytes"], queue="backlog", **labels)
            put(f"{p}_stashed_rows", d["queue"]["stashed_rows"], **labels)

    put("sparkcep_tuples_in_total", m["sequence"])
    for out, n in m["outputs"].items():
        put("sparkcep_output_rows_total", n, output=out)
    for q, ops in m["late"].items():
        for op, n in ops.items():
            put("sparkcep_late_tuples_total", n, query=q, operator=op)
    for stream, ops in m["late_by_stream"].items():
        for key, n in ops.items():
            q, op = key.split(".", 1)
            put("sparkcep_stream_late_tuples_total", n, stream=stream, query=q, operator=op)
    for q, d in m["queries"].items():
        rows("query", d, query=q)
        put("sparkcep_query_epoch", d["epoch"], query=q)
        put("sparkcep_query_done_epoch", d["done_epoch"], query=q)
        for out, o in d["outputs"].items():
            put("sparkcep_query_output_rows_total", o["rows"], query=q, output=out)
            latency("sparkcep_query_output_latency_seconds", o["latency_ms"], query=q, output=out)
        for sq, s in d["subqueries"].items():
            rows("subquery", s, query=q, subquery=sq)
            put("sparkcep_subquery_instances", s["instances"], query=q, subquery=sq)
            put("sparkcep_subquery_busy_seconds_total", s["busy_s"], query=q, subquery=sq)
            put("sparkcep_subquery_epoch", s["epoch"], query=q, subquery=sq)
        for op, o in d["operators"].items():
            rows("operator", o, query=q, subquery=o["subquery"], operator=op)
        rep = d.get("replication")
        if rep:
            dedup = rep["dedup"]
            put("sparkcep_replication_dedup_dropped_rows_total", dedup["dropped_rows"], query=q)
            put("sparkcep_replication_published_epoch", dedup["published_epoch"], query=q)
            put("sparkcep_replication_held_rows", dedup["held_rows"], query=q)
            for r in (x["replica"] for x in rep["replicas"]):
                state = rep["replicas"][r]["state"]
                for s in ("running", "catching-up", "failed"):
                    put("sparkcep_replica_state", state == s, query=q, replica=r, state=s)
                first = {str(k): v for k, v in dedup["first_copies"].items()}
                put("sparkcep_replication_first_copies_total", first.get(str(r), 0), query=q, replica=r)
                put("sparkcep_replication_lag_epochs", {str(k): v for k, v in dedup["lag_epochs"].items()}[str(r)],
                    query=q, replica=r)
                put("sparkcep_replication_failovers_total", sum(f["replica"] == r for f in rep["failovers"]),
                    query=q, replica=r)
                mine = [c for c in rep["catchups"] if c["replica"] == r]
                put("sparkcep_replication_catchups_total", len(mine), query=q, replica=r)
                put("sparkcep_replication_catchup_errors_total", sum("error" in c for c in mine), query=q, replica=r)
                if mine and "error" not in mine[-1]:
                    put("sparkcep_replication_last_catchup_seconds", mine[-1]["duration_s"], query=q, replica=r)
                    put("sparkcep_replication_last_catchup_bytes", mine[-1]["bytes"], query=q, replica=r)
    for im in m["instance_managers"].values():
        n, gc = im["name"], im.get("gc", {})
        put("sparkcep_instance_manager_info", 1, instance_manager=n, address=im["address"], pid=im["pid"],
            cpu=im["cpu"], node=im["node"])
        up = im["alive"] and "cpu_s" in im  # dead, or no answer: no figure
        put("sparkcep_instance_manager_up", up, instance_manager=n)
        if not up:
            continue
        for name, value in {"cpu_percent": im.get("cpu_percent"), "cpu_seconds_total": im.get("cpu_s"),
                            "rss_bytes": im.get("rss_bytes"), "received_bytes_total": im.get("bytes_in"),
                            "sent_bytes_total": im.get("bytes_out"),
                            "received_bytes_per_second": im.get("bytes_in_rate"),
                            "sent_bytes_per_second": im.get("bytes_out_rate"), "instances": im.get("instances"),
                            "refused_connections_total": im.get("refused_connections"),
                            "gc_collections_total": gc.get("collections"),
                            "gc_pause_seconds_total": gc["pause_ms_total"] / 1000 if gc else None,
                            "gc_pause_max_seconds": gc["pause_ms_max"] / 1000 if gc else None,
                            "gc_frozen_objects": gc.get("frozen_objects")}.items():
            put(f"sparkcep_instance_manager_{name}", value, instance_manager=n)
    for q, mig in m["migrations"].items():
        for kind in {r["kind"] for r in mig["finished"]}:
            put("sparkcep_migrations_total", sum(r["kind"] == kind for r in mig["finished"]), query=q, kind=kind)
        for r in mig["finished"]:  # the last report of each operator wins
            put("sparkcep_migration_last_duration_seconds", r["duration_s"], query=q, operator=r["operator"])
            put("sparkcep_migration_last_bins", r["bins"], query=q, operator=r["operator"])
            put("sparkcep_migration_last_bytes", r["bytes"], query=q, operator=r["operator"])
            put("sparkcep_migration_last_max_latency_seconds", r["max_latency_ms"] / 1000, query=q,
                operator=r["operator"])
        assert not mig["running"]
    assert m["balancer"] is None
    for key, value in (m.get("endpoint") or {}).items():  # present when read through the engine's endpoint
        gauge = key in ("staged_rows", "retained_rows")
        put(f"sparkcep_endpoint_{key}" if gauge else f"sparkcep_endpoint_{key}_total", value)
    return e


# figures that move between two reads even with nothing sent: checked for sense, not equality
MONOTONIC = ("_cpu_seconds_total", "_gc_collections_total", "_gc_pause_seconds_total")
MOVING = ("_per_second", "_cpu_percent", "_rss_bytes", "_gc_pause_max_seconds", "_gc_frozen_objects")


def scrape(address: str) -> tuple[dict, dict]:
    """The samples of ``http://address/metrics`` {(name, labels): value} and each family's type."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=30) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    samples, types = {}, {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in samples, f"sample {key} twice"
            samples[key], types[s.name] = s.value, fam.type
    return samples, types


def assert_same(read, metrics=None) -> dict:
    """Scrape a server on ``metrics`` (default ``read``) between two calls of ``read``; return the samples."""
    before = expected(read())
    server, address = serve(metrics or read)
    try:
        got, types = scrape(address)
    finally:
        server.shutdown()
    after = expected(read())
    assert got.pop(UP) == 1.0
    assert set(got) == set(before) == set(after), (sorted(set(got) ^ set(before)), sorted(set(before) ^ set(after)))
    for (name, labels), value in got.items():
        key, where = (name, labels), f"{name}{dict(labels)}"
        assert types[name] == ("counter" if name.endswith("_total") else "gauge"), where
        if name.endswith(MONOTONIC) or name.startswith("sparkcep_endpoint_"):
            assert before[key] <= value <= after[key], (where, before[key], value, after[key])
        elif name.endswith(MOVING):
            assert value >= 0 and (not name.endswith("_rss_bytes") or before[key] / 2 < value < before[key] * 2), where
        else:
            assert value in (pytest.approx(before[key], abs=1e-9), pytest.approx(after[key], abs=1e-9)), \
                (where, before[key], value, after[key])
    return got


def value(samples: dict, name: str, **labels) -> float:
    return samples[name, frozenset(labels.items())]


# --- engines ------------------------------------------------------------------------------------------
def test_in_process_engine_with_a_migration():
    with cep.Engine.local() as engine:
        dep = engine.deploy(make("pq"), parallelism=2, bins=16)
        send(engine, "pq", 0, 2000)
        report = dep.rescale("per_k", 3)
        send(engine, "pq", 2000, 4000)
        engine.end("pq_in")
        out = engine.collect("pq_out")
        got = assert_same(engine.metrics)
    # a few figures against what was sent, not only against metrics()
    assert value(got, "sparkcep_query_rows_in_total", query="pq") == 4000
    assert value(got, "sparkcep_query_rows_out_total", query="pq") == out.num_rows == 20
    # (not SQ1's counters: the rescale's generation switch restarted them; the counters of SQ2 went on)
    assert value(got, "sparkcep_operator_rows_out_total", query="pq", subquery="SQ2", operator="per_k") == 20
    assert value(got, "sparkcep_subquery_instances", query="pq", subquery="SQ2") == 3
    assert value(got, "sparkcep_migrations_total", query="pq", kind="rescale") == 1
    assert value(got, "sparkcep_migration_last_bins", query="pq", operator="per_k") == report["bins"] > 0
    assert 0 < value(got, "sparkcep_operator_latency_seconds", query="pq", subquery="SQ2", operator="per_k",
                     quantile="0.5") < 60


def wait_for(check, what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} after {timeout} s"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def workers_engine():
    """Two instance managers and a standby: ``rq`` with two replicas, replica 1's instance manager SIGKILLed
    midway and rebuilt on the standby; then ``pq`` on the live ones. Yields (engine, name of the dead one)."""
    with cep.Engine.local(workers=2, standby=1) as engine:
        rdep = engine.deploy(make("rq"), parallelism=1, replicas=2)
        send(engine, "rq", 0, 2000)
        victim = next(im for im in engine.instance_managers() if im.get("replica") == 1 and im["instances"])
        os.kill(victim["pid"], signal.SIGKILL)
        send(engine, "rq", 2000, 3000)
        wait_for(lambda: engine.metrics()["queries"]["rq"]["replication"]["catchups"], "no catch-up")
        wait_for(lambda: all(r["state"] == "running" for r in rdep.replicas()), "replica 1 not running")
        send(engine, "rq", 3000, 4000)
        engine.end("rq_in")
        engine.collect("rq_out")
        engine.deploy(make("pq"), parallelism=2)
        send(engine, "pq", 0, 4000)
        engine.end("pq_in")
        engine.collect("pq_out")
        yield engine, victim["name"]


def test_workers_replicas_and_a_dead_instance_manager(workers_engine):
    engine, dead = workers_engine
    got = assert_same(engine.metrics)
    names = {im["name"] for im in engine.instance_managers()}
    assert {labels for (n, labels) in got if n == "sparkcep_instance_manager_up"} == \
        {frozenset({("instance_manager", n)}) for n in names} and len(names) == 3
    assert value(got, "sparkcep_instance_manager_up", instance_manager=dead) == 0
    live = sorted(names - {dead})
    for n in live:
        assert value(got, "sparkcep_instance_manager_rss_bytes", instance_manager=n) > 10 << 20
        assert value(got, "sparkcep_instance_manager_received_bytes_total", instance_manager=n) > 0
    assert value(got, "sparkcep_query_rows_in_total", query="pq") == 4000
    assert value(got, "sparkcep_output_rows_total", output="rq_out") == 20  # once, not once per replica
    for r in ("0", "1"):
        assert value(got, "sparkcep_replica_state", query="rq", replica=r, state="running") == 1
        assert value(got, "sparkcep_replica_state", query="rq", replica=r, state="failed") == 0
    assert value(got, "sparkcep_replication_failovers_total", query="rq", replica="1") == 1
    assert value(got, "sparkcep_replication_failovers_total", query="rq", replica="0") == 0
    assert value(got, "sparkcep_replication_catchups_total", query="rq", replica="1") == 1
    assert value(got, "sparkcep_replication_last_catchup_bytes", query="rq", replica="1") > 0
    assert value(got, "sparkcep_replication_dedup_dropped_rows_total", query="rq") > 0


def test_metrics_fetched_from_another_process_through_the_endpoint(workers_engine):
    """What ``EngineClient.metrics()`` returns went through JSON (str keys) and carries the endpoint's counters."""
    engine, _ = workers_engine
    with EngineClient(engine.endpoint.address, token=engine.token) as reader, \
            EngineClient(engine.endpoint.address, token=engine.token) as scraped:
        got = assert_same(reader.metrics, scraped.metrics)
    assert value(got, "sparkcep_endpoint_requests_total") >= 1
    assert value(got, "sparkcep_instance_manager_instances", instance_manager="im-2") >= 1  # the rebuilt replica


def test_sparkcep_metrics_prints_the_text_of_an_engine(workers_engine, tmp_path, capsys):
    engine, _ = workers_engine
    token_file = auth.write(tmp_path / "token", engine.token)
    parser = argparse.ArgumentParser()
    metrics_cli.add_arguments(parser)
    assert metrics_cli.run(parser.parse_args(["--engine", engine.endpoint.address,
                                              "--token-file", str(token_file)])) == 0
    families = {f.name: f for f in text_string_to_metric_families(capsys.readouterr().out)}
    assert families["sparkcep_query_rows_in"].type == "counter"
    assert {s.labels["query"]: s.value for s in families["sparkcep_query_rows_in"].samples} == \
        {"rq": 4000, "pq": 4000}
    (tmp_path / "wrong").write_text("not-the-token\n")
    assert metrics_cli.run(parser.parse_args(["--engine", engine.endpoint.address,
                                              "--token-file", str(tmp_path / "wrong")])) == 1
    assert "[UNAUTHENTICATED]" in capsys.readouterr().err


# --- the server -----------------------------------------------------------------------------------------
def other_address() -> str | None:
    """An IPv4 address of this machine that is not loopback, if it has one."""
    return next((a.address for addrs in psutil.net_if_addrs().values() for a in addrs
                 if a.family == socket.AF_INET and not a.address.startswith("127.")), None)


def test_binds_loopback_only_by_default():
    server, address = serve(lambda: {})
    try:
        host, port = address.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
        assert scrape(address)[0] == {UP: 1.0}
        other = other_address()
        if other is not None:
            with pytest.raises(OSError):
                socket.create_connection((other, int(port)), timeout=5).close()
    finally:
        server.shutdown()
    with pytest.raises(urllib.error.URLError):  # stopped: the port is closed
        scrape(address)


def test_serves_other_hosts_when_told(caplog):
    other = other_address()
    if other is None:
        pytest.skip("no address but loopback on this machine")
    with caplog.at_level("WARNING", "sparkcep"):
        server, address = serve(lambda: {}, "0.0.0.0:0")
    with server:
        assert address.startswith("0.0.0.0:")
        assert scrape(f"{other}:{address.rsplit(':', 1)[1]}")[0] == {UP: 1.0}
    assert "reachable from other hosts, without authentication" in caplog.text


@pytest.mark.parametrize("listen", ["127.0.0.1", "127.0.0.1:", ":9464", "127.0.0.1:94x4", "127.0.0.1:70000",
                                    "127.0.0.1:-1", "localhots:0", "127.0.0.300:0", "", None])
def test_a_misspelled_listen_address_fails_clearly(listen):
    with pytest.raises(EngineError) as e:
        serve(lambda: {}, listen)
    assert e.value.code == "BAD_LISTEN" and repr(listen) in str(e.value)


def test_an_address_in_use_fails_clearly():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(EngineError) as e:
            serve(lambda: {}, f"127.0.0.1:{port}")
    assert e.value.code == "LISTEN_FAILED" and str(port) in str(e.value)


def test_an_engine_out_of_reach_gives_up_0():
    def gone():
        raise EngineError("engine at 127.0.0.1:1 is unreachable (metrics)", "ENGINE_NOT_FOUND")

    assert [line for line in exposition(gone).splitlines() if not line.startswith("#")] == ["sparkcep_up 0.0"]


def test_a_migration_under_way_and_the_balancer():
    """Figures the engines above do not reach (caught mid-flight, or with balance=True): a dict of their shape."""
    m = {"migrations": {"q": {"finished": [], "running": [{"operator": "agg", "kind": "migrate",
                                                           "strategy": "fluid", "bins": 3, "planned_bins": 8,
                                                           "steps": 3}]}},
         "balancer": {"busy": {"im-0": 0.75}, "watched": ["q"],
                      "decisions": [{"query": "q", "operator": "agg", "action": "migrate", "state": "done"},
                                    {"query": "q", "operator": "agg", "action": "migrate", "state": "running"}]}}
    got = {(s.name, frozenset(s.labels.items())): s.value
           for f in text_string_to_metric_families(exposition(lambda: m)) for s in f.samples}
    running = {"query": "q", "operator": "agg", "kind": "migrate", "strategy": "fluid"}
    assert got == {UP: 1.0,
                   ("sparkcep_migration_running_bins", frozenset(running.items())): 3.0,
                   ("sparkcep_migration_running_planned_bins", frozenset(running.items())): 8.0,
                   ("sparkcep_balancer_busy_ratio", frozenset({("instance_manager", "im-0")})): 0.75,
                   ("sparkcep_balancer_deciding", frozenset()): 1.0,
                   ("sparkcep_balancer_decisions_total", frozenset({("query", "q"), ("action", "migrate")})): 2.0}


def test_an_instance_manager_restarted_under_its_name_is_one_series(tmp_path):
    """A worker killed and started again under its name, as a supervisor does: the engine keeps a record of
    the dead one beside the live one, and each series appeared twice (up 0 and up 1), which Prometheus
    refuses. The live one's series stand alone."""
    import subprocess
    import sys

    from sparkcep.runtime.worker_start import Starting, wait_ready

    def worker(token_file) -> tuple[subprocess.Popen, str]:
        p = subprocess.Popen([sys.executable, "-m", "sparkcep", "worker", "--listen", "127.0.0.1:0", "--name", "w1",
                              "--token-file", str(token_file)], stdout=subprocess.PIPE)
        (info,) = wait_ready([Starting(p, "w1")])
        return p, info["address"]

    with cep.Engine.local() as engine:
        token_file = auth.write(tmp_path / "token", engine.token)
        first, address = worker(token_file)
        engine.add_instance_manager(address)
        first.kill()
        first.wait(10)
        first.stdout.close()
        wait_for(lambda: not engine.instance_managers()[0]["alive"], "the killed worker not seen dead")
        second, address = worker(token_file)
        try:
            engine.add_instance_manager(address)
            assert [(im["name"], im["alive"]) for im in engine.instance_managers()] == [("w1", False), ("w1", True)]
            server, where = serve(engine.metrics)
            try:
                got, _ = scrape(where)  # fails on a series given twice
            finally:
                server.shutdown()
        finally:
            second.terminate()
            second.wait(10)
            second.stdout.close()
    assert value(got, "sparkcep_instance_manager_up", instance_manager="w1") == 1
    assert value(got, "sparkcep_instance_manager_rss_bytes", instance_manager="w1") > 10 << 20
    assert [dict(labels)["pid"] for name, labels in got if name == "sparkcep_instance_manager_info"] == \
        [str(second.pid)]
