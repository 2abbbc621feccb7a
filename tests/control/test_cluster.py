"""A cluster on a real ZooKeeper server: worker processes that join, two orchestrators, a client.

The leading orchestrator is SIGKILLed mid-stream: a standby leads within 5 s
from the registry alone, every send is taken meanwhile, the query's output
equals the reference, and a new deployment succeeds afterwards. A worker
that joins is used by the next deployment; one that dies is reported with
the instances it ran.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pyarrow as pa
import pytest
from zk_harness import ROOT

import sparkcep as cep
from harness import plain
from reference import assert_same_rows
from sparkcep import auth
from sparkcep.control import tree
from sparkcep.control.registry import ZkRegistry
from sparkcep.runtime.cluster import Starting, wait_ready

TIMEOUT_S = 60


def start(*argv, wait_ready_line=False) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, *sys.path]))
    p = subprocess.Popen([sys.executable, "-m", "sparkcep", *argv], env=env,
                         stdout=subprocess.PIPE if wait_ready_line else subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=not wait_ready_line)
    if wait_ready_line:
        wait_ready([Starting(p, " ".join(argv[:3]))])
    return p


def query(name: str) -> cep.Query:
    q = cep.Query(name)
    s = q.stream(f"{name}_in", "ip string, ts timestamp, bytes int64")
    q.output(f"{name}_out", s.aggregate(cep.TimeWindow("1s"), by="ip", name="agg", n=cep.count(),
                                        total=cep.sum("bytes")))
    return q


def batch(i: int, n: int = 500) -> pa.Table:
    return pa.table({"ip": [f"10.0.{i % 3}.{k % 40}" for k in range(n)],
                     "ts": pa.array(np.full(n, 1_700_000_000_000_000 + i * 100_000), pa.timestamp("us")),
                     "bytes": np.arange(n) + i})


def reference(q: cep.Query, batches) -> pa.Table:
    with cep.Engine.local() as e:
        e.deploy(q)
        for b in batches:
            e.send(next(iter(q.sources)), b)
        e.end(next(iter(q.sources)))
        return e.collect(next(iter(q.outputs)))


def wait(predicate, what: str, timeout: float = TIMEOUT_S):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


@pytest.fixture
def cluster(zookeeper, tmp_path):
    """A token, 3 workers and 2 orchestrators on a fresh root of the test ZooKeeper; all stopped after."""
    token_file = tmp_path / "keys" / "token"
    auth.write(token_file, auth.generate())
    zk = f"{zookeeper}/c{uuid.uuid4().hex[:8]}"
    procs = {}
    for i in range(3):
        procs[f"w{i}"] = start("worker", "--zk", zk, "--name", f"w{i}", "--cpus", str(i % 2), "--token-file",
                               str(token_file), wait_ready_line=True)
    for name in ("o1", "o2"):
        procs[name] = start("orchestrator", "--zk", zk, "--name", name, "--token-file", str(token_file))
        time.sleep(0.3)  # o1 contends first
    registry = ZkRegistry(zookeeper, "/" + zk.split("/", 1)[1], session_timeout=2.0)
    yield zk, token_file, procs, registry
    for name, p in procs.items():
        if name.startswith("o") and p.poll() is None:
            p.terminate()
            p.wait(30)
    engine_pid = (registry.get(tree.ENGINE) or {}).get("pid")
    for p in procs.values():
        if p.poll() is None:
            p.terminate()
            p.wait(30)
    if engine_pid and wait(lambda: not os.path.exists(f"/proc/{engine_pid}") or _zombie(engine_pid),
                           "the engine host to stop", 30) is None:
        pass
    registry.close()


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] == "Z"
    except OSError:
        return True


def test_the_leader_dies_mid_stream_and_nothing_of_the_data_path_notices(cluster):
    zk, token_file, procs, registry = cluster
    assert wait(lambda: registry.leader(tree.LEASE), "a leader") == "o1"
    engine = cep.Engine.connect(f"zk://{zk}", token_file=str(token_file))
    wait(lambda: len(engine.instance_managers()) == 3, "the engine host to adopt the 3 workers")
    q = query("fail_over")
    result = engine.deploy(q, parallelism=3)
    assert {f"w{i}" for i in range(3)} <= {line.split("instance manager ")[1].split(" ")[0]
                                            for line in result.explain().splitlines() if "instance manager" in line}
    batches = [batch(i) for i in range(120)]
    errors, sent = [], []

    def feed():
        for b in batches:
            try:
                engine.send("fail_over_in", b)
                sent.append(time.monotonic())
            except Exception as e:  # noqa: BLE001 - asserted below
                errors.append(e)
            time.sleep(0.02)
    t = threading.Thread(target=feed)
    t.start()
    wait(lambda: len(sent) > 30, "the first sends")
    procs["o1"].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    assert wait(lambda: registry.leader(tree.LEASE) == "o2", "o2 to lead", 10)
    took = time.monotonic() - killed
    t.join(TIMEOUT_S)
    assert not errors, errors[:3]
    assert took < 5, f"the standby led {took:.2f} s after the leader died"
    assert any(killed < s < killed + took for s in sent), "no send was taken while there was no leader"
    engine.end("fail_over_in")
    got = wait(lambda: (t := engine.collect("fail_over_out")).num_rows and t, "the output")
    assert_same_rows(plain(got), plain(reference(query("fail_over"), batches)), "through the fail-over")
    again = engine.deploy(query("after"), parallelism=2)  # through the new leader
    assert again.id.startswith("after#")
    engine.send("after_in", batch(0))
    engine.close()


def test_a_worker_that_joins_is_used_and_one_that_dies_is_reported(cluster):
    zk, token_file, procs, registry = cluster
    engine = cep.Engine.connect(f"zk://{zk}", token_file=str(token_file))
    wait(lambda: len(engine.instance_managers()) == 3, "the engine host to adopt the 3 workers")
    procs["w3"] = start("worker", "--zk", zk, "--name", "w3", "--cpus", "1", "--token-file", str(token_file),
                        wait_ready_line=True)
    wait(lambda: len(engine.instance_managers()) == 4, "the engine host to adopt w3")
    engine.deploy(query("wide"), parallelism=4)
    hosts = {im["name"]: im["instances"] for im in engine.instance_managers()}
    assert hosts["w3"] == ["wide.SQ1[3]"] or hosts["w3"], hosts
    ran = hosts["w1"]
    procs["w1"].send_signal(signal.SIGKILL)
    event = wait(lambda: next((registry.get(f"{tree.EVENTS}/{e}") for e in registry.children(tree.EVENTS)
                               if (registry.get(f"{tree.EVENTS}/{e}") or {}).get("instance_manager") == "w1"),
                              None), "the death of w1 to be reported", 20)
    assert event["kind"] == "died" and event["instances"] == ran and ran
    engine.close()
