"""The engines the public API is checked on, each started once per test module, as a user starts them.

* ``workers0``: ``Engine.local(workers=0)``, everything in this process;
* ``workers2``: ``Engine.local(workers=2)``, two instance managers it starts;
* ``addresses``: two ``sparkcep worker --listen 127.0.0.1:0 --token-file F`` processes started here,
  reached by address: ``Engine.local(instance_managers=[...], token=...)``;
* ``cluster``: ``sparkcep orchestrator --zk ... --name o1 --token-file F`` and two ``sparkcep worker
  --zk ... --name wN --cpus N --listen 127.0.0.1:0 --token-file F`` on the session's ZooKeeper, reached
  with ``Engine.connect("zk://...", token_file=F)``.

``api`` gives an :class:`api_harness.Api`: the engine, its kind, and how to run the ``sparkcep`` command
line against it. Tests deploy queries of their own names and undeploy them.
"""

from __future__ import annotations

import subprocess
import uuid

import pytest
from api_harness import KINDS, Api, start, start_workers, stop
from harness import wait

import sparkcep as cep
from sparkcep import auth


@pytest.fixture(scope="module", params=KINDS)
def api(request, tmp_path_factory):
    kind = request.param
    if kind == "cluster":
        yield request.getfixturevalue("cluster")
        return
    home = tmp_path_factory.mktemp(f"api-{kind}")
    token_file, log = home / "token", home / "stderr.log"  # what the processes say, to read after a failure
    auth.write(token_file, auth.generate())
    processes: list[subprocess.Popen] = []
    engine = None
    try:
        if kind == "workers0":
            engine = cep.Engine.local(workers=0)
        elif kind == "workers2":
            engine = cep.Engine.local(workers=2)
        else:
            processes, infos = start_workers(*(["--listen", "127.0.0.1:0", "--name", f"api-w{i}", "--token-file",
                                                str(token_file)] for i in range(2)), log=log)
            engine = cep.Engine.local(instance_managers=[i["address"] for i in infos], token=auth.read(token_file))
        yield Api(kind, engine)
    finally:
        if engine is not None:
            engine.close()
        stop(processes)


_stops: list = []  # how to stop the directory's cluster, once its last test ran


@pytest.fixture(scope="session")
def cluster(zookeeper, tmp_path_factory):
    """The ``cluster`` kind: an orchestrator and two workers joining a fresh root of the session's ZooKeeper,
    shared by this directory's modules (its start is seconds) and stopped after its last test."""
    home = tmp_path_factory.mktemp("api-cluster")
    token_file, log = home / "token", home / "stderr.log"
    auth.write(token_file, auth.generate())
    zk = f"{zookeeper}/api{uuid.uuid4().hex[:8]}"
    processes = [start("orchestrator", "--zk", zk, "--name", "o1", "--token-file", str(token_file), log=log)]
    engines = []

    def stop_all():
        for engine in engines:
            engine.close()
        stop(processes)
    _stops.append(stop_all)
    try:
        workers, _ = start_workers(*(["--zk", zk, "--name", f"w{i + 1}", "--cpus", str(i), "--listen", "127.0.0.1:0",
                                      "--token-file", str(token_file)] for i in range(2)), log=log)
        processes += workers
        engines.append(engine := cep.Engine.connect(f"zk://{zk}", token_file=str(token_file)))
        wait(lambda: len(engine.instance_managers()) == 2, "the cluster's engine host to adopt both workers")
        yield Api("cluster", engine, zk, str(token_file))
    finally:
        _stop_cluster()


def _stop_cluster() -> None:
    while _stops:
        _stops.pop()()


def pytest_runtest_teardown(item, nextitem):
    """The cluster stops with the directory's last test, not at the end of the whole run."""
    if nextitem is None or nextitem.path.parent != item.path.parent:
        _stop_cluster()
