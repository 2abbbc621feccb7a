"""A client of a cluster's engine: what ``sparkcep.Engine.connect("zk://HOST:PORT/PATH", token=...)`` returns.

:class:`ConnectedEngine` offers the methods of :class:`sparkcep.Engine` with
the same arguments, results and error codes. Deploys go through the leading
orchestrator (sealed requests in the registry); everything else goes
straight to the cluster's data path, the engine host the registry names at
``/engine`` (:class:`DataPath`), never through an orchestrator.

**Riding through failures.** When the data path does not answer, or
answers that it no longer serves (``NOT_PRIMARY``: a standby, or a host
that lost its registry session), a call finds it again in the registry and
tries again, for up to ``retry_s`` seconds (default 30). Every retry is
idempotent: a send carries a send id, and the engine takes a send id once;
reads name positions; ends and commits may be repeated. A data path that hangs
(a stopped process keeps its connections open) is left as soon as the
registry names another one: a call waiting on it is ended and tried there.
Past the bound the
call raises ``DATA_PATH_UNREACHABLE``; for a send it says whether the rows
were taken (``SEND_NOT_TAKEN``: no attempt reached the engine) or may have
been (``SEND_UNCONFIRMED``: send the same data again with the same
``send_id`` to find out, it is never taken twice).
"""

from __future__ import annotations

import base64
import logging
import threading
import time
import uuid

import cloudpickle
import pyarrow as pa

from sparkcep import auth
from sparkcep.arguments import checked, function, seconds
from sparkcep.control import tree
from sparkcep.control.registry import RegistryError, open_registry
from sparkcep.core.columns import SEQ
from sparkcep.errors import EngineError, QueryError, SparkcepError, UnknownStreamError
from sparkcep.gateway.client import EngineClient
from sparkcep.gateway.deployed import ClientDeployed, options_to_wire
from sparkcep.gateway.discovery import EngineNotFoundError
from sparkcep.runtime.output_log import Subscription
from sparkcep.runtime.send_ids import send_id_of

REQUEST_TIMEOUT_S = 120.0  # a deploy waits this long for an orchestrator to answer
REGISTRY_TIMEOUT_S = 10.0  # to reach a cluster's registry to find its engine host
RETRY_S = 30.0  # a call rides through a data path's failure this long before it raises
POLL_S = 0.05
HANG_CHECK_S = 0.5  # a call waiting this long looks at the registry: has another engine host taken over?
MEMBERS_WAIT_S = 60.0  # a deploy waits this long for the instance managers it needs to join
SETTLE_S = 3.0  # and, once it has them, for more to spread on, while they keep joining
log = logging.getLogger("sparkcep")
RETRYABLE = ("NOT_PRIMARY", "NO_STANDBY", "FENCED", "REGISTRY_UNREACHABLE")  # the data path moves: ask again


def engine_address(zk: str) -> str:
    """``host:port`` of the engine host of the cluster whose registry is at ``zk``; EngineNotFoundError
    ``ENGINE_NOT_FOUND`` when it has none, RegistryError when the registry cannot be read."""
    with open_registry(zk, timeout=REGISTRY_TIMEOUT_S) as registry:
        doc = registry.get(tree.ENGINE)
        if not doc:
            raise EngineNotFoundError(f"the cluster at {zk} has no data path: {no_data_path(registry)}",
                                      "ENGINE_NOT_FOUND")
    return doc["address"]


def no_data_path(registry) -> str:
    """Why the registry names no data path at ``/engine``: none yet (or a take-over under way), or one lost
    for good (no engine host holds the journal of the run ``/datapath`` names)."""
    last = registry.get(tree.DATAPATH)
    if last:
        hosts = [registry.get(tree.host(n)) for n in registry.children(tree.HOSTS)]
        if not any(h and h.get("run") == last.get("run") for h in hosts):
            return (f"its data path (run {last.get('run')}, era {last.get('era')}) is lost: no engine host holds its "
                    "journal (the primary and its standby are gone), so none can take over")
    return "the registry names no engine host now (is an orchestrator running?)"


