"""A client of a cluster's engine: what ``sparkcep.Engine.connect("zk://HOST:PORT/PATH", token=...)`` returns.

Deploys go through the leading orchestrator (sealed requests in the
registry); sends and reads go straight to where the registry says each
stream's source and each output's log live — the engine host — never
through an orchestrator, so they go on while one fails over. Several
clients may send to one stream: the engine host takes each send whole, in
one order of sequence numbers for the cluster.
"""

from __future__ import annotations

import base64
import threading
import time

import cloudpickle
import pyarrow as pa

from sparkcep import auth
from sparkcep.control import tree
from sparkcep.gateway.client import EngineClient
from sparkcep.gateway.discovery import EngineNotFoundError
from sparkcep.control.registry import open_registry
from sparkcep.core.columns import SEQ
from sparkcep.errors import EngineError

REQUEST_TIMEOUT_S = 120.0  # a deploy waits this long for an orchestrator to answer
REGISTRY_TIMEOUT_S = 10.0  # to reach a cluster's registry to find its engine host
POLL_S = 0.05


def engine_address(zk: str) -> str:
    """``host:port`` of the engine host of the cluster whose registry is at ``zk``; EngineNotFoundError
    ``ENGINE_NOT_FOUND`` when it has none, RegistryError when the registry cannot be read."""
    with open_registry(zk, timeout=REGISTRY_TIMEOUT_S) as registry:
        doc = registry.get(tree.ENGINE)
    if not doc:
        raise EngineNotFoundError(f"the cluster at {zk} has no engine host (its registry holds no {tree.ENGINE}: "
                                  "is an orchestrator running?)", "ENGINE_NOT_FOUND")
    return doc["address"]


class ConnectedEngine:
    """The engine of the cluster whose registry is at ``address`` (``zk://...``), reached with ``token``."""

    def __init__(self, address: str, token: str, timeout: float = 30.0):
        self.address, self.token = address, token
        self.registry = open_registry(address)
        deadline = time.monotonic() + timeout
        while (doc := self.registry.get(tree.ENGINE)) is None:
            if time.monotonic() > deadline:
                self.registry.close()
                raise EngineError(f"the cluster at {address} has no engine host (is an orchestrator running?)",
                                  "ENGINE_NOT_FOUND")
            time.sleep(POLL_S)
        self.client = EngineClient(doc["address"], token=token)
        self.client.hello()  # proves the token now, not at the first send
        self._subscriptions: list[threading.Event] = []

    # --- control: through the leading orchestrator -------------------------------------------
    def deploy(self, query, **options) -> dict:
        """Have the leading orchestrator deploy ``query`` (``Engine.deploy``'s options); returns its
        ``deployment`` id, ``explain`` text, ``streams`` and ``outputs``."""
        doc = {"kind": "deploy", "query": base64.b64encode(cloudpickle.dumps(query)).decode(), "options": options}
        return self._request(doc, f"deploy of {query.name!r}")

    def undeploy(self, name: str) -> None:
        self._request({"kind": "undeploy", "query": name}, f"undeploy of {name!r}")

    def _request(self, doc: dict, what: str) -> dict:
        path = self.registry.create(f"{tree.REQUESTS}/r-", auth.seal(doc, self.token, "a request"), sequence=True)
        result_path = f"{tree.RESULTS}/{path.rpartition('/')[2]}"
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        while (result := self.registry.get(result_path)) is None:
            if time.monotonic() > deadline:
                raise EngineError(f"{what}: no orchestrator answered within {REQUEST_TIMEOUT_S:.0f} s "
                                  f"(leader: {self.registry.leader(tree.LEASE)!r})", "NO_ORCHESTRATOR")
            time.sleep(POLL_S)
        self.registry.delete(result_path)
        if not result.get("ok"):
            raise EngineError(f"{what}: {result.get('error')}", result.get("code"))
        return result

    # --- data: straight to the engine host ---------------------------------------------------
    def send(self, stream: str, data) -> int:
        """Send a pyarrow Table/RecordBatch (or a dict of columns) into ``stream``, whole or not at all."""
        if not isinstance(data, (pa.Table, pa.RecordBatch)):
            data = pa.table(data)
        return self.client.send(stream, data)

    def end(self, stream: str) -> None:
        self.client.end(stream)

    def collect(self, output: str) -> pa.Table:
        """Every retained row of ``output`` now."""
        return pa.concat_tables(self._rows(output, self.client.offsets(output)["earliest"]) or
                                [self._empty(output)])

    def subscribe(self, output: str, callback, on_error=None, every: float = POLL_S) -> threading.Event:
        """Call ``callback(pyarrow.Table)`` with the rows ``output`` produces from now on (read as they
        arrive, on a thread of its own); ``on_error(error)`` once if reading fails. Set the returned
        event to stop."""
        stop = threading.Event()
        self._subscriptions.append(stop)

        def follow():
            with EngineClient(self.client.address, token=self.token) as c:
                try:
                    at = c.offsets(output)["latest"]
                    while not stop.wait(every):
                        for table in self._rows(output, at, c):
                            callback(table)
                except EngineError as e:
                    if on_error is not None and not stop.is_set():
                        on_error(e)
        threading.Thread(target=follow, name=f"sparkcep-subscribe-{output}", daemon=True).start()
        return stop

    def _rows(self, output: str, start: dict, client: EngineClient | None = None) -> list[pa.Table]:
        """The rows of ``output`` from positions ``start`` to its latest ones; moves ``start`` there."""
        c = client or self.client
        offsets = c.offsets(output)
        out = []
        for p, end in sorted(offsets["latest"].items()):
            s = start.get(p, offsets["earliest"].get(p, 0))
            if end > s:
                rows = c.read(output, p, s, end, engine=offsets["engine"], deployment=offsets["deployment"])
                out.append(rows.drop_columns([SEQ]))
            start[p] = end
        return out

    def _empty(self, output: str) -> pa.Table:
        fields = self.client.schema(output)["fields"]
        from sparkcep.schema import as_schema
        return as_schema(fields).to_arrow().empty_table()

    def metrics(self) -> dict:
        return self.client.metrics()

    def instance_managers(self) -> list[dict]:
        return self.client.instance_managers()

    def streams(self) -> dict:
        """Where each stream's source and each output's log live, as the registry says."""
        return {"streams": {s: self.registry.get(f"{tree.STREAMS}/{s}") for s in self.registry.children(tree.STREAMS)},
                "outputs": {o: self.registry.get(f"{tree.OUTPUTS}/{o}") for o in self.registry.children(tree.OUTPUTS)}}

    def close(self) -> None:
        for stop in self._subscriptions:
            stop.set()
        self.client.close()
        self.registry.close()

    def __enter__(self) -> "ConnectedEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
