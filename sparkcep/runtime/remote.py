"""A deployment whose instances run on the engine's instance managers (:class:`~sparkcep.runtime.cluster.Cluster`).

The engine side of it: placement, the channel plan, the two set-up steps
(deploy, then start, on every instance manager hosting a part; the engine
opens its own ends — the sources' producers, the outputs' consumers — the
same way, :class:`~sparkcep.runtime.wiring.ChannelEnds`), the sources'
back-pressure and the wait for outputs.
"""

from __future__ import annotations

import threading
import time

from sparkcep.errors import EngineError
from sparkcep.query.query import Query
from sparkcep.runtime import commands as cmd
from sparkcep.runtime.channels import ChannelClosed
from sparkcep.runtime.cluster import PEER_GRACE_S, Cluster
from sparkcep.runtime.deployment import Deployment
from sparkcep.runtime.layout import ENGINE, Endpoint
from sparkcep.runtime.placement import place
from sparkcep.runtime.sink import Sink
from sparkcep.runtime.wiring import ChannelEnds, plan_channels, source_router

WAIT_TIMEOUT_S = 120.0     # collect()/wait(): outputs must catch up within this long
SEND_TIMEOUT_S = 60.0      # send(): a channel must take something within this long


class RemoteDeployment(Deployment):
    """A query whose instances run on the cluster's instance managers."""

    def __init__(self, cluster: Cluster, id: str, query: Query, parallelism=1, bins: int = 128,
                 retain: bool = True):
        self.cluster = cluster
        self.sink_lock = threading.Lock()
        self.closed = False
        super().__init__(id, query, parallelism, bins, retain)

    def _connect(self) -> None:
        cluster, layout = self.cluster, self.layout
        slots, topology = cluster.slots_and_topology()
        if not slots:
            raise EngineError("no live instance manager to deploy to", "NO_WORKERS")
        self.assignment = place(layout, slots, topology, None, cluster.load())
        ims = cluster.ims
        host_of = {ENGINE: cluster.host, **{ep: ims[i].info.host for ep, i in self.assignment.items()}}
        address_of = {ENGINE: None, **{ep: ims[i].info.address for ep, i in self.assignment.items()}}
        plans = plan_channels(layout, host_of, address_of, self.id)
        self.hosts = sorted(set(self.assignment.values()))
        self.ends = ChannelEnds(self.id, plans, {ENGINE}, cluster.dir, cluster.sink_bell, cluster.send_bell,
                                cluster.token, cluster.ring_bytes, batches_stay=True)
        owners = {op: t.owners.tolist() for op, t in self.tables.items()}
        try:
            made = self.ends.open_first()  # the rings this process consumes
            query = cmd.pickled(self.query)
            names = {ep: ims[i].name for ep, i in self.assignment.items()}

            def touching(i):
                return {k: v for k, v in plans.items() if self.assignment.get(k[0]) == i or self.assignment.get(k[1]) == i}
            for value in cluster.request_all(self.hosts, lambda i, number: cmd.Deploy(number, cmd.DeploySpec(
                    self.id, query, self.parallelism, self.bins, owners, names, touching(i),
                    cluster.ring_bytes))).values():
                made.update(value)
            self.ends.open_rest(made)
            for i in self.hosts:  # one at a time: two instance managers connecting to each other wait on each other
                cluster.request_all([i], lambda i, number: cmd.Start(
                    number, self.id, {k: made[k] for k in touching(i) if k in made}))
        except BaseException:
            self._undeploy_parts()
            raise
        finally:
            self.ends.unlink()  # every end is open: the ring files can go
        self.runners = []
        self._source_channels = {c: self.ends.outputs[(ENGINE, c)] for c in layout.consumers(ENGINE)}
        self.source_router = source_router(layout, self.bins, owners, self.ends.outputs)
        self.sink = Sink(layout, self.logs, self.clock,
                         {p: self.ends.inputs[(p, ENGINE)] for p in layout.producers(ENGINE)})
        with cluster.lock:
            cluster.deployments[self.id] = self

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
                return 0 if self.closed else self.sink.poll()
        except ChannelClosed as e:
            self.cluster.blame(self, e)
        except Exception as e:  # a subscriber or a log failed: the deployment fails
            self.fail(EngineError(f"query {self.query.name}: delivering results failed: "
                                  f"{type(e).__name__}: {e}", "SINK"))
        return 0

    def flush(self) -> None:
        """Wait until the channels took everything pushed (back-pressure); EngineError BACKPRESSURE_TIMEOUT
        when an instance takes nothing for ``SEND_TIMEOUT_S`` (the engine then aborts the epoch)."""
        for end in self._source_channels.values():
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
        for end in self._source_channels.values():
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
        if self.error is None:
            for i in self.hosts:
                im = self.cluster.ims[i]
                if im.dead is None and im.process is not None and im.process.poll() is not None:
                    self.cluster._died(im)
        super().check()

    # --- state -------------------------------------------------------------------------
    def instance_metrics(self) -> dict[Endpoint, dict]:
        out: dict[Endpoint, dict] = {}
        snaps = self.cluster.request_all(self.hosts, lambda i, number: cmd.Metrics(number))
        for snap in snaps.values():
            out.update(snap["deployments"].get(self.id, {}))
        return out

    def close(self) -> None:
        with self.cluster.lock:
            self.cluster.deployments.pop(self.id, None)
        self._undeploy_parts()

    def _undeploy_parts(self) -> None:
        live = [i for i in getattr(self, "hosts", []) if self.cluster.ims[i].dead is None]
        try:
            self.cluster.request_all(live, lambda i, number: cmd.Undeploy(number, self.id), timeout=5)
        except EngineError:
            pass
        with self.sink_lock:
            self.closed = True
        if hasattr(self, "ends"):
            self.ends.close()
