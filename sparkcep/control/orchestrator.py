"""The orchestrator (UPM-CEP §4.1): deploys queries and keeps the cluster's data path staffed.

Several may run; they contend for the ``orchestrator`` lease and one leads.
Its state is the registry's, so when it dies (its session ends, within the
session timeout) a standby takes the lease and carries on from the registry
alone. The leader acts only while connected and holding the lease, and its
writes are checked against its lease node (a write of a deposed leader
fails). It:

* keeps :data:`ENGINE_HOSTS` engine-host processes running
  (:mod:`sparkcep.control.host`: a primary, its standby, a spare ready to be
  the next standby), starting more when fewer are registered, and reaps
  the ones it started when they end;
* takes the deploy and undeploy requests that clients leave under
  ``/requests`` (sealed with the cluster's token: one without a valid seal is
  refused), has the primary run them (riding through its fail-over),
  answers under ``/results`` and records each deployment under
  ``/deployments`` (sealed query, options, placement, state), and where
  each stream's source and each output's log live under ``/streams`` and
  ``/outputs`` — recorded again from the primary when the registry lost
  them (a ZooKeeper restarted empty);
* reports instance managers that died, with the instances they ran, under
  ``/events`` and in its log.

The data path never goes through it. Every orchestrator can serve the
cluster's metrics in Prometheus text (``--metrics``).
"""

from __future__ import annotations

import argparse
import base64
import logging
import os
import signal
import socket
import threading
import time
import uuid

import cloudpickle

from sparkcep import auth
from sparkcep.control import host as engine_host
from sparkcep.control import tree
from sparkcep.control.connect import DataPath
from sparkcep.control.registry import Registry, RegistryError, State, open_registry
from sparkcep.errors import SparkcepError
from sparkcep.gateway.client import EngineClient
from sparkcep.runtime.cluster import METRICS_TIMEOUT_S

log = logging.getLogger("sparkcep")
REFRESH_S = 2.0  # how often the leader records placements and figures, and counts engine hosts
ENGINE_HOSTS = 3  # a primary, its standby and a spare
START_S = 30.0  # an engine host it started registers within this long, or it is started again
REGISTER_AGAIN_S = 5.0  # after a registry outage its engine hosts register again within this long of its lead
DEATH_S = 3.0  # a member gone this long is reported dead
LEAVE_S = 3.0  # a leaving orchestrator waits this long for the others to leave: past a session (2 s) of a dead one


