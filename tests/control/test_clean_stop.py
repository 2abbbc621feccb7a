"""Clean ends: Ctrl-C (SIGINT) or SIGTERM stops ``sparkcep worker``, ``sparkcep orchestrator`` and
``sparkcep engine-host`` within 5 s, with exit code 0 and no traceback, whether ZooKeeper answers or
is down.

Two clusters on a ZooKeeper server of this test (each: three engine hosts, two workers, two
orchestrators, o1 leading), started together; every process of the first is signalled at once (each
kind gets SIGINT in one process and SIGTERM in another), then ZooKeeper is stopped and the second is
signalled the same way; an orchestrator started again on the first founds a new data path. A third cluster, an orchestrator alone with the engine hosts it started, gets
SIGTERM with ZooKeeper down: it is the last orchestrator, so it stops them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from zk_harness import ROOT

from sparkcep import auth
from sparkcep.control import tree
from sparkcep.control.registry import State, ZkRegistry
from sparkcep.control.zookeeper import ZooKeeperServer
from sparkcep.runtime.worker_start import Starting, wait_ready
from harness import wait

STOP_S = 5.0
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, *sys.path]))
SIGNALS = {"h1": signal.SIGINT, "h2": signal.SIGTERM, "h3": signal.SIGTERM, "w1": signal.SIGINT,
           "w2": signal.SIGTERM, "o2": signal.SIGINT, "o1": signal.SIGTERM}


def ctrl_c_delivered() -> None:
    """In the child, before exec: SIGINT as in a terminal's foreground process. A test run started in the
    background (``nohup``, ``&``) has it ignored, and an ignored SIGINT is inherited."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Cluster:
    """The processes of one cluster on ``hosts``/``root``, each logging to ``<work>/<name>.log``."""

    def __init__(self, hosts: str, root: str, work, token_file):
        self.zk, self.work, self.token_file = f"{hosts}{root}", work, token_file
        self.registry = ZkRegistry(hosts, root, session_timeout=2.0)
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, *argv: str) -> None:
        kind = argv[0]
        with open(self.work / f"{name}.log", "wb") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "sparkcep", *argv, "--zk", self.zk, "--name", name, "--token-file",
                 str(self.token_file)], env=ENV, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if kind == "worker" else subprocess.DEVNULL, stderr=log,
                preexec_fn=ctrl_c_delivered)

    def start_all(self) -> None:
        """Engine hosts first (registered, the leader starts none of its own), workers, then o1 and o2."""
        for h in ("h1", "h2", "h3"):
            self.start(h, "engine-host")
        for i, w in enumerate(("w1", "w2")):
            self.start(w, "worker", "--cpus", str(i), "--listen", "127.0.0.1:0")

    def settle(self) -> None:
        wait_ready([Starting(self.procs[w], f"worker {w}") for w in ("w1", "w2")])
        wait(lambda: len(self.registry.children(tree.HOSTS)) == 3, "three engine hosts registered")
        self.start("o1", "orchestrator")
        wait(lambda: self.registry.leader(tree.LEASE) == "o1", "o1 to lead")
        self.start("o2", "orchestrator")
        wait(lambda: len(self.registry.children(tree.ORCHESTRATORS)) == 2, "o2 to join")
        wait(lambda: self.registry.get(tree.ENGINE), "a primary engine host")

    def stop(self, signals: dict) -> dict[str, tuple]:
        """Send each process its signal at once; per process, (exit code, seconds it took to exit, tracebacks
        in its log); a process still running a second past the bound has code None."""
        t0 = time.monotonic()
        for name, sig in signals.items():
            self.procs[name].send_signal(sig)
        took: dict[str, float] = {}
        while len(took) < len(self.procs) and time.monotonic() - t0 < STOP_S + 1:
            for name, p in self.procs.items():
                if name not in took and p.poll() is not None:
                    took[name] = round(time.monotonic() - t0, 2)
            time.sleep(0.02)
        return {name: (p.poll(), took.get(name), (self.work / f"{name}.log").read_text(errors="replace")
                       .count("Traceback")) for name, p in self.procs.items()}

    def kill(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(10)
            if p.stdout is not None:
                p.stdout.close()
        self.registry.close()


def test_an_orchestrator_started_after_the_cluster_stopped_founds_a_new_data_path(clusters):
    """The last orchestrator stopped the engine hosts and left their data path recorded: one started again
    found it lost (no host held its journal) and the cluster answered ENGINE_NOT_FOUND for good."""
    clusters.stopped(False)
    cluster = clusters.clusters[False]
    former = cluster.registry.get(tree.ENGINE) or {}
    assert cluster.registry.get(tree.DATAPATH) is None
    cluster.start("o4", "orchestrator")
    try:
        wait(lambda: (cluster.registry.get(tree.ENGINE) or {}).get("run") not in (None, former.get("run")),
             "a new data path", 60)
    finally:
        code, took, tracebacks = cluster.stop({"o4": signal.SIGTERM})["o4"]
    assert code == 0 and not tracebacks, (code, took, tracebacks)


@pytest.mark.parametrize("zookeeper_down", [False, True], ids=["zookeeper-up", "zookeeper-down"])
def test_ctrl_c_and_sigterm_stop_every_cluster_process_cleanly(clusters, zookeeper_down):
    got = clusters.stopped(zookeeper_down)
    bad = {name: r for name, r in got.items() if r[0] != 0 or r[1] is None or r[1] > STOP_S or r[2]}
    assert not bad, f"(exit code, seconds, tracebacks) of those that did not stop cleanly: {bad}; all: {got}"


def test_the_last_orchestrator_stops_the_engine_hosts_it_started_with_zookeeper_down(clusters):
    clusters.stopped(True)
    (code, took, tracebacks), left = clusters.alone, clusters.orphans
    assert code == 0 and took is not None and took <= STOP_S and not tracebacks and not left, (clusters.alone, left)


class Clusters:
    """Clusters on one ZooKeeper server of their own: ``clusters[False]`` is stopped with ZooKeeper up,
    ``clusters[True]`` once ZooKeeper is down, and with it a third one, an orchestrator alone with the
    engine hosts it started (``alone``: its exit code, seconds and tracebacks; ``orphans``: the pids of
    those hosts still running 2 s after it exited)."""

    def __init__(self, work):
        self.work, self.results = work, {}
        self.token_file = auth.write(work / "token", auth.generate())
        self.server = ZooKeeperServer()
        self.hosts = self.server.start(timeout=60)
        self.clusters: dict = {}
        self.alone, self.orphans, self.started = None, [], []

    def start(self) -> None:
        for key, root in ((False, "up"), (True, "down"), ("alone", "alone")):
            (self.work / root).mkdir()
            self.clusters[key] = Cluster(self.hosts, f"/{root}", self.work / root, self.token_file)
        self.clusters["alone"].start("o3", "orchestrator")
        for down in (False, True):
            self.clusters[down].start_all()
        for down in (False, True):
            self.clusters[down].settle()
        registry = self.clusters["alone"].registry
        wait(lambda: len(registry.children(tree.HOSTS)) == 3, "the engine hosts of o3")
        self.started = [registry.get(tree.host(n))["pid"] for n in registry.children(tree.HOSTS)]

    def stopped(self, zookeeper_down: bool) -> dict[str, tuple]:
        """What :meth:`Cluster.stop` says of that cluster (stopped at the first call; the one of ZooKeeper up
        first: ZooKeeper stays down)."""
        if zookeeper_down and False not in self.results:
            self.stopped(False)
        if zookeeper_down not in self.results:
            if zookeeper_down:
                self.server.stop()
                wait(lambda: self.clusters[True].registry.state is not State.CONNECTED,
                     "the sessions to be cut", 10)
            alone = threading.Thread(target=self._stop_alone)
            if zookeeper_down:
                alone.start()
            self.results[zookeeper_down] = self.clusters[zookeeper_down].stop(SIGNALS)
            if zookeeper_down:
                alone.join()
        return self.results[zookeeper_down]

    def _stop_alone(self) -> None:
        self.alone = self.clusters["alone"].stop({"o3": signal.SIGTERM})["o3"]
        time.sleep(2)
        self.orphans = [pid for pid in self.started if running(pid)]

    def close(self) -> None:
        for cluster in self.clusters.values():
            cluster.kill()
        for pid in self.started:
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        self.server.stop()


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def clusters(tmp_path_factory):
    """Both clusters, started together and settled."""
    made = Clusters(tmp_path_factory.mktemp("clean-stop"))
    try:
        made.start()
        yield made
    finally:
        made.close()
