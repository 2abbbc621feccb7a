"""A lost replica with no standby instance manager (Flux catch-up, ``placement_for``).

One replicated query on three workers and no standby (replica 0 on two instance managers, replica 1 on
the third), under a steady input, while replica 0 loses instance managers one by one, each killed while a
send is under way: first it is rebuilt on the live instance manager left on its own side; with none left
there, it waits, and a worker added within the wait (``engine.add_instance_manager``) is used; with none
at all it is not rebuilt (``NO_ROOM``): the query runs on replica 1 alone and ``dep.replicas()`` says
replica 0 failed. No send fails, and the output equals the run without failures per key.
"""

import itertools
import os
import signal
import time

import numpy as np
import pyarrow as pa
from sender import Sender

import sparkcep as cep
from harness import plain
from reference import assert_same_rows
from sparkcep import auth
from sparkcep.replication import catchup
from sparkcep.runtime.worker_start import Starting, start_worker, wait_ready

T0 = 1_704_067_200_000_000
LIMIT_S = 60  # for each step


def query() -> cep.Query:
    q = cep.Query("nostandby")
    s = q.stream("ev", "k int64, ts timestamp, v int64")
    q.output("per_k", s.aggregate(cep.TimeWindow("200ms"), by="k", name="agg", n=cep.count(), total=cep.sum("v")))
    return q


def events(i: int) -> pa.Table:
    """Send ``i``: 500 rows over 300 keys, 20 ms of event time."""
    rng = np.random.default_rng(i)
    return pa.table({"k": rng.integers(0, 300, 500),
                     "ts": pa.array(T0 + i * 20_000 + np.sort(rng.integers(0, 20_000, 500)), pa.timestamp("us")),
                     "v": rng.integers(0, 1_000, 500)})


def reference(sent: list[int]) -> pa.Table:
    """The same sends through one instance in this process."""
    with cep.Engine.local(workers=0) as e:
        e.deploy(query())
        for i in sent:
            e.send("ev", events(i))
        e.end("ev")
        return e.collect("per_k")


def wait_for(look, what: str):
    deadline = time.monotonic() + LIMIT_S
    while not (value := look()):
        assert time.monotonic() < deadline, f"no {what} within {LIMIT_S} s"
        time.sleep(0.05)
    return value


def test_a_lost_replica_without_standby_runs_on_its_side_then_on_a_joined_worker_then_nowhere(tmp_path,
                                                                                              monkeypatch):
    token = auth.generate()
    token_file = str(auth.write(tmp_path / "token", token))
    joiner = start_worker("joiner", 1, "127.0.0.1:0", token_file)  # warms up beside the engine's workers
    sent: list[int] = []
    try:
        with cep.Engine.local(workers=3, token=token) as engine:
            dep = engine.deploy(query(), parallelism=2, replicas=2)
            assert [r["instance_managers"] for r in dep.replicas()] == [["im-0", "im-1"], ["im-2"]]

            def send(i):
                engine.send("ev", events(i))
                sent.append(i)
            sender = Sender(send, itertools.count(), pace_s=0.02).start()
            sender.wait_done(10, LIMIT_S)

            def catchups():
                return engine.metrics()["queries"]["nostandby"]["replication"]["catchups"]

            def lose(name: str, n: int) -> dict:
                """Kill instance manager ``name`` while a send is under way; the ``n``-th catch-up, once over."""
                pid = next(im["pid"] for im in engine.instance_managers() if im["name"] == name)
                assert sender.during_send(lambda: os.kill(pid, signal.SIGKILL)), f"no send under way at {name}'s kill"
                return wait_for(lambda: len(c := catchups()) == n and ("duration_s" in c[-1] or "error" in c[-1])
                                and c[-1], f"catch-up {n}")

            # no standby: the instance managers of replica 0's side that live
            done = lose("im-0", 1)
            assert "error" not in done, done
            assert [r["instance_managers"] for r in dep.replicas()] == [["im-1"], ["im-2"]]
            assert all(r["state"] == "running" for r in dep.replicas())

            # none left on its side: it waits for one to join
            joined = wait_ready([Starting(joiner, "the worker joiner")])[0]
            pid = next(im["pid"] for im in engine.instance_managers() if im["name"] == "im-1")
            assert sender.during_send(lambda: os.kill(pid, signal.SIGKILL))
            wait_for(lambda: dep.replicas()[0]["state"] == "failed", "replica 0 lost")
            time.sleep(0.5)
            assert len(catchups()) == 1 and dep.replicas()[0]["state"] == "failed", dep.replicas()
            engine.add_instance_manager(joined["address"])
            done = wait_for(lambda: len(c := catchups()) == 2 and "duration_s" in c[-1] and c[-1], "catch-up 2")
            assert [r["instance_managers"] for r in dep.replicas()] == [["joiner"], ["im-2"]], dep.replicas()
            assert all(r["state"] == "running" for r in dep.replicas())

            # none at all: NO_ROOM, and the query runs on replica 1 alone
            monkeypatch.setattr(catchup, "ROOM_WAIT_S", 0.5)
            done = lose("joiner", 3)
            assert "NO_ROOM" in done.get("error", ""), done
            assert [r["state"] for r in dep.replicas()] == ["failed", "running"], dep.replicas()
            sender.wait_done(sender.done + 10, LIMIT_S)
            sender.stop()
            assert not sender.errors, sender.errors
            engine.end("ev")
            got = engine.collect("per_k")
    finally:
        joiner.kill()
        joiner.wait(10)
    assert_same_rows(plain(got), plain(reference(sent)), "through three losses of replica 0")