class Orchestrator:
    """One orchestrator process: ``name`` in ``registry`` (``zk`` is its address, for the engine hosts)."""

    def __init__(self, registry: Registry, zk: str, name: str, token_file: str, metrics: str | None = None):
        self.registry, self.zk, self.name, self.token_file = registry, zk, name, token_file
        self.token = auth.read(token_file)
        self.stopped = threading.Event()
        self.leading = threading.Event()
        self.path = DataPath(zk, self.token)
        self._hosted: dict[str, list[str]] = {}  # member -> instances it ran, as last seen
        self._members: set[str] = set()
        self._started: dict[str, tuple[float, object]] = {}  # engine hosts it started: name -> (when, process)
        self._surplus_counts = 0  # counts in a row that found more than ENGINE_HOSTS registered
        self._alone, self._looked = False, 0.0  # whether it saw no other orchestrator, when it looked last
        self.metrics_address = None
        if metrics:
            from sparkcep.control.prometheus import serve
            self._metrics_server, self.metrics_address = serve(self._engine_metrics, metrics)
        doc = {"name": name, "pid": os.getpid(), "host": socket.gethostname(), "metrics": self.metrics_address}
        try:
            self.presence = registry.keep(f"{tree.ORCHESTRATORS}/{name}", doc)
        except RegistryError as e:
            if e.code != "NODE_EXISTS":
                raise
            raise RegistryError(f"an orchestrator named {name!r} is already running", "ORCHESTRATOR_EXISTS") from None
        self.lease = registry.lease(tree.LEASE, name, on_lost=self.leading.clear)
        self.lease.contend(on_gained=self.leading.set)

    # --- leading -----------------------------------------------------------------------
    def run(self) -> None:
        """Serve until :attr:`stopped`: lead while holding the lease, contend again after a lost session."""
        while not self.stopped.is_set():
            self._reap()
            self._look_around()
            if not self.leading.wait(0.2):
                if not self.lease.contending and self.registry.state is State.CONNECTED:
                    self._contend()
                continue
            try:
                self._lead()
            except SparkcepError as e:
                log.warning("orchestrator %s: %s [%s]; trying again", self.name, e, e.code)
                self.stopped.wait(1.0)

    def _contend(self) -> None:
        """Contend for the lease again (a lost session ended the contention), unless stopping: :meth:`close`
        releases the lease and the registry closes meanwhile (a contention begun then raised
        RegistryError, session closed, with a traceback in a clean stop)."""
        try:
            if not self.stopped.is_set():
                self.lease.contend(on_gained=self.leading.set)
        except RegistryError:
            if not self.stopped.is_set():
                raise

    def _acting(self) -> bool:
        """Whether it may act now: leading, connected, not stopping (a suspended session acts on nothing)."""
        return self.leading.is_set() and self.lease.is_leader and not self.stopped.is_set()

    def _lead(self) -> None:
        log.info("orchestrator %s leads %s", self.name, self.zk)
        self._event({"kind": "leader", "orchestrator": self.name})
        pending = threading.Event()
        requests = self.registry.watch_children(tree.REQUESTS, lambda _: pending.set())
        members = self.registry.watch_children(tree.MEMBERS, self._membership)
        try:
            # with a data path recorded, its engine hosts may have lost their sessions with this one's (a registry
            # outage): counted before they register again, they would be started anew (three more processes)
            next_refresh = time.monotonic() + REGISTER_AGAIN_S if self.registry.get(tree.DATAPATH) else 0.0
            while self.leading.is_set() and not self.stopped.is_set():
                self._reap()
                self._look_around()
                if not self._acting():
                    time.sleep(0.1)
                    continue
                if time.monotonic() > next_refresh:
                    self._staff()
                    self._refresh()
                    next_refresh = time.monotonic() + REFRESH_S
                if pending.wait(0.2):
                    pending.clear()
                    for name in sorted(self.registry.children(tree.REQUESTS)):
                        if self._acting():
                            self._handle(name)
        finally:
            requests.cancel()
            members.cancel()

    def _guarded(self):
        """A transaction that applies only while this orchestrator holds the lease."""
        node = self.lease.node
        if node is None:
            raise RegistryError(f"orchestrator {self.name} holds no lease node: it leads no more", "LEASE_LOST")
        return self.registry.transaction().check(node, 0)

    # --- the engine hosts --------------------------------------------------------------
    def _staff(self) -> None:
        """Start engine hosts until :data:`ENGINE_HOSTS` are registered (counting those starting); stop the
        spares beyond them that two counts in a row find.

        A registry pause ends every session: the engine hosts register again
        one by one, and one counted missing meanwhile is started anew. Without
        the stop, each pause left one more idle spare running.
        """
        registered = set(self.registry.children(tree.HOSTS))
        now = time.monotonic()
        starting = [n for n, (t, p) in self._started.items()
                    if n not in registered and now - t < START_S and p.poll() is None]
        for _ in range(ENGINE_HOSTS - len(registered) - len(starting)):
            name = f"h-{uuid.uuid4().hex[:8]}"
            log.info("orchestrator %s: %d engine hosts registered: starting %s", self.name, len(registered), name)
            self._started[name] = (now, engine_host.spawn(self.zk, self.token_file, name))
        surplus = len(registered) - ENGINE_HOSTS
        self._surplus_counts = self._surplus_counts + 1 if surplus > 0 else 0
        if self._surplus_counts >= 2:
            self._stop_spares(registered, surplus)

    def _stop_spares(self, registered: set[str], n: int) -> None:
        """Stop ``n`` spare engine hosts of ``registered``: neither the primary nor the standby it syncs."""
        primary, datapath = self.registry.get(tree.ENGINE) or {}, self.registry.get(tree.DATAPATH) or {}
        busy = {primary.get("name"), datapath.get("standby")}
        docs = [d for name in sorted(registered - busy) if (d := self.registry.get(tree.host(name)))]
        for doc in [d for d in docs if d.get("role") == "spare"][:n]:
            log.info("orchestrator %s: %d engine hosts registered: stopping spare %s", self.name, len(registered),
                     doc["name"])
            try:
                with EngineClient(doc["address"], token=self.token, timeout=2) as c:
                    c.shutdown()
            except SparkcepError as e:
                log.warning("orchestrator %s: spare engine host %s did not stop: %s", self.name, doc["name"], e)
        self._surplus_counts = 0

    def _look_around(self) -> None:
        """Note whether other orchestrators run (every :data:`REFRESH_S`): with the registry unreachable at
        its stop, this orchestrator goes by what it saw last."""
        if time.monotonic() - self._looked > REFRESH_S and self.registry.state is State.CONNECTED:
            try:
                self._alone = not [o for o in self.registry.children(tree.ORCHESTRATORS) if o != self.name]
                self._looked = time.monotonic()
            except RegistryError:
                pass

    def _others_staying(self) -> list[str]:
        """The other orchestrators still registered once this one left, waiting up to :data:`LEAVE_S` for
        them to go: those stopped at the same time leave, and one that died lately goes with its session;
        each that stops then sees none and stops the engine hosts (a second stop is harmless). Looking
        once, 0.3 s after leaving, two orchestrators stopped 1.5 s after the leader was killed each saw
        the dead one, and the engine hosts ran on for 60 s."""
        deadline = time.monotonic() + LEAVE_S
        while (others := [o for o in self.registry.children(tree.ORCHESTRATORS) if o != self.name]) and \
                time.monotonic() < deadline:
            time.sleep(0.1)
        return others

    def _end_data_path(self) -> None:
        """Forget the data path the engine hosts held once all of them left (within :data:`LEAVE_S`): the
        cluster was stopped, not lost, and an orchestrator started later founds a new one. Left as it is
        while one stays, which may hold its journal."""
        deadline = time.monotonic() + LEAVE_S
        try:
            while (left := self.registry.children(tree.HOSTS)) and time.monotonic() < deadline:
                time.sleep(0.1)
            if left:
                log.warning("orchestrator %s: engine hosts %s did not stop: the data path stays recorded",
                            self.name, ", ".join(left))
                return
            self.registry.delete(tree.DATAPATH)
        except RegistryError as e:
            if e.code != "NO_NODE":
                log.warning("orchestrator %s: leaving: %s", self.name, e)

    def _reap(self) -> None:
        """Collect the exit of the engine hosts it started that ended (no zombie is left behind)."""
        for name, (_, process) in list(self._started.items()):
            code = process.poll()
            if code is not None:
                del self._started[name]
                if code:
                    log.warning("orchestrator %s: engine host %s exited with code %d", self.name, name, code)

    # --- requests ----------------------------------------------------------------------
    def _handle(self, name: str) -> None:
        path = f"{tree.REQUESTS}/{name}"
        doc = self.registry.get(path)
        if doc is None:
            return
        try:
            request = auth.unseal(doc, self.token, "a request")
            answer = self._deploy(request) if request.get("kind") == "deploy" else self._undeploy(request)
            result = {"ok": True, **answer}
        except SparkcepError as e:
            if not self._acting():
                return  # deposed meanwhile: the next leader answers it
            result = {"ok": False, "error": str(e), "code": e.code, "type": type(e).__name__}
            log.warning("orchestrator %s: request %s failed: %s [%s]", self.name, name, e, e.code)
        with self._guarded() as t:
            t.set(f"{tree.RESULTS}/{name}", result)
            t.delete(path)

    def _deploy(self, request: dict) -> dict:
        query = cloudpickle.loads(base64.b64decode(request["query"]))
        options = request.get("options", {})
        tries = []

        def deploy(client):
            tries.append(1)
            try:
                return client.deploy(query, **options)
            except SparkcepError as e:  # a retry after the primary took it and failed over: it is there
                if e.code != "ALREADY_DEPLOYED" or len(tries) == 1:
                    raise
                return {"deployment": client.request("deployed", query=query.name)[0]["deployment"],
                        "streams": sorted(query.sources), "outputs": sorted(query.outputs)}
        answer, client = self.path.call(f"deploy of {query.name!r}", deploy)
        client.close()
        self._record(query.name, request["query"], options, answer)
        log.info("orchestrator %s: deployed %s (%s)", self.name, query.name, answer["deployment"])
        self._refresh()
        return {"deployment": answer["deployment"], "streams": answer["streams"], "outputs": answer["outputs"]}

    def _record(self, name: str, sealed_query: str, options: dict, answer: dict) -> None:
        """Record a deployment, its streams and outputs (sealed: only token holders read the query)."""
        record = auth.seal({"query": sealed_query, "options": options, "deployment": answer["deployment"],
                            "streams": answer["streams"], "outputs": answer["outputs"]}, self.token, "a deployment")
        with self._guarded() as t:
            t.set(f"{tree.DEPLOYMENTS}/{name}", record)
            for s in answer["streams"]:
                t.set(f"{tree.STREAMS}/{s}", {"query": name})
            for o in answer["outputs"]:
                t.set(f"{tree.OUTPUTS}/{o}", {"query": name, "deployment": answer["deployment"]})

    def _undeploy(self, request: dict) -> dict:
        name = request["query"]
        tries = []

        def undeploy(client):
            tries.append(1)
            try:
                client.undeploy(name)
            except SparkcepError as e:  # a retry after the primary took it and failed over: it is gone
                if e.code != "UNKNOWN_QUERY" or len(tries) == 1:
                    raise
        self.path.call(f"undeploy of {name!r}", undeploy)[1].close()
        record = self.registry.get(f"{tree.DEPLOYMENTS}/{name}") or {}
        nodes = [f"{tree.STREAMS}/{s}" for s in record.get("streams", [])] + \
                [f"{tree.OUTPUTS}/{o}" for o in record.get("outputs", [])]
        with self._guarded() as t:
            for node in nodes:
                if self.registry.get(node) is not None:
                    t.delete(node)
        try:  # the registry may have lost it (a ZooKeeper restarted empty)
            self.registry.delete(f"{tree.DEPLOYMENTS}/{name}", recursive=True)
        except RegistryError as e:
            if e.code != "NO_NODE":
                raise
        return {"query": name}

    # --- the cluster -------------------------------------------------------------------
    def _refresh(self) -> None:
        """Record each deployment's state, placement and figures as the primary serves them now, and what
        each instance manager runs; deployments the registry lost are recorded again. Nothing while a
        host takes over: until it has replayed them all, the queries it serves are not all there are."""
        try:
            (metrics, ims), client = self.path.call("refresh", lambda c: (c.metrics(), c.instance_managers()))
        except SparkcepError as e:
            log.info("orchestrator %s: no data path to look at now: %s", self.name, e)
            return
        with client:  # closed however this ends
            if metrics.get("role", "primary") != "primary":  # it serves only the queries replayed so far
                log.info("orchestrator %s: the data path is %s: deployments left as recorded", self.name,
                         metrics["role"])
                return
            now = time.time()
            queries = metrics.get("queries", {})
            for q in set(self.registry.children(tree.DEPLOYMENTS)) - set(queries):  # gone with an undeploy elsewhere
                self.registry.delete(f"{tree.DEPLOYMENTS}/{q}", recursive=True)
            for q, m in queries.items():
                if self.registry.get(f"{tree.DEPLOYMENTS}/{q}") is None:
                    header, payload = client.request("deployed", query=q)
                    query = cloudpickle.loads(memoryview(payload))
                    self._record(q, base64.b64encode(bytes(payload)).decode(), {},
                                 {"deployment": header["deployment"], "streams": sorted(query.sources),
                                  "outputs": sorted(query.outputs)})
                    log.info("orchestrator %s: recorded %s again from the data path", self.name, q)
                self.registry.set(f"{tree.DEPLOYMENTS}/{q}/metrics", {
                    "time": now, "state": m.get("state", "running"),
                    **{k: m.get(k) for k in ("rows_in", "rows_out", "input_rate", "throughput", "latency_ms")}})
        self._hosted = {im["name"]: im["instances"] for im in ims}  # a dead one's too: its death is reported
        placement: dict[str, dict[str, list[str]]] = {}  # query -> instance -> where each replica runs it
        for im in ims:
            for inst in im["instances"] if im.get("alive", True) else ():
                q, _, where = inst.partition(".")
                placement.setdefault(q, {}).setdefault(where, []).append(im["name"])
        for instances in placement.values():
            for hosts in instances.values():
                hosts.sort()
        for q in queries:
            path = f"{tree.DEPLOYMENTS}/{q}/placement"
            if self.registry.get(path) != placement.get(q, {}):
                self.registry.set(path, placement.get(q, {}))

    def _membership(self, names: list[str]) -> None:
        """Instance managers joined or left. One that left and is not back within :data:`DEATH_S` (a member
        whose session expired in a ZooKeeper pause comes back at once) is reported dead with what it ran."""
        now = set(names)
        for gone in sorted(self._members - now):
            threading.Timer(DEATH_S, self._gone, args=(gone, self._hosted.get(gone, []))).start()
        for joined in sorted(now - self._members):
            log.info("orchestrator %s: instance manager %s joined", self.name, joined)
        self._members = now

    def _gone(self, name: str, ran: list[str]) -> None:
        if name in self._members or not self._acting():
            return
        log.warning("orchestrator %s: instance manager %s died; it ran %s", self.name, name,
                    ", ".join(ran) or "no instances")
        self._event({"kind": "died", "instance_manager": name, "instances": ran})

    def _event(self, doc: dict) -> None:
        if self._acting() or doc.get("kind") == "leader":
            self.registry.create(f"{tree.EVENTS}/e-", {**doc, "time": time.time()}, sequence=True)

    def _engine_metrics(self) -> dict:
        doc = self.registry.get(tree.ENGINE)
        if doc is None:
            return {}
        # the engine host waits up to METRICS_TIMEOUT_S for instance managers that do not answer, then
        # names them: wait longer than that, or a stopped worker takes every other figure with it
        with EngineClient(doc["address"], token=self.token, timeout=METRICS_TIMEOUT_S + 10) as c:
            return c.metrics()

    def close(self) -> None:
        """Leave the cluster; the last orchestrator to leave stops the engine hosts (and their queries) and
        forgets their data path, so that one started later founds a new one. Bounded: with the registry unreachable, one that saw no other orchestrator last stops the engine
        hosts it started (the others stop by themselves, :meth:`~sparkcep.control.datapath.roles.Roles.orphaned`)."""
        self.stopped.set()
        connected = self.registry.state is State.CONNECTED
        hosts, last = [], False
        if connected:
            try:
                self.lease.release()
                self.presence.cancel()
                last = not self._others_staying()
                if last:
                    hosts = [d for n in self.registry.children(tree.HOSTS) if (d := self.registry.get(tree.host(n)))]
            except RegistryError as e:
                log.warning("orchestrator %s: leaving: %s", self.name, e)
        elif self._alone and self._started:  # the registry does not answer: it was the last one it saw
            log.info("orchestrator %s: the last orchestrator leaves, the registry unreachable: stopping the engine "
                     "hosts it started", self.name)
            for _, process in self._started.values():
                process.terminate()
        if hosts:
            log.info("orchestrator %s: the last orchestrator leaves: stopping the engine hosts", self.name)
        for doc in hosts:
            try:
                with EngineClient(doc["address"], token=self.token, timeout=2) as c:
                    c.shutdown()
            except SparkcepError as e:
                log.warning("orchestrator %s: engine host %s did not stop: %s", self.name, doc.get("name"), e)
        if last:  # one it started that has not registered yet would found a data path of its own after
            told = {doc.get("name") for doc in hosts}
            for name, (_, process) in self._started.items():
                if name not in told and process.poll() is None:
                    log.info("orchestrator %s: stopping engine host %s, still starting", self.name, name)
                    process.terminate()
        deadline = time.monotonic() + 3.0
        for _, process in self._started.values():
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except Exception:
                pass
        self._reap()
        if last:
            self._end_data_path()
        if self.metrics_address:
            self._metrics_server.shutdown()
        self.path.close()
        self.registry.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--zk", required=True, metavar="HOST:PORT/PATH", help="the cluster's ZooKeeper and root path")
    parser.add_argument("--name", required=True, help="this orchestrator's name in the cluster")
    parser.add_argument("--token-file", required=True, help="the cluster's token (every process holds it)")
    parser.add_argument("--metrics", default=None, metavar="HOST:PORT",
                        help="serve the cluster's metrics in Prometheus text at http://HOST:PORT/metrics")