def retryable(error: SparkcepError) -> bool:
    """Does ``error`` say the data path moved or is moving (ask the registry, try again)?"""
    return isinstance(error, EngineNotFoundError) or error.code in RETRYABLE


class DataPath:
    """The data path of the cluster whose registry is at ``zk``: clients of wherever ``/engine`` says it
    serves now, found again when it moves."""

    def __init__(self, zk: str, token: str, retry_s: float = RETRY_S, registry_s: float | None = None):
        self.zk, self.token, self.retry_s = zk, token, retry_s
        self.registry = open_registry(zk, session_timeout=2.0, token=token,
                                      timeout=REGISTRY_TIMEOUT_S if registry_s is None else registry_s)
        self._address: str | None = None
        self._lock = threading.Lock()
        self._waiting: dict[EngineClient, float] = {}  # clients with a call under way -> since when
        self._closed = threading.Event()
        threading.Thread(target=self._watch, name="sparkcep-datapath-watch", daemon=True).start()

    def address(self, deadline: float) -> str:
        """Where the data path serves now, waiting for the registry to name one until ``deadline``."""
        with self._lock:
            if self._address is not None:
                return self._address
        while True:
            why = None
            try:
                doc = self.registry.get(tree.ENGINE)
            except RegistryError as e:  # the registry is down or restarting: it comes back, or the deadline
                doc, why = None, f"the registry does not answer ({e.code})"
            if doc:
                with self._lock:
                    self._address = doc["address"]
                    return self._address
            if time.monotonic() > deadline:
                try:
                    why = why or no_data_path(self.registry)
                except RegistryError as e:
                    why = f"the registry does not answer ({e.code})"
                raise EngineNotFoundError(f"the cluster at {self.zk} has no data path: {why}", "ENGINE_NOT_FOUND")
            time.sleep(POLL_S)

    def moved(self, address: str) -> None:
        """The data path at ``address`` failed: look it up again next time."""
        with self._lock:
            if self._address == address:
                self._address = None

    def client(self, deadline: float | None = None) -> EngineClient:
        """A new client of the data path as it is now (the caller closes it)."""
        deadline = time.monotonic() + self.retry_s if deadline is None else deadline
        return EngineClient(self.address(deadline), token=self.token)

    def call(self, what: str, fn, client: EngineClient | None = None):
        """``fn(client)`` on the data path, retried on a new connection wherever the registry says it serves
        now, until ``retry_s`` seconds have passed; returns ``(result, client used)``, which the caller
        closes. When it raises, a client it opened is closed (``client`` stays the caller's)."""
        deadline = time.monotonic() + self.retry_s
        last: SparkcepError | None = None
        given = client
        while True:
            try:
                if client is None:
                    client = self.client(deadline)
                with self._lock:
                    self._waiting[client] = time.monotonic()
                try:
                    return fn(client), client
                finally:
                    with self._lock:
                        self._waiting.pop(client, None)
            except SparkcepError as e:
                if not retryable(e):
                    if client is not None and client is not given:
                        client.close()
                    raise
                last = e
                if client is not None:
                    self.moved(client.address)
                    client.close()
                    client = None
            if time.monotonic() > deadline:
                raise EngineError(f"{what}: the cluster's data path did not answer for {self.retry_s:.0f} s "
                                  f"(last: {last} [{last.code}])", "DATA_PATH_UNREACHABLE")
            time.sleep(POLL_S)

    def _watch(self) -> None:
        """End the calls waiting on an engine host that the registry no longer names (it hangs while another
        one serves): they are tried again there."""
        while not self._closed.wait(HANG_CHECK_S):
            now = time.monotonic()
            with self._lock:
                waiting = [c for c, since in self._waiting.items() if now - since > HANG_CHECK_S]
            if not waiting:
                continue
            try:
                doc = self.registry.get(tree.ENGINE)
            except RegistryError:
                continue
            for client in waiting:
                if doc and doc["address"] != client.address:
                    log.warning("the data path at %s does not answer and %s serves now: trying there",
                                client.address, doc["address"])
                    self.moved(client.address)
                    client.abort(f"another engine host serves at {doc['address']} now")

    def close(self) -> None:
        self._closed.set()
        self.registry.close()


