"""Bounds before allocation: a count the machine cannot hold is refused at once with CAPACITY, naming the
limit and the figures, before anything is allocated; the engine goes on serving.

``dep.rescale("agg", instances=1000)`` on two workers with 4096 bins asked for 3,002 rings of 16 MiB and
filled /dev/shm with 23 GB until the kernel killed the engine: it passes the rule that an instance owns at
least one bin, so the shared-memory bound must catch it. (Not run against the code without the bound: it
would fill this machine's /dev/shm again.)
"""

from __future__ import annotations

import os
import time

import numpy as np
import psutil
import pytest

import sparkcep as cep
from sparkcep.core.operators import physical
from sparkcep.query.planner import plan
from sparkcep.runtime import capacity
from sparkcep.runtime.layout import Layout

MB = 1 << 20


def query(name: str) -> cep.Query:
    q = cep.Query(name)
    s = q.stream(f"{name}_in", "k int64, ts timestamp, v int64")
    q.output(f"{name}_out", s.filter(cep.col("v") >= 0, name="keep")
             .aggregate(cep.TimeWindow("1s"), by="k", name="agg", n=cep.count(), total=cep.sum("v")))
    return q


def send(engine, name: str, i: int) -> None:
    k = np.arange(200) % 37
    engine.send(f"{name}_in", {"k": k, "ts": np.full(200, i * 500_000, "datetime64[us]"), "v": k + i})


def per_key(table) -> dict:
    return {(r["window_start"], r["k"]): (r["n"], r["total"]) for r in table.to_pylist()}


def shm_used() -> int:
    st = os.statvfs("/dev/shm")
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def refused(call, code: str = "CAPACITY") -> cep.SparkcepError:
    """``call()`` raises ``code`` within a second, the process and /dev/shm grown by under 100 MB."""
    rss, shm, t0 = psutil.Process().memory_info().rss, shm_used(), time.monotonic()
    with pytest.raises(cep.SparkcepError) as e:
        call()
    took = time.monotonic() - t0
    assert e.value.code == code, e.value
    assert took < 1.0, f"refused after {took:.2f} s"
    assert psutil.Process().memory_info().rss - rss < 100 * MB
    assert shm_used() - shm < 100 * MB
    return e.value


@pytest.mark.parametrize("workers", [2, 0])
def test_a_rescale_the_machine_cannot_hold_is_refused_and_the_engine_goes_on(workers):
    name = f"cap{workers}"
    with cep.Engine.local(workers=workers) as engine:
        dep = engine.deploy(query(name), parallelism=2, bins=4096 if workers else 16384)
        send(engine, name, 0)
        # on workers: 2 + 2 x 1000 + 1000 rings of 16 MiB; in the process: 16,000 window tables of 16,384 bins
        asked = 1000 if workers else 16000
        error = refused(lambda: dep.rescale("agg", instances=np.int64(asked)))
        assert f"to {asked} instances" in str(error)
        assert ("/dev/shm" if workers else "memory") in str(error) and "free" in str(error), error
        assert dep.parallelism == {"SQ1": 2, "SQ2": 2} and dep.migrations()["finished"] == []
        refused(lambda: dep.rescale("agg", instances=100_000), "TOO_MANY_INSTANCES")
        send(engine, name, 1)
        assert dep.rescale("agg", instances=3)["bins"] > 0
        send(engine, name, 2)
        engine.end(f"{name}_in")
        got = engine.collect(f"{name}_out")
    with cep.Engine.local() as ref:
        ref.deploy(query(name))
        for i in range(3):
            send(ref, name, i)
        ref.end(f"{name}_in")
        assert per_key(got) == per_key(ref.collect(f"{name}_out"))


def test_a_deployment_the_machine_cannot_hold_is_refused_and_the_engine_goes_on():
    with cep.Engine.local() as engine:
        error = refused(lambda: engine.deploy(query("huge"), parallelism=60_000, bins=65536))
        assert "query 'huge' at parallelism 60000" in str(error) and "120,000 instances" in str(error), error
        refused(lambda: engine.deploy(query("huge"), retain=cep.Retention(bytes=1 << 50)))
        assert engine.deployments == {} and engine.outputs == {}
        engine.deploy(query("huge"), parallelism=2, retain=cep.Retention(rows=np.int64(10_000)))
        send(engine, "huge", 0)
        assert engine.collect("huge_out").num_rows == 0  # the window is still open


def test_workers_and_ring_sizes_are_checked_before_anything_starts():
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    error = refused(lambda: cep.Engine.local(workers=10_000))
    assert "10000 instance managers" in str(error) and "CPUs" in str(error)
    refused(lambda: cep.Engine.local(workers=1, standby=np.int64(10_000)))
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before  # none was started
    for bad in (True, 1.0 * (1 << 20), 1000, 3 << 16, (1 << 30) * 2):
        refused(lambda: cep.Engine.local(ring_bytes=bad), "BAD_RING_BYTES")
    with cep.Engine.local(ring_bytes=np.int64(1 << 20)) as engine:
        assert engine._ring_bytes == 1 << 20 and type(engine._ring_bytes) is int


def test_retention_takes_integers_as_numpy_holds_them_and_refuses_bool_and_float():
    r = cep.Retention(rows=np.int64(5), bytes=np.uint32(1 << 20), age_s=np.float32(2.5))
    assert (r.rows, r.bytes, r.age_s) == (5, 1 << 20, 2.5) and type(r.rows) is int
    for bad in ({"rows": True}, {"rows": 10.0}, {"bytes": 0}, {"bytes": "1"}, {"age_s": True}, {"age_s": -1.0},
                {"age_s": float("nan")}):
        with pytest.raises(cep.EngineError) as e:
            cep.Retention(**bad)
        assert e.value.code == "BAD_RETENTION" and next(iter(bad)) in str(e.value)


def test_the_estimates_count_what_a_deployment_allocates():
    p = plan(query("est"))
    for parallelism in ({"SQ1": 1, "SQ2": 1}, {"SQ1": 3, "SQ2": 7}):
        layout = Layout(p, parallelism)
        assert capacity.channel_count(layout) == len(layout.channels())
    agg = p.subqueries[1].operators[0]
    built = capacity._array_bytes(physical(agg, 1024))
    estimated = capacity.instance_state_bytes(p, "SQ2", 1024) - capacity.TABLE_BYTES_PER_BIN * 1024
    assert built > 1024 * 512 and abs(estimated - built) < 0.01 * built
    small = capacity.Machine(memory_free=1 << 30, memory_total=2 << 30, shm_free=64 * MB)
    with pytest.raises(cep.EngineError) as e:
        capacity.check_workers(4, cpus=2, machine=small)  # 4 x 256 MiB > 80% of 1 GiB
    assert e.value.code == "CAPACITY" and "1.0 GiB free" in str(e.value)
    capacity.check_workers(3, cpus=2, machine=small)
    with pytest.raises(cep.EngineError) as e:
        capacity.ring_bytes_of(32 * MB, machine=small)
    assert e.value.code == "CAPACITY" and "/dev/shm" in str(e.value)
