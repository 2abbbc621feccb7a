"""An engine host: a process of a cluster's data path, primary, standby or spare (DESIGN §6).

The leading orchestrator keeps a few of them running (``sparkcep
engine-host``, detached). Each keeps ``/hosts/<name>`` in the registry and
serves an endpoint; their roles (:mod:`sparkcep.control.datapath.roles`):

* the **primary** runs the cluster's :class:`sparkcep.Engine` over the
  instance managers that are members (each one that joins is adopted), at
  ``/engine``: the sources, the staged micro-batches, the output logs. What
  it takes goes into its journal and to its standby before it is
  acknowledged (:mod:`sparkcep.control.datapath.journal`). It serves only
  while its registry session is connected: when the session is suspended or
  lost it stops answering changes (``NOT_PRIMARY``), before a successor can
  be chosen;
* the **standby** holds the primary's journal (:mod:`.datapath.backup`)
  and takes over when the primary's session ends: it deploys the recorded
  queries on the members and replays the recorded input, its output logs
  holding every row the primary published;
* a **spare** waits to be made a standby.

A host whose cluster is gone (:meth:`~sparkcep.control.datapath.roles.Roles.orphaned`:
no orchestrator for a minute, no registry for ten) stops, freeing its
shared memory; a deposed primary (a successor took a later era) stops too.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import uuid

from sparkcep import auth
from sparkcep.control import tree
from sparkcep.control.datapath.backup import Backup, replay
from sparkcep.control.datapath.journal import Journal
from sparkcep.control.datapath.roles import Roles
from sparkcep.control.registry import RegistryError, State, open_registry
from sparkcep.errors import EngineError, SparkcepError

log = logging.getLogger("sparkcep")
SESSION_S = 2.0  # the registry session timeout of an engine host
WAIT_WORKERS_S = 60.0  # a deployment waits this long for enough instance managers to join
SERVES_ALWAYS = frozenset({"hello", "metrics", "instance_managers", "shutdown", "journal"})
READS = frozenset({"streams", "schema", "offsets", "read", "deployed"})


class EngineHost:
    """One engine-host process of the cluster whose registry is at ``zk``, reached with ``token``."""

    def __init__(self, zk: str, token: str, name: str, listen: str = "127.0.0.1:0"):
        from sparkcep.engine import Engine
        from sparkcep.gateway.endpoint import start_endpoint
        self.zk, self.token, self.name = zk, token, name
        self.stopped = threading.Event()
        self.registry = open_registry(zk, session_timeout=SESSION_S, token=token)
        self.engine = Engine(token=token)
        self.engine.wait_workers_s = WAIT_WORKERS_S
        self.engine._cluster().asked = True  # queries run on the members, never in this process
        self.endpoint = start_endpoint(self.engine, listen, publish=False)
        self.endpoint.guard = self._guard
        self.endpoint.on_shutdown = self.stopped.set
        self.endpoint._ops["journal"] = self._journal_op
        for op in ("deploy", "deployment"):
            self.endpoint._ops[op] = self._members_first(self.endpoint._ops[op])
        self.backup = Backup()
        self.adopted: dict[str, str] = {}  # member name -> address
        self._unusable: dict[str, str] = {}  # member name -> the address its adoption failed at
        self._adopting = threading.Lock()
        self._members_watch = None
        self.roles = Roles(self.registry, name, self._doc, self)
        self.endpoint.role = lambda: self.roles.role  # in metrics: the orchestrator waits out a take-over

    # --- what the endpoint serves when ---------------------------------------------------
    def _guard(self, op: str) -> None:
        if op in SERVES_ALWAYS or self.roles.serving() or (op in READS and self.roles.role == "primary"):
            return
        raise EngineError(f"engine host {self.name} is not the cluster's serving data path now ({self.roles.role}"
                          f"{'' if self.registry.state is State.CONNECTED else ', registry ' + self.registry.state.value}"
                          "): find the primary at /engine and try again", "NOT_PRIMARY")

    def _journal_op(self, h, payload):
        """An entry from the primary this host stands by for."""
        if self.roles.role == "primary":
            raise EngineError(f"engine host {self.name} is the primary now: it takes no journal", "FENCED")
        self.backup.apply(int(h.get("era", 0)), h, payload)
        if h.get("kind") == "ready":
            self.roles.synced(self.backup.era, self.backup.run)
        return {}, b""

    def _members_first(self, op):
        """``op``, placing instances (a deploy, a rescale) only once every member the registry names is
        adopted: the members watch adopts in a thread of its own, maybe not yet (a deploy asked as a worker
        joins, or as this host becomes the primary, would leave that worker out)."""
        def placing_on_every_member(h, payload):
            if h.get("op") == "deploy" or h.get("method") == "rescale":
                self.adopt_members(again=False)
            return op(h, payload)
        return placing_on_every_member

    def _doc(self) -> dict:
        return {"name": self.name, "address": self.endpoint.address, "pid": os.getpid(), "host": socket.gethostname()}

    # --- becoming the primary -------------------------------------------------------------
    def found(self, era: int, run: str) -> None:
        """Serve a new cluster (nothing recorded yet)."""
        self.engine.run_id = run
        self._serve(Journal(era, run, self.token))

    def take_over(self, era: int) -> None:
        """Serve what the standby holds: deploy and replay it on the members (waiting for as many as it
        needs, however long: the data path is here and nowhere else)."""
        self._follow_members()
        replicas = [e["options"].get("replicas") or 1 for e in self.backup.entries if e["kind"] == "deploy"]
        while True:
            try:
                self.engine._await_workers(max(replicas, default=1))
                break
            except EngineError as e:
                log.warning("engine host %s: taking over waits for instance managers: %s", self.name, e)
        self.adopt_members(again=False)  # the replay places instances: on every member, the watch's pass done or not
        log.info("engine host %s: replaying %d entries on %d instance managers", self.name,
                 len(self.backup.entries), len(self.adopted))
        replay(self.backup, self.engine)
        self.endpoint.staging = self.backup.staging
        self.engine.sent = self.backup.sent_ids()
        self._serve(Journal(era, self.backup.run, self.token, self.backup.entries, self.backup.last_deployment))

    def _serve(self, journal: Journal) -> None:
        journal.outputs, journal.staging = self.engine.outputs, self.endpoint.staging
        for log_ in self.engine.outputs.values():
            log_.journal = journal
        self.engine.journal = journal
        self._follow_members()

    def _follow_members(self) -> None:
        """Adopt the members now and each one that joins (once)."""
        if self._members_watch is None:
            self._members_watch = self.registry.watch_children(tree.MEMBERS, lambda names: threading.Thread(
                target=self.adopt_members, daemon=True).start())

    def adopt_members(self, again: bool = True) -> None:
        """Use every member not adopted yet (a worker that joined) for the next placements; not ``again`` one
        whose adoption failed at the address it has now (a placement does not wait on an unreachable one)."""
        with self._adopting:
            try:
                self._adopt(self.registry.children(tree.MEMBERS), again)
            except RegistryError as e:  # the registry closed meanwhile (this host stops), or is cut off
                log.info("engine host %s: members not read now: %s", self.name, e)

    def _adopt(self, names: list[str], again: bool) -> None:
        cluster = self.engine.cluster
        for name in sorted(names):
            info = self.registry.get(tree.member(name))
            if not info or cluster.by_name(name) is not None:  # gone, or served already (its node came back
                continue                                       # in a new session: the same worker)
            if not again and self._unusable.get(name) == info.get("address"):
                continue
            try:
                self.engine.add_instance_manager(info["address"])
                self.adopted[name] = info["address"]
                self._unusable.pop(name, None)
                log.info("engine host %s: instance manager %s (%s) joined", self.name, name, info["address"])
            except SparkcepError as e:
                self._unusable[name] = info.get("address")
                log.warning("engine host %s: cannot use member %s at %s: %s [%s]", self.name, name,
                            info.get("address"), e, e.code)

    # --- ending ----------------------------------------------------------------------------
    def close(self) -> None:
        if self._members_watch is not None:
            self._members_watch.cancel()
        self.roles.close()
        if self.engine.journal is not None:
            self.engine.journal.close()
        self.endpoint.close()
        self.engine.close()
        self.registry.close()


def spawn(zk: str, token_file: str, name: str, listen: str = "127.0.0.1:0") -> subprocess.Popen:
    """Start an engine host ``name`` for the cluster at ``zk``, in a session of its own (it outlives the
    process that starts it, which reaps it if it ends first)."""
    cmd = [sys.executable, "-m", "sparkcep", "engine-host", "--zk", zk, "--token-file", token_file,
           "--name", name, "--listen", listen]
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--zk", required=True, metavar="zk://HOST:PORT/PATH", help="the cluster's registry")
    parser.add_argument("--token-file", required=True, help="the cluster's token")
    parser.add_argument("--name", default=None, help="its name among the cluster's engine hosts (default: h-RANDOM)")
    parser.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT",
                        help="where clients reach the engine (default: loopback, any free port)")


def run(args) -> int:
    """Body of ``sparkcep engine-host`` (started by the leading orchestrator): serve until stopped."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s engine-host %(message)s")
    logging.getLogger("kazoo").setLevel(logging.WARNING)  # not a line per connection attempt
    zk = args.zk if args.zk.startswith("zk://") else f"zk://{args.zk}"
    name = args.name or f"h-{uuid.uuid4().hex[:8]}"
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # kill -USR1 <pid>: where is it stuck?
    try:
        host = EngineHost(zk, auth.read(args.token_file), name, args.listen)
    except SparkcepError as e:
        log.error("%s [%s]", e, e.code)
        return 1
    log.info("engine host %s (pid %d) serves at %s for %s", name, os.getpid(), host.endpoint.address, zk)
    while not (stop.wait(0.2) or host.stopped.is_set() or host.roles.deposed.is_set()):
        if why := host.roles.orphaned():
            log.warning("engine host %s: %s: its cluster is gone; stopping", name, why)
            break
    host.close()
    log.info("engine host %s stopped", name)
    return 0