def zk_address(value: str) -> str:
    """``HOST:PORT/PATH`` or ``zk://HOST:PORT/PATH`` as the registry's address."""
    return value if value.startswith("zk://") else f"zk://{value}"


def run(args) -> int:
    """Body of ``sparkcep orchestrator``: lead or stand by until SIGTERM or Ctrl-C (stopping within seconds,
    the registry up or not)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s orchestrator %(message)s")
    logging.getLogger("kazoo").setLevel(logging.WARNING)  # not a line per connection attempt
    zk = zk_address(args.zk)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        token = auth.read(args.token_file)
        orch = Orchestrator(open_registry(zk, session_timeout=2.0, timeout=3.0, token=token), zk, args.name,
                            args.token_file, args.metrics)
    except SparkcepError as e:
        log.error("%s [%s]", e, e.code)
        return 1
    log.info("orchestrator %s (pid %d) joined %s%s", args.name, os.getpid(), zk,
             f"; metrics at http://{orch.metrics_address}/metrics" if orch.metrics_address else "")
    worker = threading.Thread(target=orch.run, name="sparkcep-orchestrator", daemon=True)
    worker.start()
    while not stop.wait(0.2) and worker.is_alive():
        pass
    orch.close()
    log.info("orchestrator %s stopped", args.name)
    return 0
