"""The engine: deploy queries, send tuples in, read results out.

``Engine.local(workers=0)`` runs everything in the calling process;
``Engine.local(workers=N)`` starts N instance managers (``sparkcep worker``
processes, each pinned to a core) and runs the sub-query instances there
(UPM-CEP §4); ``Engine.local(instance_managers=["host:port", ...], token=...)``
uses instance managers already serving, on this host or others. Either way
the engine process hosts the sources (sequence numbers, event times and
watermarks are stamped here, in :meth:`Engine.send`) and the output logs.
"""

from __future__ import annotations

import itertools
import logging
import threading
import uuid
import weakref

import pyarrow as pa

from sparkcep import auth
from sparkcep.arguments import checked, did_you_mean, function, integer, number, seconds
from sparkcep.core import columns
from sparkcep.core.ingest import check_event_times, to_batches
from sparkcep.deployed import Deployed, LocalDeployed
from sparkcep.core.operators import WM_NONE
from sparkcep.errors import EngineError, InputError, QueryError, UnknownStreamError
from sparkcep.migration.balancer import Balancer
from sparkcep.migration.migrator import Migrator
from sparkcep.replication.catchup import start_rebuild
from sparkcep.replication.replicas import ReplicaSet
from sparkcep.query.query import Query
from sparkcep.runtime import capacity
from sparkcep.runtime.deployment import Deployment
from sparkcep.runtime.handoff import ENGINE_HOST, Board, Handoffs
from sparkcep.runtime.metrics import MetricServer, add_rates, answered, deployment_metrics, late_counts
from sparkcep.runtime.output_log import OutputLog, Retention, Subscription, outside_callbacks
from sparkcep.runtime.send_ids import SendIds, check_retry, send_id_of
from sparkcep.runtime.topology import Topology

log = logging.getLogger("sparkcep")
UNDEPLOYED_KEPT = 16  # handles of undeployed queries kept for the endpoint's clients that still hold them


