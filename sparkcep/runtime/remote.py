"""A deployment whose instances run on the engine's instance managers (:class:`~sparkcep.runtime.cluster.Cluster`).

The engine side of it: placement, the channel plan, the two set-up steps
(deploy, then start, on every instance manager hosting a part; the engine
opens its own ends — the sources' producers, the outputs' consumers — the
same way, :class:`~sparkcep.runtime.wiring.ChannelEnds`), the sources'
back-pressure and the wait for outputs. Each generation of the deployment
is deployed on the instance managers under an id of its own (``q#1.2@3f9a1c``: the deployment,
the generation, the engine).
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass

from sparkcep.errors import EngineError
from sparkcep.query.query import Query
from sparkcep.runtime import commands as cmd
from sparkcep.runtime.channels import ChannelClosed
from sparkcep.runtime.cluster import METRICS_TIMEOUT_S, PEER_GRACE_S, REPLY_TIMEOUT_S, Cluster
from sparkcep.runtime.deployment import Deployment, Generation
from sparkcep.runtime.layout import ENGINE, Endpoint, Layout
from sparkcep.runtime.placement import place
from sparkcep.runtime.wiring import ChannelEnds, plan_channels, source_router

WAIT_TIMEOUT_S = 120.0     # collect()/wait(): outputs must catch up within this long
SEND_TIMEOUT_S = 60.0      # send(): a channel must take something within this long
POLL_S = 0.05              # check(): how often a waiting engine looks whether its instance managers exited


@dataclass
class RemoteGeneration(Generation):
    """A generation whose instances run on instance managers: where each runs, and the engine's ends."""

    wire: str = ""  # its id on the instance managers
    assignment: dict = None  # endpoint -> instance manager index
    names: dict = None  # instance manager index -> name
    ends: ChannelEnds = None
    cluster: Cluster = None

    @functools.cached_property
    def hosts(self) -> list[int]:
        return sorted(set(self.assignment.values()))

    def host_of(self, endpoint: Endpoint) -> str:
        return self.names[self.assignment[endpoint]]

    def close(self) -> None:
        """Undeploy its parts on the instance managers still alive and close the engine's ends."""
        self.cluster.undeploy(self.wire, self.hosts)
        self.ends.close()


