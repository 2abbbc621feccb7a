"""Failure injection: an instance manager of one replica is SIGKILLed at a random moment under a steady
input, then, once that replica caught up, one of the other replica, and so on, alternating; the output
equals the run without failure exactly, output ids included, and both replicas run again at the end.

Two queries (HiBench fixwindow, a windowed equi-join), five runs, four kills per run: 20 kills.
"""

import os
import random
import signal
import threading
import time

import numpy as np
import pyarrow as pa
import pytest

import sparkcep as cep
from sparkcep.bench import workloads
from sparkcep.bench.generator import UserVisits

T0 = 1_704_067_200_000_000
SENDS, ROWS = 80, 2_000
KILLS = 4  # per run, alternating between the replicas
RUN_LIMIT_S = 120


def fixwindow():
    return workloads.query("fixwindow", name="fw", window_us=200_000)


def join():
    q = cep.Query("jn")
    left = q.stream("l", "k int64, ts timestamp, a int64")
    right = q.stream("r", "k int64, ts timestamp, b int64")
    q.output("pairs", left.join(right, cep.TimeWindow("300ms", advance="100ms"), on="k", name="j"))
    return q


def sends(query_name: str, seed: int):
    """The input: (stream, Arrow table) pairs, event time advancing 20 ms per send."""
    rng = np.random.default_rng(seed)
    out = []
    if query_name == "fw":
        gen = UserVisits(seed=seed, distinct_ips=3_000)
        for i in range(SENDS):
            keys = pa.array(T0 + i * 20_000 + np.sort(rng.integers(0, 20_000, ROWS)), pa.timestamp("us"))
            out.append((workloads.STREAM, pa.table({"key": keys, "value": gen.values(i * ROWS, ROWS)})))
        return out
    for i in range(SENDS):
        for stream, field in (("l", "a"), ("r", "b")):
            ts = pa.array(T0 + i * 20_000 + np.sort(rng.integers(0, 20_000, ROWS // 4)), pa.timestamp("us"))
            out.append((stream, pa.table({"k": rng.integers(0, 5_000, ROWS // 4), "ts": ts,
                                          field: rng.integers(0, 100, ROWS // 4)})))
    return out


def rows_with_ids(engine, output):
    """Every row of ``output`` with its output id, as a sorted list."""
    engine.collect(output, timeout=60)
    log = engine.outputs[output]
    first = log.earliest()
    return sorted(tuple(r.values()) for p, end in log.latest().items()
                  for b in log.read(p, first[p], end, ids=True) for r in b.to_pylist())


def reference(make, data):
    with cep.Engine.local() as e:
        q = make()
        e.deploy(q)
        for stream, t in data:
            e.send(stream, t)
        for stream in q.sources:
            e.end(stream)
        return {o: rows_with_ids(e, o) for o in q.outputs}


def wait_running(dep, deadline):
    while any(r["state"] != "running" for r in dep.replicas()):
        assert time.monotonic() < deadline, f"replicas did not catch up: {dep.replicas()}"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def references():
    return {}


@pytest.mark.parametrize("make, seed", [(fixwindow, 0), (fixwindow, 1), (fixwindow, 2), (join, 0), (join, 1)],
                         ids=["fixwindow-0", "fixwindow-1", "fixwindow-2", "join-0", "join-1"])
def test_kills_at_random_moments_leave_the_output_as_without_failure(make, seed, references):
    data = sends(make().name, seed)
    key = (make.__name__, seed)
    if key not in references:
        references[key] = reference(make, data)
    rng = random.Random(seed)
    deadline = time.monotonic() + RUN_LIMIT_S
    with cep.Engine.local(workers=2, standby=KILLS) as engine:
        q = make()
        dep = engine.deploy(q, parallelism=2, bins=16, replicas=2)
        killed, errors = [], []

        def killer():
            try:
                first = rng.randrange(2)
                for k in range(KILLS):
                    time.sleep(rng.uniform(0.05, 0.4))
                    replica = (first + k) % 2
                    victim = next(im for im in engine.instance_managers()
                                  if im["replica"] == replica and im["alive"] and im["instances"])
                    os.kill(victim["pid"], signal.SIGKILL)
                    killed.append((replica, victim["name"]))
                    time.sleep(0.3)
                    wait_running(dep, deadline)
            except BaseException as e:  # noqa: BLE001 - reported by the test thread
                errors.append(e)

        t = threading.Thread(target=killer)
        t.start()
        for i, (stream, table) in enumerate(data):
            engine.send(stream, table)
            time.sleep(0.01)
            if i == len(data) * 3 // 4:  # the last quarter of the input comes after every kill
                t.join(RUN_LIMIT_S)
        assert not errors, errors
        assert len(killed) == KILLS and {r for r, _ in killed} == {0, 1}, killed
        for stream in q.sources:
            engine.end(stream)
        got = {o: rows_with_ids(engine, o) for o in q.outputs}
        wait_running(dep, deadline)
        rep = engine.metrics()["queries"][q.name]["replication"]
    assert got == references[key], f"kills {killed}: {len(got[next(iter(got))])} rows"
    assert len(rep["failovers"]) == KILLS and len(rep["catchups"]) == KILLS
    assert all("duration_s" in c for c in rep["catchups"]), rep["catchups"]
