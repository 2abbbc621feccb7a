"""The orchestrator (UPM-CEP §4.1): deploys queries and records the cluster in the registry.

Several may run; they contend for the ``orchestrator`` lease and one leads.
Its state is the registry's, so when it dies (its session ends, within the
session timeout) a standby takes the lease and carries on from the registry
alone. The leader:

* makes sure the cluster has an engine host (:mod:`sparkcep.control.host`),
  starting one if none announced itself;
* takes the deploy and undeploy requests that clients leave under
  ``/requests`` (sealed with the cluster's token: one without a valid seal is
  refused), has the engine host run them, answers under ``/results`` and
  records each deployment under ``/deployments`` (sealed query, options,
  placement, bin tables), where each stream's source and each output's log
  live under ``/streams`` and ``/outputs``;
* reports instance managers that died, with the instances they ran, under
  ``/events`` and in its log.

The data path never goes through it: clients send to and read from the
engine host. Every orchestrator can serve the cluster's metrics in
Prometheus text (``--metrics``).
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

import cloudpickle

from sparkcep import auth
from sparkcep.control import host as engine_host
from sparkcep.control import tree
from sparkcep.gateway.client import EngineClient
from sparkcep.control.registry import Registry, RegistryError, State, open_registry
from sparkcep.errors import SparkcepError

log = logging.getLogger("sparkcep")
REFRESH_S = 2.0  # how often the leader records placements and bin tables


class Orchestrator:
    """One orchestrator process: ``name`` in ``registry`` (``zk`` is its address, for the engine host)."""

    def __init__(self, registry: Registry, zk: str, name: str, token_file: str, metrics: str | None = None):
        self.registry, self.zk, self.name, self.token_file = registry, zk, name, token_file
        self.token = auth.read(token_file)
        self.stopped = threading.Event()
        self.leading = threading.Event()
        self.client: EngineClient | None = None
        self._hosted: dict[str, list[str]] = {}  # member -> instances it ran, as last seen
        self._members: set[str] = set()
        self.metrics_address = None
        if metrics:
            from sparkcep.control.prometheus import serve
            self._metrics_server, self.metrics_address = serve(self._engine_metrics, metrics)
        self._lost = threading.Event()  # the session ended: join again once a new one is up
        self._join()
        self.lease = registry.lease(tree.LEASE, name, on_lost=self._demoted)
        self.lease.contend(on_gained=self.leading.set)

    def _join(self, timeout: float = 30.0) -> None:
        """Announce this orchestrator (waiting for a former session's node of the same name to expire)."""
        doc = {"name": self.name, "pid": os.getpid(), "host": socket.gethostname(), "metrics": self.metrics_address}
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.registry.create(f"{tree.ORCHESTRATORS}/{self.name}", doc, ephemeral=True)
                return
            except RegistryError as e:
                if e.code != "NODE_EXISTS" or time.monotonic() > deadline:
                    raise RegistryError(f"an orchestrator named {self.name!r} is already running: {e}",
                                        "ORCHESTRATOR_EXISTS") from None
                time.sleep(0.2)

    def _demoted(self) -> None:
        """The registry session ended: lead no more; rejoin with the next session."""
        self.leading.clear()
        self._lost.set()

    # --- leading -----------------------------------------------------------------------
    def run(self) -> None:
        """Serve until :attr:`stopped`: lead while holding the lease, wait for it otherwise."""
        while not self.stopped.is_set():
            if not self.leading.wait(0.2):
                if self._lost.is_set() and self.registry.state is State.CONNECTED:
                    self._lost.clear()
                    self._join()
                    self.lease.contend(on_gained=self.leading.set)
                continue
            try:
                self._lead()
            except SparkcepError as e:
                log.warning("orchestrator %s: %s [%s]; trying again", self.name, e, e.code)
                time.sleep(1.0)

    def _lead(self) -> None:
        log.info("orchestrator %s leads %s", self.name, self.zk)
        self._event({"kind": "leader", "orchestrator": self.name})
        self.client = EngineClient(self._engine()["address"], token=self.token)
        pending = threading.Event()
        requests = self.registry.watch_children(tree.REQUESTS, lambda _: pending.set())
        members = self.registry.watch_children(tree.MEMBERS, self._membership)
        try:
            next_refresh = 0.0
            while self.leading.is_set() and not self.stopped.is_set():
                if pending.wait(0.2):
                    pending.clear()
                    for name in sorted(self.registry.children(tree.REQUESTS)):
                        self._handle(name)
                if time.monotonic() > next_refresh:
                    self._refresh()
                    next_refresh = time.monotonic() + REFRESH_S
        finally:
            requests.cancel()
            members.cancel()
            self.client.close()

    def _engine(self) -> dict:
        """The cluster's engine host, started if there is none."""
        doc = self.registry.get(tree.ENGINE)
        if doc is None:
            log.info("orchestrator %s: no engine host: starting one", self.name)
            engine_host.spawn(self.zk, self.token_file)
            doc = engine_host.wait_for(self.registry)
        return doc

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
            result = {"ok": False, "error": str(e), "code": e.code, "type": type(e).__name__}
            log.warning("orchestrator %s: request %s failed: %s [%s]", self.name, name, e, e.code)
        with self.registry.transaction() as t:
            t.set(f"{tree.RESULTS}/{name}", result)
            t.delete(path)

    def _deploy(self, request: dict) -> dict:
        query = cloudpickle.loads(base64.b64decode(request["query"]))
        answer = self.client.deploy(query, **request.get("options", {}))
        record = auth.seal({"query": request["query"], "options": request.get("options", {}),
                            "deployment": answer["deployment"], "streams": answer["streams"],
                            "outputs": answer["outputs"]}, self.token, "a deployment")
        engine = self.registry.get(tree.ENGINE) or {}
        with self.registry.transaction() as t:
            t.set(f"{tree.DEPLOYMENTS}/{query.name}", record)
            for s in answer["streams"]:
                t.set(f"{tree.STREAMS}/{s}", {"engine": engine.get("address"), "query": query.name})
            for o in answer["outputs"]:
                t.set(f"{tree.OUTPUTS}/{o}", {"engine": engine.get("address"), "query": query.name,
                                              "deployment": answer["deployment"]})
        log.info("orchestrator %s: deployed %s (%s)", self.name, query.name, answer["deployment"])
        self._refresh()
        return answer

    def _undeploy(self, request: dict) -> dict:
        name = request["query"]
        self.client.undeploy(name)
        record = self.registry.get(f"{tree.DEPLOYMENTS}/{name}") or {}
        with self.registry.transaction() as t:
            for s in record.get("streams", []):
                t.delete(f"{tree.STREAMS}/{s}")
            for o in record.get("outputs", []):
                t.delete(f"{tree.OUTPUTS}/{o}")
        self.registry.delete(f"{tree.DEPLOYMENTS}/{name}", recursive=True)
        return {"query": name}

    # --- the cluster -------------------------------------------------------------------
    def _refresh(self) -> None:
        """Record each deployment's placement and figures, and what each instance manager runs."""
        queries = self.client.metrics().get("queries", {})
        for q, m in queries.items():
            if self.registry.get(f"{tree.DEPLOYMENTS}/{q}") is not None:
                self.registry.set(f"{tree.DEPLOYMENTS}/{q}/metrics", {
                    k: m.get(k) for k in ("rows_in", "rows_out", "input_rate", "throughput", "latency_ms")})
        ims = self.client.instance_managers()
        self._hosted = {im["name"]: im["instances"] for im in ims}
        placement: dict[str, dict] = {}
        for im in ims:
            for inst in im["instances"]:
                q, _, where = inst.partition(".")
                placement.setdefault(q, {})[where] = im["name"]
        for q, where in placement.items():
            path = f"{tree.DEPLOYMENTS}/{q}/placement"
            if self.registry.get(f"{tree.DEPLOYMENTS}/{q}") is not None and self.registry.get(path) != where:
                self.registry.set(path, where)

    def _membership(self, names: list[str]) -> None:
        """Instance managers joined or died: a death is reported with what it ran."""
        now = set(names)
        for gone in sorted(self._members - now):
            ran = self._hosted.get(gone, [])
            log.warning("orchestrator %s: instance manager %s died; it ran %s", self.name, gone,
                        ", ".join(ran) or "no instances")
            self.registry.call_soon(lambda g=gone, r=ran: self._event({"kind": "died", "instance_manager": g,
                                                                       "instances": r}))
        for joined in sorted(now - self._members):
            log.info("orchestrator %s: instance manager %s joined", self.name, joined)
        self._members = now

    def _event(self, doc: dict) -> None:
        self.registry.create(f"{tree.EVENTS}/e-", {**doc, "time": time.time()}, sequence=True)

    def _engine_metrics(self) -> dict:
        doc = self.registry.get(tree.ENGINE)
        if doc is None:
            return {}
        with EngineClient(doc["address"], token=self.token, timeout=10) as c:
            return c.metrics()

    def close(self) -> None:
        """Leave the cluster; the last orchestrator to leave stops the engine host (and its queries)."""
        self.stopped.set()
        self.lease.release()
        others = [o for o in self.registry.children(tree.ORCHESTRATORS) if o != self.name]
        engine = self.registry.get(tree.ENGINE)
        if not others and engine is not None:
            log.info("orchestrator %s: the last orchestrator leaves: stopping the engine host", self.name)
            try:
                with EngineClient(engine["address"], token=self.token, timeout=10) as c:
                    c.shutdown()
            except SparkcepError as e:
                log.warning("orchestrator %s: the engine host did not stop: %s", self.name, e)
        if self.metrics_address:
            self._metrics_server.shutdown()
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
    """Body of ``sparkcep orchestrator``: lead or stand by until SIGTERM."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s orchestrator %(message)s")
    zk = zk_address(args.zk)
    try:
        orch = Orchestrator(open_registry(zk, session_timeout=2.0), zk, args.name, args.token_file, args.metrics)
    except SparkcepError as e:
        log.error("%s [%s]", e, e.code)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: orch.stopped.set())
    log.info("orchestrator %s (pid %d) joined %s%s", args.name, os.getpid(), zk,
             f"; metrics at http://{orch.metrics_address}/metrics" if orch.metrics_address else "")
    try:
        orch.run()
    except KeyboardInterrupt:
        pass
    except RegistryError as e:
        log.error("%s [%s]", e, e.code)
    orch.close()
    log.info("orchestrator %s stopped", args.name)
    return 0
