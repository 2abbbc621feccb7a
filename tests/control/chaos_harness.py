"""A cluster of real processes to break: ZooKeeper, orchestrators, workers, engine hosts; faults on demand.

:class:`Cluster` starts what the README's "A cluster on one machine" starts
(``sparkcep zookeeper``'s server on a port of its own, so it can be paused
and restarted empty on the same port; ``sparkcep orchestrator`` x2;
``sparkcep worker --zk`` x3), and injects one fault at a time:

* ``primary`` / ``standby``: SIGKILL the engine host that is the data path's
  primary (``/engine``) or its standby (``/datapath``);
* ``leader``: SIGKILL the orchestrator holding the lease (another one is
  started under a new name, as a supervisor would);
* ``worker``: SIGKILL a worker running instances (a new one joins under a
  new name, as the Spark launcher does);
* ``pause``: SIGSTOP ZooKeeper for ``pause_s``, then SIGCONT;
* ``outage``: stop ZooKeeper for ``pause_s``, then start it again with its data;
* ``restart``: stop ZooKeeper and start it again empty on the same port.

:meth:`Cluster.stop` ends everything with SIGTERM and returns what is left
of the cluster: processes whose command line names its registry, and
shared-memory entries of its processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness import wait
from zk_harness import ROOT

from sparkcep import auth
from sparkcep.control import tree
from sparkcep.control.registry import ZkRegistry
from sparkcep.control.zookeeper import ZooKeeperServer

FAULTS = ("primary", "standby", "leader", "worker", "pause", "outage", "restart")


class Cluster:
    """The processes of one cluster under ``work`` (logs, token); ``workers`` members, 2 orchestrators."""

    def __init__(self, work: Path, workers: int = 3, pause_s: float = 10.0):
        self.work, self.pause_s = Path(work), pause_s
        self.token_file = auth.write(self.work / "token", auth.generate())
        self.zk_server = ZooKeeperServer(data_dir=self.work / "zookeeper")
        self.zk_hosts = self.zk_server.start(timeout=60)
        self.zk = f"zk://{self.zk_hosts}/chaos"
        self.procs: dict[str, subprocess.Popen] = {}
        self._names = iter(range(1, 1 << 30))
        self.registry = ZkRegistry(self.zk_hosts, "/chaos", session_timeout=2.0, timeout=30,
                                   token=auth.read(self.token_file))
        for _ in range(2):
            self.add("orchestrator")
        for _ in range(workers):
            self.add("worker")

    def add(self, kind: str) -> str:
        """Start one more orchestrator or worker; its name."""
        name = f"{kind[0]}{next(self._names)}"
        args = ["--zk", self.zk, "--name", name, "--token-file", str(self.token_file)]
        if kind == "worker":
            args += ["--listen", "127.0.0.1:0", "--cpus", str(len(self.procs) % 2)]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, *sys.path]))
        with open(self.work / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen([sys.executable, "-m", "sparkcep", kind, *args], env=env,
                                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        return name

    # --- what runs where ---------------------------------------------------------------------
    def primary(self) -> dict | None:
        return self.registry.get(tree.ENGINE)

    def host(self, name: str | None) -> dict | None:
        return self.registry.get(tree.host(name)) if name else None

    def standby(self) -> dict | None:
        return self.host((self.registry.get(tree.DATAPATH) or {}).get("standby"))

    def leader(self) -> str | None:
        return self.registry.leader(tree.LEASE)

    def members(self) -> list[str]:
        return self.registry.children(tree.MEMBERS)

    def settled(self) -> bool:
        """Whether the cluster is whole again: a primary serving with a synced standby of its era, three
        engine hosts, the workers it had."""
        engine, datapath = self.primary(), self.registry.get(tree.DATAPATH) or {}
        standby = self.host(datapath.get("standby"))
        primary = self.host((engine or {}).get("name"))
        return bool(engine and primary and standby and primary.get("role") == "primary"
                    and standby.get("role") == "standby" and standby.get("era") == engine.get("era")
                    and len(self.registry.children(tree.HOSTS)) >= 3 and len(self.members()) >= 3)

    # --- faults ---------------------------------------------------------------------------------
    def fault(self, kind: str, pick=None) -> str:
        """Inject one fault of ``kind`` (:data:`FAULTS`); what it hit. ``pick(names)`` chooses a worker."""
        if kind in ("primary", "standby"):
            doc = wait(self.primary if kind == "primary" else self.standby, f"a {kind} engine host")
            os.kill(doc["pid"], signal.SIGKILL)
            return f"{kind} {doc['name']} (pid {doc['pid']})"
        if kind == "leader":
            name = wait(self.leader, "a leading orchestrator")
            self.procs[name].kill()
            self.procs[name].wait(10)
            self.add("orchestrator")
            return f"leader {name}"
        if kind == "worker":
            # right after a ZooKeeper pause, the workers' documents of their former sessions go when those
            # expire, and come back a moment later (Presence): none may be listed for that moment
            live = wait(lambda: [n for n in self.members() if n in self.procs and self.procs[n].poll() is None],
                        "a worker listed as a member", 10)
            name = (pick or min)(live)
            self.procs[name].kill()
            self.procs[name].wait(10)
            self.add("worker")
            return f"worker {name}"
        if kind == "pause":
            os.kill(self.zk_server.process.pid, signal.SIGSTOP)
            time.sleep(self.pause_s)
            os.kill(self.zk_server.process.pid, signal.SIGCONT)
            return f"ZooKeeper paused {self.pause_s:.0f} s"
        if kind == "outage":
            self.zk_server.stop()
            time.sleep(self.pause_s)
            self.zk_server.start(timeout=60)
            return f"ZooKeeper stopped {self.pause_s:.0f} s, then started again with its data"
        if kind == "restart":
            port = self.zk_server.port
            self.zk_server.stop()
            self.zk_server = ZooKeeperServer(port=port)
            self.zk_server.start(timeout=60)
            return "ZooKeeper restarted empty"
        raise ValueError(f"unknown fault {kind!r}; faults: {FAULTS}")

    def story(self, lines: int = 120) -> str:
        """The last ``lines`` of what the orchestrators and engine hosts logged (not kazoo's chatter), in time
        order: what a failed run shows."""
        said = []
        for log in self.work.glob("*.log"):
            said += [line for line in log.read_text(errors="replace").splitlines()
                     if line[:4].isdigit() and "kazoo" not in line and "Connecting to" not in line]
        return "\n".join(sorted(said)[-lines:])

    # --- the end ---------------------------------------------------------------------------------
    def stop(self, timeout: float = 30.0) -> dict:
        """SIGTERM every process (orchestrators first: the last one stops the engine hosts), wait; what is
        left: ``processes`` (command lines naming this cluster) and ``shm`` (entries of its processes)."""
        pids = {p.pid for p in self.procs.values()} | self.engine_host_pids()
        for name, p in sorted(self.procs.items(), key=lambda kv: not kv[0].startswith("o")):
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + timeout
        for p in self.procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        while self._left() and time.monotonic() < deadline:
            time.sleep(0.2)
        left = {"processes": self._left(), "shm": [e for e in os.listdir("/dev/shm")
                                                   if any(f"-{pid}-" in e for pid in pids)]}
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
        self.registry.close()
        self.zk_server.stop()
        return left

    def engine_host_pids(self) -> set[int]:
        """The pids of this cluster's engine-host processes running now."""
        return {int(line.split()[0]) for line in self._ps() if "engine-host" in line}

    def _left(self) -> list[str]:
        return [line for line in self._ps()]

    def _ps(self) -> list[str]:
        out = subprocess.run(["ps", "-ww", "-eo", "pid,stat,args"], capture_output=True, text=True).stdout.splitlines()
        return [line.strip() for line in out if self.zk in line and " Z" not in line.split(None, 2)[1:2][0:1]]

