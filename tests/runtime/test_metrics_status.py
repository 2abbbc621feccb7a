"""Metrics of a running engine and ``sparkcep status``, checked against what was sent."""

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

import sparkcep as cep


def make():
    q = cep.Query("mq")
    s = q.stream("m_in", "k string, ts timestamp, v int64")
    kept = s.filter(cep.col("v") % 2 == 0, name="even")
    q.output("m_out", kept.aggregate(cep.TimeWindow("1s"), by="k", name="per_k", n=cep.count()))
    return q


def send_all(engine, n=4000, batches=8):
    for b in range(batches):
        lo = b * n // batches
        hi = (b + 1) * n // batches
        engine.send("m_in", {"k": [f"k{i % 5}" for i in range(lo, hi)],
                             "ts": pa.array(np.arange(lo, hi) * 1000, pa.timestamp("us")),
                             "v": np.arange(lo, hi)})
    engine.end("m_in")


@pytest.mark.parametrize("workers", [0, 2])
def test_metrics_count_what_was_sent(workers):
    with cep.Engine.local(workers=workers) as engine:
        engine.deploy(make(), parallelism=2)
        send_all(engine)
        out = engine.collect("m_out")
        m = engine.metrics()
    assert m["sequence"] == 4000 and m["outputs"] == {"m_out": out.num_rows} and m["late"] == {"mq": {"per_k": 0}}
    q = m["queries"]["mq"]
    assert q["rows_in"] == 4000 and q["rows_out"] == out.num_rows == 4 * 5
    assert q["done_epoch"] == q["epoch"] == 9
    sq1, sq2 = q["subqueries"]["SQ1"], q["subqueries"]["SQ2"]
    assert (sq1["rows_in"], sq1["rows_out"]) == (4000, 2000) and sq1["instances"] == 2
    assert (sq2["rows_in"], sq2["rows_out"]) == (2000, 20) and sq2["operators"] == ["per_k"]
    assert q["operators"]["even"]["rows_out"] == 2000 and q["operators"]["per_k"]["rows_in"] == 2000
    for section in (q, sq1, sq2, q["operators"]["per_k"]):
        lat = section["latency_ms"]
        assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p99.9"] < 60_000
    assert q["input_rate"] > 0 and q["throughput"] > 0 and sq1["input_rate"] > 0
    assert all(v == 0 for v in sq1["queue"].values())  # everything consumed
    ims = m["instance_managers"]
    assert len(ims) == workers
    for im in ims.values():
        assert im["alive"] and im["rss_bytes"] > 10 << 20 and im["bytes_in"] > 0 and im["bytes_out"] > 0
        assert im["cpu_percent"] >= 0 and im["instances"] == 2
        # the ~150K objects of numba/pyarrow are frozen out of the GC: no full collection scans them
        assert im["gc"]["frozen_objects"] > 50_000 and im["gc"]["pause_ms_max"] < 50
    json.dumps(m)  # the endpoint ships it as JSON


def test_status_shows_a_running_local_engine(own_home):
    with cep.Engine.local(workers=2) as engine:
        engine.deploy(make(), parallelism=2)
        send_all(engine)
        engine.collect("m_out")
        env = dict(os.environ, SPARKCEP_HOME=str(own_home))
        p = subprocess.run([sys.executable, "-m", "sparkcep.cli", "status"], capture_output=True, text=True,
                           timeout=120, env=env)
        pids = [im["pid"] for im in engine.instance_managers()]
    assert p.returncode == 0, p.stderr
    text = p.stdout
    assert f"engine {engine.endpoint.address} (pid {os.getpid()}): 4,000 tuples in" in text
    assert "instance managers (2):" in text and all(str(pid) in text for pid in pids)
    assert "mq: in 4,000" in text and "out 20" in text
    assert "SQ1 x2 [even]" in text and "SQ2 x2 [per_k]" in text
    assert "instance 1: instance manager im-1 (127.0.0.1:" in text
    assert "output m_out: 20 rows" in text


def test_status_without_an_engine_says_so(own_home):
    env = dict(os.environ, SPARKCEP_HOME=str(own_home / "empty"))
    p = subprocess.run([sys.executable, "-m", "sparkcep.cli", "status"], capture_output=True, text=True,
                       timeout=120, env=env)
    assert p.returncode == 1 and "no local engine is running" in p.stderr