class Engine:
    """A running engine. Use :meth:`local` to start one.

    With instance managers, results arrive asynchronously: :meth:`collect`
    waits until the outputs reflect everything sent so far; :meth:`subscribe`
    callbacks run on the engine's collector thread.
    """

    @checked(EngineError)
    def __init__(self, workers: int = 0, instance_managers=(), token: str | None = None, topology=None,
                 ring_bytes: int | None = None, standby: int = 0):
        workers = integer(workers, "workers", minimum=0, error=EngineError, code="WORKERS")
        standby = integer(standby, "standby", minimum=0, error=EngineError, code="WORKERS")
        if ring_bytes is not None:
            ring_bytes = capacity.ring_bytes_of(ring_bytes)
        if workers or standby:  # before anything is started
            capacity.check_workers(workers + standby, len(Topology.load(topology).cpus))
        if isinstance(instance_managers, str):
            instance_managers = [instance_managers]
        self.workers = workers
        self.run_id = uuid.uuid4().hex  # names this engine run: offsets and checkpoints of another run are refused
        self.token = token or auth.generate()  # every connection to this engine and its instance managers carries it
        self._deployment_ids = itertools.count(1)
        self.deployments: dict[str, Deployment] = {}
        self.streams: dict[str, list[Deployment]] = {}
        self.outputs: dict[str, OutputLog] = {}
        self._producer: dict[str, Deployment] = {}  # output -> the deployment producing it
        self._seq = 0  # the next sequence number: one order over every stream of the engine
        self._ended: set[str] = set()
        self.sent = SendIds()  # what the last send ids of each stream took: send(..., send_id=...) takes one once
        self._closed = False
        self._lock = threading.RLock()
        self._board = Board()  # state handed over between the instances running in this process
        self._handoffs = Handoffs(ENGINE_HOST, report=self._board.installed)
        self._deployed: dict[str, LocalDeployed] = {}  # query -> what deploy() returned
        self._undeployed: dict[str, LocalDeployed] = {}  # deployment id -> its handle, the last UNDEPLOYED_KEPT
        self._balancer: Balancer | None = None  # started by the first deploy(..., balance=True)
        self._metric_server = MetricServer()
        self._held = weakref.WeakKeyDictionary()  # per deployment: its counters' highest figures so far
        self._topology, self._ring_bytes = topology, ring_bytes
        self.cluster = None
        self.endpoint = None  # the loopback endpoint, started by local()
        self.journal = None  # a cluster's data path: what it takes reaches its standby first (sparkcep.control.datapath)
        self.wait_workers_s = 0.0  # a deployment waits this long for instance managers to join (a cluster's)
        if workers or instance_managers or standby:
            try:
                self._cluster().adopt_all(instance_managers)
                if workers or standby:
                    self.cluster.spawn(workers, standby)
            except BaseException:  # nothing is left of it: its threads, connections and shared memory go
                self.cluster.close()
                raise

    @classmethod
    @checked(EngineError)
    def local(cls, workers: int = 0, instance_managers=(), token: str | None = None, topology=None,
              ring_bytes: int | None = None, listen: str = "127.0.0.1:0", standby: int = 0) -> "Engine":
        """An engine on this machine.

        ``workers=0`` runs every instance in this process; ``workers=N`` starts
        N instance managers pinned to cores of ``topology`` (default: this
        machine's NUMA nodes; a JSON file or sysfs-like directory also works);
        ``instance_managers``: addresses (``host:port``) of instance managers
        already serving (``sparkcep worker``), which must hold ``token`` (by
        default a fresh one is generated). Queries are deployed on the
        instance managers when there are any. ``ring_bytes``: capacity of each
        shared-memory channel (default 16 MiB). ``listen``: where the engine
        serves Spark's processes and the CLI (loopback by default; an address
        other hosts reach is opt-in, e.g. for executors on other machines).
        ``standby``: more instance managers, kept free to rebuild the instances of
        a replica that failed (``deploy(..., replicas=2)``).
        """
        engine = cls(workers, instance_managers, token=token, topology=topology, ring_bytes=ring_bytes,
                     standby=standby)
        # other local processes (Spark's Python workers, the CLI) reach it over loopback
        from sparkcep.gateway.endpoint import start_endpoint
        try:
            engine.endpoint = start_endpoint(engine, listen)
        except BaseException:
            engine.close()
            raise
        return engine

    @staticmethod
    @checked(EngineError)
    def connect(address: str, token: str | None = None, token_file: str | None = None, retry_s: float = 30.0):
        """The engine of a cluster (``zk://HOST:PORT/PATH``): deploy through its leading orchestrator;
        send, end, collect, subscribe and metrics straight to its data path
        (:class:`sparkcep.control.connect.ConnectedEngine`), riding through its fail-overs for up to
        ``retry_s`` seconds a call. ``token``, or the file holding it (not both)."""
        from sparkcep.control.connect import REGISTRY_TIMEOUT_S, ConnectedEngine
        retry_s = number(retry_s, "retry_s", error=EngineError, code="BAD_OPTION")
        if token is not None and token_file is not None:
            raise EngineError("Engine.connect takes token= or token_file=, not both", "BAD_OPTION")
        if token is None:
            if token_file is None:
                raise EngineError("Engine.connect needs the cluster's token (token=... or token_file=...)",
                                  "TOKEN_NOT_FOUND")
            token = auth.read(token_file)
        # a registry that answers late (a ZooKeeper restarting) is waited for as a data path's failure is
        return ConnectedEngine(address, token, retry_s=retry_s, registry_s=max(REGISTRY_TIMEOUT_S, retry_s))

    def _cluster(self):
        """The instance managers (created on first use)."""
        if self.cluster is None:
            from sparkcep.runtime.cluster import Cluster
            kw = {} if self._ring_bytes is None else {"ring_bytes": self._ring_bytes}
            self.cluster = Cluster(self.token, topology=self._topology, **kw)
        return self.cluster

    @outside_callbacks
    def add_instance_manager(self, address: str) -> dict:
        """Use the instance manager serving at ``address`` for the queries deployed from now on
        (the Spark executor launcher registers its instance managers so); queries deployed with
        ``balance=True`` get a share of their work moved onto it."""
        with self._lock:
            self._check_open()
            fresh = self.cluster is None
            try:
                im = self._cluster().adopt(address)
            except BaseException:
                if fresh:  # no instance manager after all: queries keep running in this process
                    self.cluster.close()
                    self.cluster = None
                raise
        if self._balancer is not None:
            self._balancer.joined(im.index)
        return next(d for d in self.cluster.describe() if d["name"] == im.name)

    def instance_managers(self) -> list[dict]:
        """Every instance manager of this engine: ``name``, ``address``, ``pid``, ``host``, ``cpu``,
        ``node``, ``alive`` and the ``instances`` it hosts (``query.SQn[i]``). CLOSED once the engine is closed."""
        self._check_open()
        return [] if self.cluster is None else self.cluster.describe()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @outside_callbacks
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._balancer is not None:
            self._balancer.close()
        if self.endpoint is not None:
            self.endpoint.close()
        for dep in self.deployments.values():
            if dep.runners:  # its instances run in this process: their state goes now
                dep.close()
            elif isinstance(dep, ReplicaSet):  # its members go with the instance managers below
                dep.closed = True
        if self.cluster is not None:
            self.cluster.close()

    # --- queries -----------------------------------------------------------------
    @checked(QueryError)
    @outside_callbacks
    def deploy(self, query: Query, parallelism=1, bins: int = 128, retain: "bool | Retention" = True,
               balance: bool = False, replicas: int = 1) -> Deployed:
        """Plan and start ``query``; ``parallelism``: an int or ``{operator name: instances}``.

        ``bins``: route-key buckets per stateful operator (a power of two): the
        unit of live migration. ``retain``: how much of each output its log
        keeps for ``collect()`` and Spark readers: ``True`` the default
        ``cep.Retention()`` (256 MiB per output, the oldest rows going first),
        a ``cep.Retention(rows=, bytes=, age_s=)``, or ``False``: no rows, they
        only reach subscribers (:meth:`subscribe`), for long runs whose
        results are consumed as they come. ``balance=True``: the engine migrates it live to
        even the load of its instance managers (:mod:`sparkcep.migration.balancer`).
        ``replicas=2``: active replication (:mod:`sparkcep.replication`): copies
        on disjoint instance managers, each fed every input, their outputs
        deduplicated; a failed one is rebuilt from the other live.
        """
        self._check_open()
        if not isinstance(query, Query):
            raise QueryError(f"deploy() takes a Query, got {type(query).__name__}")
        if query.name in self.deployments:
            raise QueryError(f"a query named {query.name!r} is already deployed", "ALREADY_DEPLOYED")
        clash = [o for o in query.outputs if o in self.outputs or o in self.streams]
        if clash:
            raise QueryError(f"output {clash[0]!r} of query {query.name!r} is already a stream of this engine")
        for name, src in query.sources.items():
            for other in self.streams.get(name, ()):
                _check_same_stream(name, src, other.query.sources[name], other.query.name)
            if name in self._ended:
                readers = sorted(d.query.name for d in self.streams[name])
                raise QueryError(f"stream {name!r} has ended (queries {readers} read it): query {query.name!r} "
                                 f"would get no input; undeploy them first or read another stream", "ENDED")
            if name in self.outputs:
                raise QueryError(f"stream {name!r} is an output of another query")
        replicas = integer(replicas, "replicas", minimum=1, code="BAD_REPLICAS")
        self._await_workers(replicas)
        with self._lock:
            capacity.check_deployment(query, parallelism, bins, replicas, retain, self.cluster)
            handle = self._deploy(f"{query.name}#{next(self._deployment_ids)}", query, parallelism, bins, retain,
                                  balance, replicas)
            if self.journal is not None:
                self.journal.deployed(handle.id, query, {"parallelism": parallelism, "bins": bins, "retain": retain,
                                                         "balance": balance, "replicas": replicas})
        return handle

    def _deploy(self, dep_id: str, query: Query, parallelism, bins, retain, balance: bool,
                replicas: int) -> LocalDeployed:
        """Deploy ``query`` as ``dep_id`` (holding the engine's lock; arguments checked by :meth:`deploy`)."""
        changes = threading.Lock()  # held while its wiring or bin tables change
        remote = self.cluster is not None and not self.cluster.in_process()
        if replicas == 1:
            dep = self._deployment(dep_id, query, parallelism, bins, retain, None)
            migrator = Migrator(lambda: [dep], self._lock, changes, self.cluster if remote else None)
        else:
            dep = self._replicated(dep_id, query, parallelism, bins, retain, replicas, changes, remote)
            migrator = Migrator(dep.running, self._lock, changes, self.cluster if remote else None)
            migrator.sides = dep.sides if remote else None
        migrator.on_change = self._reconfigured
        dep.on_fail.append(lambda error: [out.fail(error) for out in dep.logs.values()])
        dep.on_fail.append(lambda error: self.journal is not None and self.journal.failed(dep_id, error))
        for out in query.outputs:
            self.outputs[out] = dep.logs[out]
            self.outputs[out].journal = self.journal
            self._producer[out] = dep
        for name in query.sources:
            self.streams.setdefault(name, []).append(dep)
        self.deployments[query.name] = dep
        handle = self._deployed[query.name] = LocalDeployed(dep, migrator)
        if balance and dep.runners:
            log.warning("query %s: balance=True, but its instances run in the engine's process: "
                        "there is nothing to balance", query.name)
        elif balance:
            if self._balancer is None:
                self._balancer = Balancer(self.cluster)
            self._balancer.watch(dep, migrator)
        return handle

    def _await_workers(self, replicas: int) -> None:
        """With instance managers asked for (a cluster's, given addresses), wait up to :attr:`wait_workers_s`
        for one live per replica, saying what it waits for: never a silent fall-back into this process."""
        if self.cluster is not None and self.cluster.asked:
            self.cluster.await_live(replicas, self.wait_workers_s)

    def _reconfigured(self, dep, report: dict) -> None:
        """A migration of ``dep`` finished: a cluster's data path records its layout, which a replay after a
        fail-over deploys, and its report, which the new primary's ``migrations()`` keep."""
        if self.journal is not None:
            self.journal.reconfigured(dep, report)

    def deployment(self, name: str) -> Deployed:
        """The deployed query ``name``: what :meth:`deploy` returned for it."""
        self._check_open()
        handle = self._deployed.get(name)
        if handle is None:
            raise QueryError(f"no query named {name!r} is deployed{did_you_mean(name, self._deployed)}; "
                             f"queries: {sorted(self._deployed)}", "UNKNOWN_QUERY")
        return handle

    def _handle(self, name: str, dep_id: str | None) -> LocalDeployed:
        """Deployment ``dep_id`` of query ``name`` (None: the deployed one), as its endpoint's clients call it:
        a recently undeployed one answers as the handle its deploy() returned does, one that is gone raises
        ``UNDEPLOYED``, never a later deployment of the same name."""
        if dep_id is None:
            return self.deployment(name)
        handle = self._deployed.get(name)
        if handle is not None and handle.id == dep_id:
            return handle
        if dep_id in self._undeployed:
            return self._undeployed[dep_id]
        raise EngineError(f"query {name!r} is undeployed (deployment {dep_id})", "UNDEPLOYED")

    def _deployment(self, dep_id: str, query: Query, parallelism, bins: int, retain: bool, ims) -> Deployment:
        """One copy of ``query``: in this process, or on the instance managers (those of ``ims``)."""
        if self.cluster is None or self.cluster.in_process():
            return Deployment(dep_id, query, parallelism, bins, retain, handoffs=self._handoffs,
                              board=self._board, lock=self._lock)
        from sparkcep.runtime.remote import RemoteDeployment
        return RemoteDeployment(self.cluster, dep_id, query, parallelism, bins, retain, ims=ims, lock=self._lock)

    def _replicated(self, dep_id, query, parallelism, bins, retain, k: int, changes, remote: bool) -> ReplicaSet:
        """``k`` replicas of ``query`` on disjoint sides of the instance managers, a dedup sink, catch-up."""
        sides = self.cluster.replica_sides(k) if remote else [set() for _ in range(k)]
        reps = []
        try:
            for r in range(k):
                reps.append(self._deployment(f"{dep_id}.r{r}", query, parallelism, bins, retain,
                                             sides[r] if remote else None))
                reps[-1].replica = r
        except BaseException:
            for d in reps:
                d.close()
            raise
        logs = {out: OutputLog(op.schema.to_arrow(), out, retain, deployment=dep_id)
                for out, op in query.outputs.items()}
        rs = ReplicaSet(reps, sides, logs)
        rs.id = dep_id
        rs.rebuild = start_rebuild(rs, self.cluster if remote else None, self._lock, changes)
        return rs

    @outside_callbacks
    def undeploy(self, name: str) -> None:
        """Stop query ``name``: its instances go, its outputs and their logs are forgotten."""
        self._check_open()
        with self._lock:
            dep = self.deployments.pop(name, None)
            handle = self._deployed.pop(name, None)
            if self._balancer is not None:
                self._balancer.forget(name)
            if dep is None:
                raise QueryError(f"no query named {name!r} is deployed{did_you_mean(name, self.deployments)}"
                                 f"; queries: {sorted(self.deployments)}", "UNKNOWN_QUERY")
            for out in dep.query.outputs:
                self.outputs.pop(out, None)
                self._producer.pop(out, None)
            if self.journal is not None:
                self.journal.undeployed(name)
            for stream in dep.query.sources:
                left = [d for d in self.streams.get(stream, []) if d is not dep]
                if left:
                    self.streams[stream] = left
                else:  # the stream is gone: a deploy reading it again starts it afresh
                    self.streams.pop(stream, None)
                    self._ended.discard(stream)
                    self.sent.forget(stream)
            dep.close()
            for log_ in dep.logs.values():  # its handle stays a while (below): its rows need not
                for partition, end in log_.latest().items():
                    log_.release(partition, end)
            if handle is not None:
                self._undeployed[handle.id] = handle
            if len(self._undeployed) > UNDEPLOYED_KEPT:
                del self._undeployed[next(iter(self._undeployed))]

    # --- input -------------------------------------------------------------------
    @checked(QueryError)
    @outside_callbacks
    def send(self, stream: str, data, send_id: str | None = None) -> int:
        """Send tuples into ``stream``; returns how many. A rejected batch leaves no trace.

        ``send_id``: a string naming this send, taken once: sent again with the
        same id and as many rows (a retry after a lost reply), nothing is taken
        and the rows the first one took are returned; with another number of
        rows it is refused (``SEND_ID_REUSED``). The ids of a stream are
        forgotten when the last query reading it is undeployed."""
        if send_id is None:
            return self._take(stream, data)
        return self._send_once(stream, data, send_id_of(send_id))[0]

    def _send_once(self, stream: str, data, send_id: str) -> tuple[int, bool]:
        """:meth:`send` under ``send_id``: (rows, whether the id was taken before and nothing is now)."""
        with self._lock:
            taken = self.sent.taken(stream, send_id)
            if taken is None:
                n = self._take(stream, data, ("id", send_id))
                self.sent.add(stream, send_id, n)
                return n, False
        src = self._deployments_of(stream)[0].query.sources[stream]
        check_retry(stream, send_id, taken, sum(b.num_rows for b in to_batches(stream, src.schema, data, src.time_field)))
        return taken, True

    def _take(self, stream: str, data, key=None) -> int:
        """:meth:`send`, keyed for a cluster's journal by ``key`` (a send id, or a staged batch's (writer,
        batch)): what a standby needs to take a retried send once."""
        deps = self._deployments_of(stream)
        if stream in self._ended:
            raise InputError(f"stream {stream!r} has ended; no more tuples can be sent to it", "ENDED")
        src = deps[0].query.sources[stream]
        batches = [b for b in to_batches(stream, src.schema, data, src.time_field) if b.num_rows]
        if not batches:
            return 0
        times = columns.event_times(batches, src.time_field)
        peaks = None if times is None else columns.peaks(times)
        with self._lock:
            if times is not None:
                seen = max(dep.sources[stream].max_ts for dep in deps)
                check_event_times(stream, src.time_field, times, peaks, None if seen == WM_NONE else seen,
                                  src.max_ahead_us)
            return self._send(stream, deps, batches, src.time_field, key, times, peaks)

    def _send(self, stream: str, deps: list[Deployment], batches: list[pa.RecordBatch], time_field: str | None,
              key=None, times: list[pa.Array] | None = None, peaks: list[int] | None = None) -> int:
        """Stamp ``batches`` (sequence numbers, event time, the watermark from before them) and hand them
        to ``deps`` as one epoch, all or nothing. ``times`` and ``peaks``: their event times and the
        largest of each batch, when the caller has them (:func:`~sparkcep.core.columns.event_times`,
        :func:`~sparkcep.core.columns.peaks`).

        Until every deployment's channels hold every batch, any failure
        (a full ring that does not drain, a dead worker, an interrupt) aborts
        the epoch in every deployment and the sequence numbers stay free.
        Then the epoch is closed everywhere; an operator failing on it fails
        its deployment, whose outputs never show the epoch, and the error
        names the deployments that took it.
        """
        n = sum(b.num_rows for b in batches)
        if times is None:
            times = columns.event_times(batches, time_field)
        if peaks is None:
            peaks = [0] * len(batches) if times is None else columns.peaks(times)
        for dep in deps:
            dep.check()
        if self.journal is not None:
            self.journal.sent(stream, batches, self._seq, {dep.id: dep.epoch for dep in deps}, key)
        pushed = []
        try:
            for dep in deps:
                seq, watermark = self._seq, dep.sources[stream].max_ts
                pushed.append(dep)
                for i, batch in enumerate(batches):
                    t = None if times is None else times[i]
                    dep.push(stream, columns.stamp(batch, seq, t, watermark), peaks[i], seq + batch.num_rows - 1)
                    seq += batch.num_rows
            for dep in deps:
                dep.flush()
        except BaseException:
            for dep in pushed:
                if dep.error is None:
                    dep.abort()
            if self.journal is not None:
                self.journal.aborted(self._seq, [dep.id for dep in pushed])
            raise
        self._seq += n
        failed = None
        for dep in deps:
            try:
                dep.progress(self._seq - 1)
            except EngineError as e:
                failed = failed or e
        if failed is not None:
            took = [dep.query.name for dep in deps if dep.error is None]
            if took:  # the others hold the send now: sent again, it would be there twice
                raise type(failed)(f"{failed}; queries {took} reading stream {stream!r} took this send: do not "
                                   "send it again", failed.code) from failed
            raise failed
        return n

    @outside_callbacks
    def end(self, stream: str) -> None:
        """End of input for ``stream``: once all inputs of a query end, every open window fires.

        Returns when the outputs reflect it (with workers too).
        """
        with self._lock:
            deps = self._deployments_of(stream)
            if self.journal is not None:
                self.journal.ended(stream, self._seq, {dep.id: dep.epoch for dep in deps})
            self._ended.add(stream)
            for dep in deps:
                dep.end(stream, self._seq - 1)
        for dep in deps:  # with workers: return once what the end fired is out, as in one process
            dep.wait()

    # --- output ------------------------------------------------------------------
    @checked(QueryError)
    @outside_callbacks
    def collect(self, output: str, timeout: float | None = None) -> pa.Table:
        """Everything ``output`` has produced for the input sent so far, as a pyarrow Table: the rows its log
        holds, less those every Spark streaming reader of it committed past (released, see README).

        With workers it first waits (up to ``timeout`` s, a finite number; None: the
        default limit) until the output reflects every ``send``/``end`` made before the call.
        """
        log = self._settle(output, timeout)
        return log.table()

    @checked(QueryError)
    def subscribe(self, output: str, callback, on_error=None) -> Subscription:
        """Call ``callback(pyarrow.RecordBatch)`` with every batch ``output`` produces from now on, and
        ``on_error(error)`` if its query fails (an instance manager died, an operator raised). Callbacks
        run on the engine's collector thread; ``cancel()`` the returned subscription to stop them. A
        ``callback`` that raises fails the query as an operator that raises does: code ``SINK``, naming
        its error, from the next call on; one that is no function is refused at once (BAD_CALLBACK).
        A callback calling the engine back (send, collect, metrics, a migration...) is refused: IN_CALLBACK."""
        log = self._log(output)
        return log.subscribe(function(callback, "subscribe's callback"),
                             function(on_error, "subscribe's on_error", optional=True))

    @outside_callbacks
    def metrics(self) -> dict:
        """The engine's metrics (the paper's metric server, in this process).

        ``sequence`` (tuples in), ``outputs`` (rows out per output), ``late``
        (late tuples per query and stateful operator), ``late_by_stream``
        (per input stream, late tuples per ``query.operator``); ``queries``: per query
        input rate, throughput, latency percentiles (ms, arrival at the engine
        -> result out) and, per sub-query and operator, the same plus queue
        lengths and placement; ``instance_managers``: per process CPU %,
        memory, bytes in/out. Rates are rows/s over the last few seconds. CLOSED once the engine is closed.
        """
        self._check_open()
        deps = dict(self.deployments)  # not under the engine's lock: a send blocked on a full ring holds it
        snaps = {}
        if self.cluster is not None:
            snaps = self.cluster.snapshots()
        counters: dict = {}
        queries, late, late_streams = {}, {}, {}
        for q, dep in deps.items():
            # with replicas, the counts of the one that counted most (a rebuilt one counts from its catch-up)
            replicas = (dep.running() or dep.members) if isinstance(dep, ReplicaSet) else [dep]
            counted, inst = max(((r, _instance_counts(r, snaps)) for r in replicas),
                                key=lambda r_inst: sum(m["rows_in"] for m in r_inst[1].values()))
            late[q], by_stream = late_counts(dep.plan, {ep: m["late"] for ep, m in inst.items()})
            for stream, ops in by_stream.items():
                late_streams.setdefault(stream, {}).update({f"{q}.{op}": n for op, n in ops.items()})
            queries[q] = deployment_metrics(dep, inst, counters, self._held.setdefault(dep, {}), counted.retired)
            queries[q]["state"] = "failed" if dep.error is not None else "running"
            if isinstance(dep, ReplicaSet):
                queries[q]["replication"] = dep.metrics()
                states = {r["state"] for r in queries[q]["replication"]["replicas"]}
                if dep.error is None and states != {"running"}:  # a replica rebuilt, or lost for good
                    queries[q]["state"] = "recovering" if "catching-up" in states else "degraded"
        ims = self.cluster.im_metrics(snaps, counters) if self.cluster is not None else {}
        rates = self._metric_server.sample(counters)
        add_rates(queries, rates)
        for i, m in ims.items():
            if not answered(m):  # its figures are unknown, not 0
                continue
            m["cpu_percent"] = round(100 * rates.get(("im", i, "cpu_s"), 0.0), 1)
            m["bytes_in_rate"] = rates.get(("im", i, "bytes_in"), 0.0)
            m["bytes_out_rate"] = rates.get(("im", i, "bytes_out"), 0.0)
        return {
            "sequence": self._seq,
            "outputs": {name: log.rows for name, log in self.outputs.items()},
            "late": late,
            "late_by_stream": late_streams,
            "queries": queries,
            "instance_managers": ims,
            "migrations": {q: d.migrations() for q, d in list(self._deployed.items())},
            "balancer": self._balancer.snapshot() if self._balancer is not None else None,
        }

    def _settle(self, output: str, timeout: float | None = None) -> OutputLog:
        """The log of ``output`` once it reflects every send and end made so far."""
        log = self._log(output)
        self._producer[output].wait(seconds(timeout))
        return log

    def _log(self, output: str) -> OutputLog:
        self._check_open()
        if output not in self.outputs:
            raise UnknownStreamError(f"no deployed query has an output named {output!r}"
                                     f"{did_you_mean(output, self.outputs)}; outputs: {sorted(self.outputs)}")
        return self.outputs[output]

    def _deployments_of(self, stream: str) -> list[Deployment]:
        self._check_open()
        if stream not in self.streams:
            raise UnknownStreamError(f"no deployed query reads a stream named {stream!r}"
                                     f"{did_you_mean(stream, self.streams)}; streams: {sorted(self.streams)}")
        return self.streams[stream]

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("the engine is closed", "CLOSED")


def _instance_counts(dep, snaps: dict) -> dict:
    """Per instance of ``dep``, its counters: from this process, or from the instance managers' ``snaps``."""
    if dep.runners:
        return dep.instance_metrics()
    return {ep: m for s in snaps.values() for ep, m in s["deployments"].get(dep.gen.wire, {}).items()}


def _check_same_stream(name: str, mine, theirs, other: str) -> None:
    """A stream read by two queries is one stream: the same schema, event time field and ``max_ahead``
    (its rows are stamped once, for every query reading it)."""
    for what, a, b in (("schema", mine.schema, theirs.schema), ("event time field", mine.time_field, theirs.time_field),
                       ("max_ahead (us)", mine.max_ahead_us, theirs.max_ahead_us)):
        if a != b:
            raise QueryError(f"stream {name!r} is declared with {what} {a} but query {other!r} declares it with "
                             f"{b}: queries reading one stream must declare it alike")
