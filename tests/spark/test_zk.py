"""Spark's side of a cluster (``zk://``), without Spark: the data source's target and the executor launcher.

The data source finds a cluster's engine host in the registry (``/engine``)
once per process and again when that address stops answering; it needs the
cluster's token file. The launcher's workers join the registry as members,
one that exits comes back under a new name, and all leave when the
launcher's input closes. The session's ZooKeeper server (``zookeeper``,
``tests/conftest.py``), a root of each test's own.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import uuid

import pytest

import sparkcep as cep
from sparkcep import auth
from sparkcep.control import tree
from sparkcep.control.registry import ZkRegistry
from sparkcep.spark import connection
from sparkcep.spark.connection import Target, call, target_of
from sparkcep.spark.options import SparkSourceError
from harness import wait

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def cluster(zookeeper, tmp_path):
    """``(zk://... address, registry session on its root, token file)`` on a fresh root."""
    root = f"/spark-tests/{uuid.uuid4().hex[:12]}"
    token_file = auth.write(tmp_path / "token", auth.generate())
    registry = ZkRegistry(zookeeper, root, session_timeout=2.0)
    yield f"zk://{zookeeper}{root}", registry, token_file
    registry.close()


def test_a_cluster_target_needs_the_token_file():
    with pytest.raises(SparkSourceError, match=r"^\[UPMCEP_TOKEN_NOT_FOUND\] engine zk://h:2181/x: option "
                                               r"tokenFile is required") as e:
        target_of("zk://h:2181/x", None)
    assert e.value.code == "TOKEN_NOT_FOUND"
    t = target_of(" zk://h:2181/x ", "/keys/token")
    assert t == Target("zk://h:2181/x", "/keys/token") and pickle.loads(pickle.dumps(t)) == t
    assert target_of("127.0.0.1:7077", None) == Target("127.0.0.1:7077", None)


def test_the_engine_host_is_looked_up_once_and_again_when_it_moves(cluster, monkeypatch):
    zk, registry, token_file = cluster
    t = target_of(zk, str(token_file))
    monkeypatch.setattr(connection, "RETRY_S", 1.0)  # how long a call waits for an engine host to be named
    with pytest.raises(SparkSourceError, match=r"^\[UPMCEP_ENGINE_NOT_FOUND\] the cluster at zk://.* has no data "
                                               r"path: the registry names no engine host"):
        call(t, lambda c: c.hello())
    token = auth.read(token_file)
    with cep.Engine.local(token=token) as first:
        registry.create(tree.ENGINE, {"address": first.endpoint.address}, ephemeral=True)
        assert call(t, lambda c: c.hello())["engine"] == first.run_id
        assert connection._engine_hosts[zk] == first.endpoint.address
    registry.delete(tree.ENGINE)
    with cep.Engine.local(token=token) as second:  # an engine host elsewhere: the first address answers no more
        registry.create(tree.ENGINE, {"address": second.endpoint.address}, ephemeral=True)
        assert call(t, lambda c: c.hello())["engine"] == second.run_id
        assert connection._engine_hosts[zk] == second.endpoint.address
    connection._forget(t)


def test_a_registry_that_never_answers_is_said_with_how_long_it_was_tried(monkeypatch, tmp_path):
    """Each lookup's message names its own limit (10 s), while the data source tried three of them: 33 s
    went by under a message saying 10."""
    from sparkcep.control import connect
    token_file = auth.write(tmp_path / "token", auth.generate())
    monkeypatch.setattr(connect, "REGISTRY_TIMEOUT_S", 0.3)
    monkeypatch.setattr(connection, "RETRY_S", 1.0)
    with pytest.raises(SparkSourceError, match=r"^\[UPMCEP_REGISTRY_UNREACHABLE\] no ZooKeeper server answered at "
                                               r"127\.0\.0\.1:1 within 0\.3 s.* \(tried \d+ times over \d+ s\)$"):
        call(target_of("zk://127.0.0.1:1/x", str(token_file)), lambda c: c.hello())


def launcher(zk: str, token_file, *extra) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, *sys.path]))
    return subprocess.Popen([sys.executable, "-m", "sparkcep.spark.executor", "--executor-id", "7",
                             "--instance-managers", "1", "--zk", zk, "--token-file", str(token_file), *extra],
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_the_launcher_keeps_members_in_the_registry_until_its_input_closes(cluster):
    zk, registry, token_file = cluster
    p = launcher(zk, token_file)
    try:
        first = wait(lambda: registry.children(tree.MEMBERS), "the launcher's worker to join")
        assert first == [f"exec7-0.{p.pid}"]
        doc = registry.get(tree.member(first[0]))
        assert doc["address"].startswith("127.0.0.1:") and os.sched_getaffinity(doc["pid"]) == {doc["cpus"][0]}
        os.kill(doc["pid"], signal.SIGKILL)  # its node stays until its session expires; it comes back renamed
        again = wait(lambda: f"exec7-0.{p.pid}.1" in registry.children(tree.MEMBERS) and
                     registry.get(tree.member(f"exec7-0.{p.pid}.1")), "the worker started again to join")
        assert again["pid"] != doc["pid"]
        p.stdin.close()  # the plugin's shutdown
        assert p.wait(30) == 0
        assert registry.children(tree.MEMBERS) in ([], [first[0]])  # the killed one's session may not have expired
        assert not os.path.exists(f"/proc/{again['pid']}") or _zombie(again["pid"])
        err = p.stderr.read()
        assert f"serving the cluster at {zk} with 1 instance manager(s) (members of its registry): " \
               f"exec7-0.{p.pid} at " in err
        assert f"instance manager exec7-0.{p.pid} (pid {doc['pid']}) exited with code -9 while serving the " \
               f"cluster at {zk}; starting it again" in err
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def test_the_launcher_refuses_zk_without_a_token_file_or_with_an_engine(cluster):
    zk, _, token_file = cluster
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, *sys.path]))
    for extra, says in ((["--zk", zk], "the cluster's token file is required"),
                        (["--zk", zk, "--token-file", str(token_file), "--engine", "127.0.0.1:1"], "not both")):
        run = subprocess.run([sys.executable, "-m", "sparkcep.spark.executor", *extra], env=env,
                             capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert run.returncode == 2 and says in run.stderr and "[OPTION]" in run.stderr, run.stderr


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] == "Z"
    except FileNotFoundError:
        return True
