"""Catch-up at its edges: state larger than a command, a survivor lost while it is being copied."""

import os
import signal
import socket
import threading
import time

import numpy as np
import pytest

import sparkcep as cep
from sparkcep.runtime import commands as cmd


def test_a_handoff_s_state_travels_beyond_the_command_limit(monkeypatch):
    """A copy of 10^7 keys (~800 MB an instance) exceeded the command limit (256 MiB): the engine took the
    survivor's instance manager for dead. The state travels as the frame's payload, read into a buffer of
    its size, however many reads that takes."""
    monkeypatch.setattr(cmd, "RECORD_LIMIT", 1 << 16)
    a, b = socket.socketpair()
    state = os.urandom(5 << 20)  # 80 times the (lowered) command limit
    sender = threading.Thread(target=cmd.send_record, args=(a, cmd.Handoff("q#1", "t1", "im-1", state)))
    sender.start()
    reader, got = cmd.RecordReader(b), []
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        got += reader.read()
        time.sleep(0.001)
    sender.join()
    assert len(got) == 1 and got[0].ticket == "t1" and bytes(got[0].blob) == state
    cmd.send_record(a, cmd.Installed("t1", 3))  # the framing goes on after it
    time.sleep(0.05)
    assert reader.read() == [cmd.Installed("t1", 3)]
    a.close()
    b.close()


def test_a_survivor_lost_while_it_is_copied_fails_the_query_at_once():
    """Replica 1 dies while replica 0 catches up from it: nothing can produce the output any more, and
    the next send says so (it went on for 120 s, until the handoff timed out)."""
    q = cep.Query("edge")
    s = q.stream("ev", "k int64, ts timestamp")
    q.output("counts", s.aggregate(cep.TimeWindow("1h"), by="k", n=cep.count(), name="agg"))
    t0 = time.time_ns() // 1000 // 3_600_000_000 * 3_600_000_000
    with cep.Engine.local(workers=2, standby=1) as engine:
        dep = engine.deploy(q, parallelism=2, replicas=2, retain=False)
        for start in range(0, 600_000, 200_000):  # state enough to make the copy take a while
            k = np.arange(start, start + 200_000)
            engine.send("ev", {"k": k, "ts": np.full(len(k), t0, "datetime64[us]")})
        dep.wait()

        def kill(replica):
            im = next(im for im in engine.instance_managers() if im["replica"] == replica and im["instances"])
            os.kill(im["pid"], signal.SIGKILL)
        kill(0)
        deadline = time.monotonic() + 30
        while not any(r["state"] == "catching-up" for r in dep.replicas()):
            assert time.monotonic() < deadline, dep.replicas()
            time.sleep(0.001)
        kill(1)
        t = time.monotonic()
        with pytest.raises(cep.EngineError) as e:
            while time.monotonic() - t < 20:
                engine.send("ev", {"k": np.arange(10), "ts": np.full(10, t0 + 1, "datetime64[us]")})
                time.sleep(0.05)
        assert e.value.code == "WORKER_DIED" and time.monotonic() - t < 10, dep.replicas()


def test_a_survivor_s_late_rows_reach_the_outputs_though_the_rebuilt_replica_is_ahead():
    """When a replica is rebuilt at epoch E, the survivor's rows of the epochs before E may still be on their
    way (its sink is behind). The rebuilt replica's epochs from E on came out first and the dedup sink, which
    takes an epoch once and in order, dropped the survivor's earlier ones as copies: a Spark reader missed
    250 of 10,000 rows. The survivor's sink is held back here while the rebuilt replica runs ahead."""
    q = cep.Query("late")
    s = q.stream("ev", "k int64, ts timestamp, v int64")
    q.output("late_all", s.map(k="k", ts="ts", v="v", name="copy"))
    q.output("late_win", s.aggregate(cep.TimeWindow("1s"), by="k", n=cep.count(), total=cep.sum("v"), name="agg"))
    t0 = 1_700_000_000_000_000

    def batch(i: int) -> dict:
        r = np.random.default_rng(i)
        return {"k": r.integers(0, 5, 100), "ts": np.full(100, t0 + i * 400_000, "datetime64[us]"),
                "v": r.integers(0, 1000, 100)}

    def rows(engine, out: str) -> list:
        return sorted(engine.collect(out).to_pandas().itertuples(index=False, name=None))

    with cep.Engine.local(workers=0) as ref:
        ref.deploy(q)
        for i in range(12):
            ref.send("ev", batch(i))
        ref.end("ev")
        want = {out: rows(ref, out) for out in ("late_all", "late_win")}

    with cep.Engine.local(workers=2, standby=1) as engine:
        dep = engine.deploy(q, parallelism=1, replicas=2)
        for i in range(4):
            engine.send("ev", batch(i))
        dep.wait()
        rs = engine.deployments["late"]
        survivor, rebuilt = rs.members[1], rs.members[0]
        survivor.sink.poll = lambda: 0  # the survivor's outputs stay in its channels for now
        for i in range(4, 7):
            engine.send("ev", batch(i))
        im = next(im for im in engine.instance_managers() if im["replica"] == 0 and im["instances"])
        os.kill(im["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while not rs.catchups and not any(r["state"] == "catching-up" for r in dep.replicas()):
            assert time.monotonic() < deadline, dep.replicas()
            time.sleep(0.005)
        for i in range(7, 12):
            engine.send("ev", batch(i))
        deadline = time.monotonic() + 2  # the rebuilt replica's epochs could come out now, were it let
        while rebuilt.sink.published < 11 and time.monotonic() < deadline:
            time.sleep(0.01)
        del survivor.sink.poll
        engine.end("ev")
        got = {out: rows(engine, out) for out in ("late_all", "late_win")}
        assert [r["state"] for r in dep.replicas()] == ["running", "running"]
    for out, rows_ in want.items():
        missing, extra = len(set(rows_) - set(got[out])), len(set(got[out]) - set(rows_))
        assert got[out] == rows_, f"{out}: {missing} rows missing, {extra} extra of {len(rows_)}"