class RemoteDeployment(Deployment):
    """A query whose instances run on the cluster's instance managers."""

    def __init__(self, cluster: Cluster, id: str, query: Query, parallelism=1, bins: int = 128,
                 retain: bool = True, ims=None, **kw):
        self.cluster = cluster
        self.ims = ims  # the instance managers it may run on (None: any live one)
        self.sink_lock = threading.Lock()
        self._polled = (0, 0.0)  # (epoch, time) the instance managers' processes were last looked at
        super().__init__(id, query, parallelism, bins, retain, board=cluster.board, **kw)
        with cluster.lock:
            cluster.deployments[self.id] = self

    def _generation(self, parallelism: dict[str, int], placement) -> RemoteGeneration:
        cluster = self.cluster
        self.generations += 1
        layout = Layout(self.plan, parallelism)
        wire = f"{self.id}.{self.generations}@{cluster.tag}"  # unique on the instance managers, which may still
        # run the same deployment for an engine this one took over from
        if placement is None:
            slots, topology = cluster.slots_and_topology(self.ims)
            if not slots:
                raise EngineError("no live instance manager to deploy to", "NO_WORKERS")
            placement = place(layout, slots, topology, None, cluster.load())
        ims = cluster.ims
        host_of = {ENGINE: cluster.host, **{ep: ims[i].info.host for ep, i in placement.items()}}
        address_of = {ENGINE: None, **{ep: ims[i].info.address for ep, i in placement.items()}}
        plans = plan_channels(layout, host_of, address_of, wire)
        hosts = sorted(set(placement.values()))
        ends = ChannelEnds(wire, plans, {ENGINE}, cluster.dir, cluster.sink_bell, cluster.send_bell,
                           cluster.token, cluster.ring_bytes, batches_stay=True)
        owners = {op: t.owners.tolist() for op, t in self.tables.items()}
        cluster.wires[wire] = self
        try:
            made = ends.open_first()  # the rings this process consumes
            query = cmd.pickled(self.query)
            names = {ep: ims[i].name for ep, i in placement.items()}

            def touching(i):
                return {k: v for k, v in plans.items() if placement.get(k[0]) == i or placement.get(k[1]) == i}
            for value in cluster.request_all(hosts, lambda i, number: cmd.Deploy(number, cmd.DeploySpec(
                    wire, query, parallelism, self.bins, owners, names, touching(i), cluster.ring_bytes))).values():
                made.update(value)
            ends.open_rest(made)
            for i in hosts:  # one at a time: two instance managers connecting to each other wait on each other
                cluster.request_all([i], lambda i, number: cmd.Start(
                    number, wire, {k: made[k] for k in touching(i) if k in made}))
        except BaseException as e:
            cluster.undeploy(wire, hosts)
            ends.close()
            cluster.wires.pop(wire, None)
            if isinstance(e, Exception):  # the query was undeployed meanwhile (the engine closing): say so
                self._check_open()
            raise
        finally:
            ends.unlink()  # every end is open: the ring files can go
        return RemoteGeneration(self.generations, layout, source_router(layout, self.bins, owners, ends.outputs),
                                {c: ends.outputs[(ENGINE, c)] for c in layout.consumers(ENGINE)},
                                {p: ends.inputs[(p, ENGINE)] for p in layout.producers(ENGINE)},
                                wire=wire, assignment=dict(placement), names={i: ims[i].name for i in hosts},
                                ends=ends, cluster=cluster)

    def drop(self, gen: Generation) -> None:
        # first forgotten: an instance of it that sees a peer's channel close is no failure of the query
        self.cluster.wires.pop(gen.wire, None)
        # the sink reads none of its feeds any more; the collector thread, which reads the instance
        # managers' replies to the undeploy, must not wait for sink_lock meanwhile
        self.cluster.undeploy(gen.wire, gen.hosts)
        with self.sink_lock:  # a poll that began before its feeds left the sink is over
            gen.ends.close()

    @property
    def assignment(self) -> dict[Endpoint, int]:
        """Where each instance of the running generation runs (instance manager index)."""
        return self.gen.assignment

    def uses(self, im: int) -> list[str]:
        """The instances (``SQn[i]``) of any live generation that instance manager ``im`` runs."""
        return sorted({f"{sq}[{i}]" for g in [self.gen, *self.retiring] for (sq, i), at in g.assignment.items()
                       if at == im})

    def placement_lines(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for (sq, i), at in sorted(self.assignment.items(), key=lambda kv: (self.layout.sq[kv[0][0]].id, kv[0][1])):
            im = self.cluster.ims[at]
            out.setdefault(sq, []).append(f"instance {i}: instance manager {im.name} ({im.info.address}, "
                                          f"pid {im.info.pid}, cpu {im.slot.cpu}, node {im.slot.node})")
        return out

    # --- progress ----------------------------------------------------------------------
    def poll_sink(self) -> int:
        """Move what the output channels hold into the output logs (the collector thread calls it)."""
        try:
            with self.sink_lock:
                return 0 if self.closed else super().poll_sink()
        except ChannelClosed as e:
            self.cluster.blame(self, e)
        except Exception as e:  # a log failed: the deployment fails
            self.fail(EngineError(f"query {self.query.name}: delivering results failed: "
                                  f"{type(e).__name__}: {e}", "SINK"))
        return 0

    def flush(self) -> None:
        """Wait until the channels took everything pushed (back-pressure); EngineError BACKPRESSURE_TIMEOUT
        when an instance takes nothing for ``SEND_TIMEOUT_S`` (the engine then aborts the epoch)."""
        for gen in [self.gen, *self.retiring]:
            for end in gen.source_channels.values():
                try:
                    end.flush_blocking(SEND_TIMEOUT_S, self.check)
                except ChannelClosed as e:
                    self.cluster.blame(self, e)
                    deadline = time.monotonic() + PEER_GRACE_S + 0.5
                    while self.error is None and time.monotonic() < deadline:
                        time.sleep(0.01)
                    self.check()
                    raise

    def abort(self) -> None:
        super().abort()
        for end in self.gen.source_channels.values():
            end.flush()

    def _run(self) -> None:
        """Hand the epoch's progress to the channels: it fits in their control reserve once the data is in."""
        try:
            self.flush()
        except EngineError as e:
            if e.code != "BACKPRESSURE_TIMEOUT":
                raise
            self.fail(EngineError(f"query {self.query.name}: an instance took nothing for {SEND_TIMEOUT_S:.0f} s "
                                  f"while an epoch was being closed; the deployment is stopped", e.code))
            raise self.error from None

    def wait(self, timeout: float | None = None) -> None:
        """Block until the outputs reflect every epoch closed so far."""
        target = self.epoch - 1
        limit = WAIT_TIMEOUT_S if timeout is None else timeout
        deadline = time.monotonic() + limit
        with self.cluster.progress:
            while self.sink.done_epoch < target:
                self.check()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise EngineError(f"query {self.query.name}: outputs are at epoch {self.sink.done_epoch} of "
                                      f"{target} after {limit:.0f} s", "WAIT_TIMEOUT")
                self.cluster.progress.wait(min(left, 0.1))
        self.check()

    def fail(self, error: EngineError) -> None:
        super().fail(error)
        with self.cluster.progress:
            self.cluster.progress.notify_all()

    def check(self) -> None:
        """Raise the deployment's error; first look whether an instance manager this engine started
        has exited (once an epoch, or every ``POLL_S`` while waiting: a send checked three times)."""
        now = time.monotonic()
        if self.error is None and (self._polled[0] != self.epoch or now - self._polled[1] > POLL_S):
            self._polled = (self.epoch, now)
            for i in self.gen.hosts:
                im = self.cluster.ims[i]
                if im.dead is None and im.process is not None and im.process.poll() is not None:
                    self.cluster._died(im)
        super().check()

    # --- state -------------------------------------------------------------------------
    def instance_metrics(self) -> dict[Endpoint, dict]:
        return self._counts(self.gen, REPLY_TIMEOUT_S, partial=False)

    def last_counts(self, gen: Generation) -> dict[Endpoint, dict]:
        """The counters of ``gen``'s instances, from the instance managers that answer (a dead one's are lost
        with it)."""
        return self._counts(gen, METRICS_TIMEOUT_S, partial=True)

    def _counts(self, gen: Generation, timeout: float, partial: bool) -> dict[Endpoint, dict]:
        snaps = self.cluster.request_all(gen.hosts, lambda i, number: cmd.Metrics(number), timeout, partial)
        return {ep: m for snap in snaps.values() for ep, m in snap["deployments"].get(gen.wire, {}).items()}

    def close(self) -> None:
        with self.cluster.lock:
            self.cluster.deployments.pop(self.id, None)
        with self.sink_lock:
            self.closed = True
        for g in [self.gen, *self.retiring]:
            self.cluster.wires.pop(g.wire, None)
            g.close()
        self.retiring = []
