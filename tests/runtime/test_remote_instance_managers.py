"""Instance managers started by hand (``sparkcep worker``) on two loopback "hosts", 127.0.0.2 and 127.0.0.3:
the same query gives the rows of the in-process run through the network channel; a killed one fails its
deployment at once; nothing without the token gets in."""

import os
import random
import signal
import socket
import subprocess
import sys
import time

import pyarrow as pa
import pytest

import sparkcep as cep
from cases import CASES
from harness import chunk, run
from reference import assert_same_rows
from runtime_harness import run_on
from sparkcep import auth
from sparkcep.runtime.channels import hello
from sparkcep.runtime.worker_start import Starting, wait_ready

HOSTS = ["127.0.0.2", "127.0.0.3"]


def start_worker(ip: str, name: str, token_file, cpu: int) -> tuple[subprocess.Popen, str]:
    """A ``sparkcep worker`` serving on ``ip``; its process and address (from its READY line)."""
    root = os.path.dirname(os.path.dirname(cep.__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, *sys.path]))
    p = subprocess.Popen([sys.executable, "-m", "sparkcep", "worker", "--listen", f"{ip}:0", "--cpus", str(cpu),
                          "--name", name, "--token-file", str(token_file)], stdout=subprocess.PIPE, env=env)
    (info,) = wait_ready([Starting(p, name)])
    return p, info["address"]


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("cluster") / "token"
    auth.write(path, auth.generate())
    return path


@pytest.fixture(scope="module")
def two_hosts(token_file):
    cpus = sorted(os.sched_getaffinity(0))
    started = [start_worker(ip, f"im-{ip}", token_file, cpus[i % len(cpus)]) for i, ip in enumerate(HOSTS)]
    yield [address for _, address in started]
    for p, _ in started:
        p.terminate()
        p.wait(10)


@pytest.mark.parametrize("name", ["tumbling_all_functions", "tuple_sliding", "sliding_late_tuples",
                                  "equi_join_sliding_where", "demux_union"])
def test_a_query_on_two_hosts_gives_the_rows_of_the_in_process_run(name, two_hosts, token_file):
    case = CASES[name]
    rng = random.Random(7)
    sends = chunk(case.data(200, rng), sizes=[rng.randint(1, 60) for _ in range(5)])
    want = run(case.query(), sends)
    with cep.Engine.local(instance_managers=two_hosts, token=auth.read(token_file)) as engine:
        ims = engine.instance_managers()
        assert [im["host"] for im in ims] == HOSTS and all(im["alive"] for im in ims)
        got = run_on(engine, case.query(), sends, parallelism=2)
    for out in want.outputs:
        assert_same_rows(got.outputs[out], want.outputs[out], f"{name}.{out} on two hosts")
    assert got.late == want.late


def test_instances_on_both_hosts_exchange_through_the_network(two_hosts, token_file):
    q = cep.Query("spread")
    s = q.stream("ev", "k string, ts timestamp, v int64")
    q.output("n", s.filter(cep.col("v") >= 0, name="f").aggregate(cep.TimeWindow("1s"), by="k", name="agg",
                                                                   n=cep.count()))
    with cep.Engine.local(instance_managers=two_hosts, token=auth.read(token_file)) as engine:
        dep = engine.deploy(q, parallelism={"f": 2, "agg": 2})
        hosted = {im["host"]: im["instances"] for im in engine.instance_managers()}
        assert all(hosted[h] for h in HOSTS), hosted  # both hosts run instances of the query
        assert dep.bin_owners("agg") == [0] * 64 + [1] * 64
        engine.send("ev", {"k": ["a", "b", "c"], "ts": pa.array([0, 1, 2], pa.timestamp("us")), "v": [1, 2, 3]})
        engine.end("ev")
        assert sum(engine.collect("n").column("n").to_pylist()) == 3
        snaps = engine.metrics()["instance_managers"]
        assert sum(m["bytes_in"] for m in snaps.values()) > 0


def test_a_killed_remote_instance_manager_fails_the_deployment_within_a_second(token_file, tmp_path):
    started = [start_worker(ip, f"victim-{i}", token_file, 0) for i, ip in enumerate(HOSTS)]
    try:
        with cep.Engine.local(instance_managers=[a for _, a in started], token=auth.read(token_file)) as engine:
            q = cep.Query("doomed")
            s = q.stream("ev", "k string, ts timestamp, v int64")
            q.output("n", s.aggregate(cep.TimeWindow("1s"), by="k", name="agg", n=cep.count()))
            dep = engine.deploy(q, parallelism=2)
            engine.send("ev", {"k": ["a", "b"], "ts": pa.array([0, 1], pa.timestamp("us")), "v": [1, 2]})
            victim, address = started[1]
            os.kill(victim.pid, signal.SIGKILL)
            t0 = time.monotonic()
            while dep.error is None and time.monotonic() - t0 < 5:
                time.sleep(0.01)
            noticed = time.monotonic() - t0
            assert dep.error is not None and dep.error.code == "WORKER_DIED", dep.error
            assert noticed < 1.0, noticed
            assert "victim-1" in str(dep.error) and address in str(dep.error) and f"pid {victim.pid}" in str(dep.error)
            with pytest.raises(cep.EngineError) as e:
                engine.send("ev", {"k": ["a"], "ts": pa.array([2], pa.timestamp("us")), "v": [3]})
            assert e.value.code == "WORKER_DIED"
    finally:
        for p, _ in started:
            if p.poll() is None:
                p.kill()
            p.wait(10)


def test_a_connection_without_the_token_is_refused(two_hosts, token_file):
    host, port = two_hosts[0].rsplit(":", 1)
    for bad in ({"role": "control"}, {"role": "control", "token": "guess"},
                {"role": "consumer", "channel": "x#1/SQ1.0>engine.0"}):
        with socket.create_connection((host, int(port)), timeout=10) as s:
            hello.send_frame(s, bad, time.monotonic() + 5)
            answer = hello.read_frame(s, time.monotonic() + 5)
            assert answer["ok"] is False
    with pytest.raises(cep.EngineError) as e:
        cep.Engine(instance_managers=two_hosts, token=auth.generate())
    assert e.value.code == "UNAUTHENTICATED"
    with cep.Engine(instance_managers=two_hosts[:1], token=auth.read(token_file)) as engine:
        assert engine.metrics()["instance_managers"][0]["refused_connections"] >= 4


def test_two_live_instance_managers_of_one_name_are_refused(token_file):
    started = [start_worker("127.0.0.2", "twin", token_file, 0), start_worker("127.0.0.3", "twin", token_file, 0)]
    try:
        with pytest.raises(cep.EngineError) as e:
            cep.Engine(instance_managers=[a for _, a in started], token=auth.read(token_file))
        assert e.value.code == "WORKER_NAME" and "'twin'" in str(e.value)
    finally:
        for p, _ in started:
            p.terminate()
            p.wait(10)
