"""A cluster on a real ZooKeeper server: worker processes that join, two orchestrators, a client.

The leading orchestrator is SIGKILLed while a send is under way: the standby leads once the leader's
session timed out, from the registry alone; every send is taken meanwhile, the query's output equals
the reference, and the new leader works: a query whose deploy was asked while no orchestrator led is
deployed by it, fed, collected (equal per key to the reference) and undeployed. A worker that joins is
used by the next deployment; one that dies is reported with the instances it ran, in the leading
orchestrator's log, in the registry's events and by ``sparkcep status --zk``, which shows where each
replica of a replicated query runs each instance. One cluster (three
workers, two orchestrators, the engine hosts the leader starts) serves the module.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from sender import Sender
from zk_harness import ROOT

import sparkcep as cep
from harness import plain
from reference import assert_same_rows
from sparkcep import auth
from sparkcep.control import connect, tree
from sparkcep.control.registry import ZkRegistry
from sparkcep.control.registry.nodes import LEASES
from sparkcep.control.zookeeper import free_port
from sparkcep.runtime.worker_start import Starting, wait_ready
from harness import wait

TIMEOUT_S = 60
# The standby leads once the leader's session expired: the 2 s session timeout, then up to one tick of the
# test server (200 ms: ZooKeeper expires sessions tick by tick), then the standby hears that the lease node
# went and takes the lease; 0.5 s of slack for that last step on a loaded 2-core machine.
LEADER_S = 2.0 + 0.2 + 0.5
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, *sys.path]))


@dataclass
class Cluster:
    zk: str  # HOST:PORT/PATH
    token_file: Path
    work: Path  # each process's log: <name>.log
    procs: dict[str, subprocess.Popen]
    registry: ZkRegistry

    def start(self, name: str, *argv: str) -> subprocess.Popen:
        """Start ``sparkcep <argv> --zk ... --name name --token-file ...``, its stderr in ``<name>.log``; a
        worker is returned once it is ready."""
        kind = argv[0]
        with open(self.work / f"{name}.log", "ab") as log:
            p = subprocess.Popen([sys.executable, "-m", "sparkcep", *argv, "--zk", self.zk, "--name", name,
                                  "--token-file", str(self.token_file)], env=ENV, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE if kind == "worker" else subprocess.DEVNULL, stderr=log)
        self.procs[name] = p
        if kind == "worker":
            wait_ready([Starting(p, f"worker {name}")])
        return p

    def log(self, name: str) -> str:
        return (self.work / f"{name}.log").read_text(errors="replace")


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


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory):
    """A token, 3 workers and 2 orchestrators on a fresh root of the test ZooKeeper: o1 leads, o2 is in the
    contest for the lease. Everything stopped after (the last orchestrator stops the engine hosts)."""
    work = tmp_path_factory.mktemp("cluster")
    token_file = auth.write(work / "token", auth.generate())
    zk = f"{zookeeper}/c{uuid.uuid4().hex[:8]}"
    c = Cluster(zk, token_file, work, {}, ZkRegistry(zookeeper, "/" + zk.split("/", 1)[1], session_timeout=2.0))
    try:
        for i in range(3):
            c.start(f"w{i}", "worker", "--cpus", str(i % 2))
        c.start("o1", "orchestrator")
        wait(lambda: c.registry.leader(tree.LEASE) == "o1", "o1 to lead")
        c.start("o2", "orchestrator")
        wait(lambda: len(c.registry.children(f"{LEASES}/{tree.LEASE}")) == 2, "o2 to contend for the lease")
        yield c
    finally:
        hosts = [d["pid"] for n in c.registry.children(tree.HOSTS) if (d := c.registry.get(tree.host(n)))]
        for name, p in sorted(c.procs.items(), key=lambda kv: not kv[0].startswith("o")):
            if p.poll() is None:
                p.terminate()
                p.wait(30)
            if p.stdout is not None:
                p.stdout.close()
        for pid in hosts:  # stopped by the last orchestrator; killed here if not
            deadline = time.monotonic() + 10
            while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
                time.sleep(0.05)
            if os.path.exists(f"/proc/{pid}"):
                os.kill(pid, 9)
        c.registry.close()


def test_the_leader_dies_mid_stream_and_the_standby_leads_and_answers_the_deploy_in_flight(cluster):
    c = cluster
    assert c.registry.leader(tree.LEASE) == "o1"
    engine = cep.Engine.connect(f"zk://{c.zk}", token_file=str(c.token_file))
    wait(lambda: len(engine.instance_managers()) == 3, "the engine host to adopt the 3 workers")
    result = engine.deploy(query("fail_over"), parallelism=3)
    assert {f"w{i}" for i in range(3)} <= {line.split("instance manager ")[1].split(" ")[0]
                                            for line in result.explain().splitlines() if "instance manager" in line}
    batches = [batch(i) for i in range(120)]
    sender = Sender(lambda b: engine.send("fail_over_in", b), batches, pace_s=0.02).start()
    sender.wait_done(30, TIMEOUT_S)
    killed, deployed = [], []
    assert sender.during_send(lambda: (c.procs["o1"].kill(), killed.append(time.monotonic())))
    sent_at_kill = sender.done
    # a deploy asked while no orchestrator leads: the new leader answers it
    in_flight = threading.Thread(target=lambda: deployed.append(engine.deploy(query("after"), parallelism=2)))
    in_flight.start()
    wait(lambda: c.registry.leader(tree.LEASE) == "o2", "o2 to lead", 10)
    took = time.monotonic() - killed[0]
    sent_without_leader = sender.done - sent_at_kill
    sender.thread.join(TIMEOUT_S)
    in_flight.join(TIMEOUT_S)
    assert not sender.errors and sender.done == len(batches), sender.errors[:3]
    assert took < LEADER_S, f"the standby led {took:.2f} s after the leader died"
    assert sent_without_leader > 0, "no send was taken while there was no leader"
    engine.end("fail_over_in")
    got = wait(lambda: (t := engine.collect("fail_over_out")).num_rows and t, "the output")
    assert_same_rows(plain(got), plain(reference(query("fail_over"), batches)), "through the fail-over")

    # the new leader deployed the query asked meanwhile; it runs, and the new leader undeploys
    assert deployed and deployed[0].id.startswith("after#"), "the deploy asked during the fail-over was not answered"
    fed = [batch(i, 200) for i in range(10)]
    for b in fed:
        engine.send("after_in", b)
    engine.end("after_in")
    assert_same_rows(plain(engine.collect("after_out")), plain(reference(query("after"), fed)),
                     "deployed through the new leader")
    for name in ("after", "fail_over"):
        engine.undeploy(name)
    assert c.registry.children(tree.DEPLOYMENTS) == [] and c.registry.children(tree.STREAMS) == []
    assert not [i for im in engine.instance_managers() for i in im["instances"]], engine.instance_managers()
    with pytest.raises(cep.UnknownStreamError):
        engine.send("after_in", batch(0))
    engine.close()


def test_a_worker_that_joins_is_used_at_once_and_one_that_dies_is_reported(cluster):
    """The engine host adopts the members that join one after another, in a thread of its own: a member that
    does not answer yet (a stopped worker; here a socket that takes the connection and answers nothing until
    released) holds up the adoption of w3, which joins meanwhile. A deploy asked at once still uses w3."""
    c = cluster
    engine = cep.Engine.connect(f"zk://{c.zk}", token_file=str(c.token_file))
    wait(lambda: len(engine.instance_managers()) == 3, "the engine host to adopt the 3 workers")
    hung = socket.create_server(("127.0.0.1", 0))
    with ZkRegistry(c.zk.split("/", 1)[0], "/" + c.zk.split("/", 1)[1], session_timeout=2.0,
                    token=auth.read(c.token_file)) as member:
        member.create(tree.member("w2x"), {"name": "w2x", "address": f"127.0.0.1:{hung.getsockname()[1]}",
                                           "host": socket.gethostname(), "pid": os.getpid(), "cpus": [1], "node": 0},
                      ephemeral=True)
        c.start("w3", "worker", "--cpus", "1")
        threading.Timer(3.0, hung.close).start()  # then its adoption fails, and the next one's goes on
        engine.deploy(query("wide"), parallelism=4)
    hosts = {im["name"]: [i for i in im["instances"] if i.startswith("wide.")] for im in engine.instance_managers()}
    assert sorted(hosts) == ["w0", "w1", "w2", "w3"] and all(len(v) == 1 for v in hosts.values()), hosts
    ran = hosts["w1"]
    c.procs["w1"].kill()
    event = wait(lambda: next((doc for e in c.registry.children(tree.EVENTS)
                               if (doc := c.registry.get(f"{tree.EVENTS}/{e}") or {}).get("instance_manager") == "w1"),
                              None), "the death of w1 to be reported", 20)
    assert event["kind"] == "died" and event["instances"] == ran
    leader = c.registry.leader(tree.LEASE)
    assert f"instance manager w1 died; it ran {ran[0]}" in c.log(leader)
    status = subprocess.run([sys.executable, "-m", "sparkcep", "status", "--zk", c.zk], env=ENV, text=True,
                            capture_output=True, timeout=60)
    assert status.returncode == 0, status.stderr
    members = status.stdout.split("instance managers (", 1)[1].split("deployments (", 1)[0]
    assert "w1" not in members and "w3" in members, status.stdout
    assert "\nevents:\n" in status.stdout, status.stdout
    events = status.stdout.split("\nevents:\n", 1)[1]
    assert any("died" in line and "'w1'" in line and ran[0] in line for line in events.splitlines()), status.stdout
    engine.undeploy("wide")
    engine.close()


def test_status_shows_where_each_replica_runs(cluster):
    """Both replicas' instance managers, not the one listed last (the other replica's were shown idle)."""
    c = cluster
    engine = cep.Engine.connect(f"zk://{c.zk}", token_file=str(c.token_file))
    try:
        engine.deploy(query("pair"), replicas=2)
        ran = sorted(im["name"] for im in engine.instance_managers() if "pair.SQ1[0]" in im["instances"])
        assert len(ran) == 2, engine.instance_managers()

        def recorded() -> dict | None:
            """The status document once the leader recorded where pair runs."""
            run = subprocess.run([sys.executable, "-m", "sparkcep", "status", "--zk", c.zk, "--json"], env=ENV,
                                 text=True, capture_output=True, timeout=60)
            assert run.returncode == 0, run.stderr
            doc = json.loads(run.stdout)
            return doc if any(d["query"] == "pair" and d["placement"] for d in doc["deployments"]) else None
        doc = wait(recorded, "the leader to record pair's placement", 20)
        assert next(d for d in doc["deployments"] if d["query"] == "pair")["placement"] == {"SQ1[0]": ran}, doc
        assert sorted(m["name"] for m in doc["instance_managers"] if "pair.SQ1[0]" in m["instances"]) == ran, doc
        text = subprocess.run([sys.executable, "-m", "sparkcep", "status", "--zk", c.zk], env=ENV, text=True,
                              capture_output=True, timeout=60).stdout
        assert f"SQ1[0] on {', '.join(ran)}" in text, text
    finally:
        engine.undeploy("pair")
        engine.close()


def test_a_worker_started_again_at_once_under_its_name_waits_out_the_dead_ones_session(cluster):
    """A supervisor's restart: the dead worker's document stays until its session expires; the new one waits
    for that instead of failing. A live holder of the name is refused at once."""
    c = cluster
    old = c.procs["w2"]
    old.kill()
    old.wait()
    old.stdout.close()
    assert (c.registry.get(tree.member("w2")) or {}).get("pid") == old.pid  # its session is still open
    new = c.start("w2", "worker", "--cpus", "0")
    assert c.registry.get(tree.member("w2"))["pid"] == new.pid
    engine = cep.Engine.connect(f"zk://{c.zk}", token_file=str(c.token_file))
    try:
        wait(lambda: any(im["name"] == "w2" and im["pid"] == new.pid for im in engine.instance_managers()),
             "the engine host to adopt the new w2", 20)
    finally:
        engine.close()
    t0 = time.monotonic()
    twin = subprocess.run([sys.executable, "-m", "sparkcep", "worker", "--zk", c.zk, "--name", "w0", "--cpus", "0",
                           "--token-file", str(c.token_file)], env=ENV, text=True, capture_output=True, timeout=120)
    assert twin.returncode == 1 and "[MEMBER_EXISTS]" in twin.stderr, twin.stderr
    assert "waiting" not in twin.stdout and time.monotonic() - t0 < 60, (twin.stdout, time.monotonic() - t0)


class LateRelay:
    """A TCP relay to ``target`` (HOST:PORT) that listens on ``port`` only from ``delay`` s on: a registry
    server that answers late, as one restarting does."""

    def __init__(self, port: int, target: str, delay: float):
        self.port, self.target, self.sockets = port, target, []
        self.timer = threading.Timer(delay, self._listen)
        self.timer.start()

    def _listen(self):
        server = socket.create_server(("127.0.0.1", self.port))
        self.sockets.append(server)
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def _accept(self, server):
        host, port = self.target.rsplit(":", 1)
        while True:
            try:
                near, _ = server.accept()
            except OSError:
                return
            far = socket.create_connection((host, int(port)))
            self.sockets += [near, far]
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass

    def close(self):
        self.timer.cancel()
        for s in self.sockets:
            s.close()


def test_connect_waits_for_a_registry_that_answers_late_as_long_as_retry_s(cluster, monkeypatch):
    """``Engine.connect(retry_s=...)`` gave up on the registry after 10 s whatever ``retry_s``: a ZooKeeper
    restarting for longer failed it with REGISTRY_UNREACHABLE (here the 10 s are made 0.5 s)."""
    monkeypatch.setattr(connect, "REGISTRY_TIMEOUT_S", 0.5)
    hosts, root = cluster.zk.split("/", 1)
    relay = LateRelay(free_port(), hosts, delay=1.5)
    try:
        started = time.monotonic()
        with cep.Engine.connect(f"zk://127.0.0.1:{relay.port}/{root}", token_file=str(cluster.token_file),
                                retry_s=20) as engine:
            assert time.monotonic() - started >= 1.5
            assert len(engine.instance_managers()) >= 1
    finally:
        relay.close()
