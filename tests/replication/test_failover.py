"""Failure injection: an instance manager of one replica is SIGKILLed at a random moment under a steady
input, then, once that replica caught up, one of the other replica, and so on, alternating; the output
equals the run without failure exactly, output ids included, and both replicas run again at the end.

The input keeps flowing through the kills: each kill lands while a send is under way, and sends are taken
while the lost replica is rebuilt. Two queries (HiBench fixwindow, a windowed equi-join), five runs, four
kills per run: 20 kills.
"""

import itertools
import os
import random
import signal
import time

import numpy as np
import pyarrow as pa
import pytest
from sender import Sender

import sparkcep as cep
from sparkcep.bench import workloads
from sparkcep.bench.generator import UserVisits

T0 = 1_704_067_200_000_000
ROWS = 1_000  # per send
PACE_S = 0.02  # between sends
TAIL = 10  # sends before the first kill, and after the last catch-up
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
    """The input, endless: (stream, Arrow table) pairs, event time advancing 20 ms per send (per pair of
    sends for the join); send ``i`` is the same in every run of a seed."""
    gen = UserVisits(seed=seed, distinct_ips=3_000)
    for i in itertools.count():
        rng = np.random.default_rng([seed, i])
        if query_name == "fw":
            keys = pa.array(T0 + i * 20_000 + np.sort(rng.integers(0, 20_000, ROWS)), pa.timestamp("us"))
            yield workloads.STREAM, pa.table({"key": keys, "value": gen.values(i * ROWS, ROWS)})
            continue
        for stream, field in (("l", "a"), ("r", "b")):
            ts = pa.array(T0 + i * 20_000 + np.sort(rng.integers(0, 20_000, ROWS // 2)), pa.timestamp("us"))
            yield stream, pa.table({"k": rng.integers(0, 5_000, ROWS // 2), "ts": ts,
                                    field: rng.integers(0, 100, ROWS // 2)})


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


@pytest.mark.parametrize("make, seed", [(fixwindow, 0), (fixwindow, 1), (fixwindow, 2), (join, 0), (join, 1)],
                         ids=["fixwindow-0", "fixwindow-1", "fixwindow-2", "join-0", "join-1"])
def test_kills_at_random_moments_leave_the_output_as_without_failure(make, seed):
    rng = random.Random(seed)
    deadline = time.monotonic() + RUN_LIMIT_S
    sent = []  # what the engine took, in order: the reference's input
    with cep.Engine.local(workers=2, standby=KILLS) as engine:
        q = make()
        dep = engine.deploy(q, parallelism=2, bins=16, replicas=2)

        def send(item):
            engine.send(*item)
            sent.append(item)
        sender = Sender(send, sends(q.name, seed), PACE_S).start()
        sender.wait_done(TAIL, RUN_LIMIT_S)  # state to copy before the first kill
        kills = []  # (replica, victim, a send under way, sends done at the kill, sends done once rebuilt)
        first = rng.randrange(2)
        for k in range(KILLS):
            time.sleep(rng.uniform(0.05, 0.4))
            replica = (first + k) % 2
            victim = next(im for im in engine.instance_managers()
                          if im["replica"] == replica and im["alive"] and im["instances"])
            under_way = sender.during_send(lambda: os.kill(victim["pid"], signal.SIGKILL))
            at_kill = sender.done
            time.sleep(0.3)
            wait_running(dep, deadline)
            kills.append((replica, victim["name"], under_way, at_kill, sender.done))
        sender.wait_done(sender.done + TAIL, deadline - time.monotonic())
        sender.stop()
        assert not sender.errors, sender.errors
        for stream in q.sources:
            engine.end(stream)
        got = {o: rows_with_ids(engine, o) for o in q.outputs}
        wait_running(dep, deadline)
        rep = engine.metrics()["queries"][q.name]["replication"]
    assert all(under_way for _, _, under_way, _, _ in kills), f"a kill came while no send was under way: {kills}"
    assert all(rebuilt > at_kill for *_, at_kill, rebuilt in kills), f"no send was taken during a catch-up: {kills}"
    assert {r for r, *_ in kills} == {0, 1}, kills
    assert got == reference(make, sent), f"kills {kills}: {len(got[next(iter(got))])} rows"
    assert len(rep["failovers"]) == KILLS and len(rep["catchups"]) == KILLS
    assert all("duration_s" in c for c in rep["catchups"]), rep["catchups"]