class ConnectedEngine:
    """The engine of the cluster whose registry is at ``address`` (``zk://...``), reached with ``token``.

    ``retry_s``: how long a call rides through a failure of the data path
    before it raises (see the module's docstring); ``registry_s``: how long to wait for
    the registry to answer at first (default REGISTRY_TIMEOUT_S; ``Engine.connect``: ``retry_s`` if longer).
    """

    def __init__(self, address: str, token: str, retry_s: float = RETRY_S, registry_s: float | None = None):
        self.address, self.token = address, token
        self.path = DataPath(address, token, retry_s, registry_s)
        self.registry = self.path.registry
        self._lock = threading.Lock()  # one request at a time on the shared client
        try:
            # ENGINE_NOT_FOUND if the registry names no data path within retry_s; one it names may have
            # just died (a fail-over under way): the hello, which proves the token now, rides through it
            self.client = self.path.client()
            _, self.client = self.path.call("connect", lambda client: client.hello(), self.client)
        except BaseException:
            self.path.close()
            raise
        self._subscriptions: list[Subscription] = []
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("the engine is closed", "CLOSED")

    def _call(self, what: str, fn):
        """``fn(client)`` on the data path, riding through its failures (:meth:`DataPath.call`)."""
        self._check_open()
        with self._lock:
            result, self.client = self.path.call(what, fn, self.client)
        return result

    def _call_apart(self, what: str, fn):
        """:meth:`_call` on a connection of its own: a call that may wait long (metrics wait up to 10 s for an
        instance manager that does not answer) holds up no send or read of other threads meanwhile."""
        self._check_open()
        client = self.path.client()
        try:
            result, client = self.path.call(what, fn, client)
            return result
        finally:
            client.close()

    # --- control: through the leading orchestrator -------------------------------------------
    @checked(QueryError)
    def deploy(self, query, parallelism=1, bins: int = 128, retain=True, balance: bool = False,
               replicas: int = 1) -> ClientDeployed:
        """Have the leading orchestrator deploy ``query`` (:meth:`sparkcep.Engine.deploy`'s options); returns
        the deployed query, as ``Engine.local(...).deploy`` does."""
        from sparkcep.query.query import Query
        if not isinstance(query, Query):
            raise QueryError(f"deploy() takes a Query, got {type(query).__name__}")
        options = options_to_wire({"parallelism": parallelism, "bins": bins, "retain": retain, "balance": balance,
                                   "replicas": replicas})
        replicas = options["replicas"] if isinstance(options["replicas"], int) else 1
        spread = max(options["parallelism"].values(), default=1) if isinstance(options["parallelism"], dict) \
            else options["parallelism"]
        self._await_members(replicas, replicas * spread if isinstance(spread, int) else replicas)
        doc = {"kind": "deploy", "query": base64.b64encode(cloudpickle.dumps(query)).decode(), "options": options}
        result = self._request(doc, f"deploy of {query.name!r}")
        return ClientDeployed(result["deployment"], query, self.path)

    def _await_members(self, needed: int, wanted: int) -> None:
        """Wait until ``needed`` instance managers are members (one per replica), and then, to spread the
        instances, until ``wanted`` are, or none joined for :data:`SETTLE_S` (workers started together join
        within seconds of each other); saying so every 3 s while fewer than ``needed`` joined.
        NOT_ENOUGH_WORKERS naming how many joined if fewer than ``needed`` did within :data:`MEMBERS_WAIT_S`."""
        self._check_open()
        deadline, told, last, seen = time.monotonic() + MEMBERS_WAIT_S, time.monotonic(), time.monotonic(), -1
        while True:
            joined, now = len(self.registry.children(tree.MEMBERS)), time.monotonic()
            if joined != seen:
                last, seen = now, joined
            if joined >= wanted or (joined >= needed and (now - last > SETTLE_S or now > deadline)):
                return
            if now > deadline:  # the data path would wait as long again before saying so
                raise EngineError(f"{joined} of the {needed} instance managers needed serve this engine after "
                                  f"{MEMBERS_WAIT_S:.0f} s (start more: sparkcep worker)", "NOT_ENOUGH_WORKERS")
            if joined < needed and now - told > 3:  # with enough, it waits at most SETTLE_S more: nothing to say
                told = now
                log.warning("waiting for instance managers to join the cluster: %d joined, %d needed (up to %.0f "
                            "s more)", joined, needed, deadline - now)
            time.sleep(POLL_S)

    def deployment(self, name: str) -> ClientDeployed:
        """The deployed query ``name``, as :meth:`deploy` returned it."""
        def ask(client):
            return client.request("deployed", query=name)
        header, payload = self._call(f"deployment {name!r}", ask)
        return ClientDeployed(header["deployment"], cloudpickle.loads(memoryview(payload)), self.path)

    def undeploy(self, name: str) -> None:
        self._request({"kind": "undeploy", "query": name}, f"undeploy of {name!r}")

    def _request(self, doc: dict, what: str) -> dict:
        self._check_open()
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
            raise (QueryError if result.get("type") == "QueryError" else EngineError)(  # a local engine's words
                result.get("error"), result.get("code"))
        return result

    # --- data: straight to the data path -----------------------------------------------------
    @checked(QueryError)
    def send(self, stream: str, data, send_id: str | None = None) -> int:
        """Send tuples into ``stream`` (what :meth:`sparkcep.Engine.send` takes), whole or not at all;
        returns how many. Taken once, even when the data path fails over meanwhile: under ``send_id``
        (default: a fresh one), which a later send with the same id is answered by, taking nothing."""
        send_id = uuid.uuid4().hex if send_id is None else send_id_of(send_id)
        delivered = []

        def attempt(client):
            delivered.append(True)
            return client.send(stream, data, send_id=send_id)
        try:
            return self._call(f"send to {stream!r}", attempt)
        except EngineError as e:
            if e.code != "DATA_PATH_UNREACHABLE":
                raise
            if delivered:
                raise EngineError(f"{e}; the rows may have been taken: send the same data with "
                                  f"send_id={send_id!r} to find out (a send id is never taken twice)",
                                  "SEND_UNCONFIRMED") from None
            raise EngineError(f"{e}; the rows were not taken", "SEND_NOT_TAKEN") from None

    def end(self, stream: str) -> None:
        """End of input for ``stream``: returns once the outputs reflect it."""
        self._call(f"end of {stream!r}", lambda c: c.end(stream))

    @checked(QueryError)
    def collect(self, output: str, timeout: float | None = None) -> pa.Table:
        """Every retained row of ``output``, once it reflects every send and end made before the call
        (waiting up to ``timeout`` s, a finite number; None: the default limit)."""
        timeout = seconds(timeout)

        def read(client):
            offsets = client.offsets(output, settle=True, timeout=timeout, whole=True)
            tables, _ = _rows(client, output, offsets, offsets["earliest"])
            fields = client.schema(output)["fields"]
            from sparkcep.schema import as_schema
            return pa.concat_tables(tables or [as_schema(fields).to_arrow().empty_table()])
        return self._call(f"collect of {output!r}", read)

    @checked(QueryError)
    def subscribe(self, output: str, callback, on_error=None) -> Subscription:
        """Call ``callback(pyarrow.RecordBatch)`` with every batch ``output`` produces from now on (read as
        they arrive, on a thread of its own), through fail-overs of the data path; ``on_error(error)`` once
        if reading fails for good. ``cancel()`` the returned subscription to stop. A ``callback`` that
        raises ends its subscription (``on_error`` gets code ``SINK``, naming its error); the query, which
        other clients may read, runs on. Undeploying the query ends its subscriptions quietly, as on an
        engine in this process."""
        function(callback, "subscribe's callback")
        function(on_error, "subscribe's on_error", optional=True)
        stop = threading.Event()
        if not self._call(f"subscribe to {output!r}", lambda c: c.schema(output)).get("retained", True):
            raise EngineError(f"output {output!r} keeps no rows (its query was deployed with retain=False), and "
                              "through Engine.connect a subscription reads them from the output's log: deploy it "
                              "with retain=True or a cep.Retention, or subscribe where it runs", "NOT_RETAINED")
        at = self._call(f"subscribe to {output!r}", lambda c: c.offsets(output)["latest"])

        def poll(c):
            offsets = c.offsets(output)
            return _rows(c, output, offsets, at), offsets.get("failed")

        def follow():
            client = None
            try:
                while not stop.wait(POLL_S):
                    ((tables, reached), failed), client = self.path.call(f"subscription to {output!r}", poll, client)
                    for table in tables:
                        for batch in table.to_batches():
                            if not stop.is_set():
                                try:
                                    callback(batch)
                                except Exception as e:
                                    raise EngineError(f"a subscriber of output {output!r} raised "
                                                      f"{type(e).__name__}: {e}", "SINK") from e
                    at.update(reached)
                    if failed is not None:  # its query failed: the rows it made before are out, then the error
                        raise EngineError(failed["message"], failed["code"])
            except UnknownStreamError:
                pass  # its query was undeployed: the subscription ends, as on an engine in this process
            except SparkcepError as e:
                if on_error is not None and not stop.is_set():
                    on_error(e)
            finally:
                if client is not None:
                    client.close()
        threading.Thread(target=follow, name=f"sparkcep-subscribe-{output}", daemon=True).start()
        subscription = Subscription(stop.set)
        self._subscriptions.append(subscription)
        return subscription

    def metrics(self) -> dict:
        return self._call_apart("metrics", lambda c: c.metrics())

    def instance_managers(self) -> list[dict]:
        return self._call_apart("instance managers", lambda c: c.instance_managers())

    def add_instance_manager(self, address: str) -> dict:
        """Not in a cluster: its instance managers join it themselves (``sparkcep worker --zk ...``)."""
        self._check_open()
        raise EngineError(f"in a cluster, instance managers join it as members: start the one at {address} with "
                          f"`sparkcep worker --zk {self.address.removeprefix('zk://')} --token-file ...`",
                          "CLUSTER_MEMBERS_JOIN")

    def data_path(self) -> dict:
        """Where each stream's source and each output's log live, as the registry says."""
        self._check_open()
        return {"streams": {s: self.registry.get(f"{tree.STREAMS}/{s}") for s in self.registry.children(tree.STREAMS)},
                "outputs": {o: self.registry.get(f"{tree.OUTPUTS}/{o}") for o in self.registry.children(tree.OUTPUTS)}}

    def close(self) -> None:
        """Stop the subscriptions and leave the cluster: every later call raises ``CLOSED``."""
        if self._closed:
            return
        self._closed = True
        for subscription in self._subscriptions:
            subscription.cancel()
        self.client.close()
        self.path.close()

    def __enter__(self) -> "ConnectedEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _rows(client: EngineClient, output: str, offsets: dict, start: dict) -> tuple[list[pa.Table], dict]:
    """The rows of ``output`` from positions ``start`` (0 for a partition it does not name) to
    ``offsets["latest"]``, and those latest positions. ``OFFSET_RELEASED`` naming how many rows were missed when
    some of them are no longer retained: never a silent skip."""
    out = []
    for p, end in sorted(offsets["latest"].items()):
        s, first = start.get(p, 0), offsets["earliest"].get(p, 0)
        if s < first:
            raise EngineError(f"rows {s}..{first} of partition {p} of output {output!r} were released before they "
                              f"were read: {first - s} rows missed; the first retained row is at {first}",
                              "OFFSET_RELEASED")
        if end > s:
            rows = client.read(output, p, s, end, engine=offsets["engine"], deployment=offsets["deployment"])
            out.append(rows.drop_columns([SEQ]))
    return out, dict(offsets["latest"])
