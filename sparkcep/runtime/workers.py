"""The engine's side of the instance managers: start them, deploy onto them, collect their results.

:class:`WorkerPool` starts N instance-manager processes (pinned by
:func:`~sparkcep.runtime.placement.im_slots`), keeps a pipe to each for
control messages, and runs one *collector* thread that reads every
deployment's output rings into the output logs, answers to replies and
notices a worker that died (then every deployment with an instance on it
fails with an :class:`~sparkcep.errors.EngineError` naming the instance
manager and its sub-queries; nothing waits forever).

Start method: ``fork`` when the calling process has a single thread (the
workers inherit numba's compiled kernels), else ``forkserver`` (a JVM gateway
or endpoint threads may hold locks a forked child would inherit); the
forkserver preloads this package so each worker starts warm.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import pickle
import select
import shutil
import tempfile
import threading
import time
import traceback
import weakref
from dataclasses import dataclass, field

from sparkcep.errors import EngineError
from sparkcep.query.query import Query
from sparkcep.runtime.balancers import Router
from sparkcep.runtime.channels import (DEFAULT_CAPACITY, Doorbell, RingConsumer, RingProducer, create_ring,
                                       unlink_quietly)
from sparkcep.runtime.deployment import Deployment, Sink
from sparkcep.runtime.instance_manager import DeploySpec, IMConfig, serve
from sparkcep.runtime.layout import ENGINE, Endpoint
from sparkcep.runtime.placement import Slot, im_slots, place
from sparkcep.runtime.topology import Topology
from sparkcep.runtime.warmup import warm_up

START_TIMEOUT_S = 120.0
REPLY_TIMEOUT_S = 30.0
WAIT_TIMEOUT_S = 120.0     # collect()/wait(): outputs must catch up within this long
SEND_TIMEOUT_S = 60.0      # send(): a ring must take something within this long

try:
    import cloudpickle as _pickler  # user functions defined in __main__ or as lambdas
except ImportError:  # pragma: no cover
    _pickler = pickle


@dataclass
class Worker:
    slot: Slot
    process: mp.process.BaseProcess
    conn: object
    bell: str
    pid: int = 0
    dead: str | None = None
    send_lock: threading.Lock = field(default_factory=threading.Lock)


def start_method() -> str:
    return "fork" if threading.active_count() == 1 else "forkserver"


class WorkerPool:
    """N instance managers and the engine-side plumbing to them."""

    def __init__(self, workers: int, topology=None, method: str | None = None,
                 ring_bytes: int = DEFAULT_CAPACITY):
        self.topology = Topology.load(topology)
        self.slots = im_slots(self.topology, workers)
        self.ring_bytes = ring_bytes
        self.method = method or start_method()
        self.dir = tempfile.mkdtemp(prefix=f"sparkcep-{os.getpid()}-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        weakref.finalize(self, shutil.rmtree, self.dir, True)  # even if close() is never called
        self.send_bell = Doorbell.create(os.path.join(self.dir, "engine-send"))
        self.sink_bell = Doorbell.create(os.path.join(self.dir, "engine-sink"))
        self.deployments: dict[str, "WorkerDeployment"] = {}
        self.workers: list[Worker] = []
        self.lock = threading.RLock()
        self.progress = threading.Condition(self.lock)  # notified when outputs arrive or a worker dies
        self._replies: dict[int, list] = {}
        self._req = itertools.count(1)
        self._closed = False
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        self._thread = threading.Thread(target=self._collect, name="sparkcep-collector", daemon=True)
        self._thread.start()

    # --- processes ---------------------------------------------------------------------
    def _start(self) -> None:
        ctx = mp.get_context(self.method)
        if self.method == "fork":
            warm_up()  # the workers inherit the compiled kernels
        elif self.method == "forkserver":
            ctx.set_forkserver_preload(["sparkcep.runtime.forkserver_preload"])
        for slot in self.slots:
            bell = os.path.join(self.dir, f"im-{slot.index}")
            os.mkfifo(bell, 0o600)
            mine, theirs = ctx.Pipe(duplex=True)
            close = [w.conn for w in self.workers] + [mine] if self.method == "fork" else []
            config = IMConfig(slot.index, slot.cpu, slot.node, bell)
            p = ctx.Process(target=serve, args=(config, theirs, close), name=f"sparkcep-im-{slot.index}",
                            daemon=True)
            p.start()
            theirs.close()
            self.workers.append(Worker(slot, p, mine, bell))
        deadline = time.monotonic() + START_TIMEOUT_S
        for w in self.workers:
            while not w.conn.poll(0.1):
                if not w.process.is_alive():
                    raise EngineError(f"instance manager {w.slot.index} (cpu {w.slot.cpu}) exited at start "
                                      f"with code {w.process.exitcode}", "WORKER_START")
                if time.monotonic() > deadline:
                    raise EngineError(f"instance manager {w.slot.index} did not start within "
                                      f"{START_TIMEOUT_S:.0f} s", "WORKER_START")
            kind, _, info = w.conn.recv()
            if kind != "ready":
                raise EngineError(f"instance manager {w.slot.index} (cpu {w.slot.cpu}) failed to start: {info}",
                                  "WORKER_START")
            w.pid = info["pid"]

    def close(self) -> None:
        """Stop every instance manager (politely, then by force) and remove the shared files."""
        if self._closed:
            return
        self._closed = True
        for w in self.workers:
            if w.dead is None:
                try:
                    with w.send_lock:
                        w.conn.send(("stop", 0))
                except (OSError, EOFError):
                    pass
        deadline = time.monotonic() + 5
        for w in self.workers:
            w.process.join(max(0.05, deadline - time.monotonic()))
            if w.process.is_alive():
                w.process.kill()
                w.process.join(2)
        if getattr(self, "_thread", None) is not None:
            with self.progress:
                self.progress.notify_all()
            self._thread.join(5)
        for w in self.workers:
            try:
                w.conn.close()
            except OSError:
                pass
        for dep in list(self.deployments.values()):
            dep._close_channels()
        self.send_bell.close()
        self.sink_bell.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # --- control ------------------------------------------------------------------------
    def request(self, index: int, kind: str, *args, timeout: float = REPLY_TIMEOUT_S):
        """Send a control message to instance manager ``index`` and return its answer."""
        w = self.workers[index]
        if w.dead:
            raise EngineError(w.dead, "WORKER_DIED")
        req = next(self._req)
        slot: list = []
        with self.lock:
            self._replies[req] = slot
        try:
            with w.send_lock:
                w.conn.send((kind, req, *args))
        except (OSError, EOFError):
            with self.lock:
                self._replies.pop(req, None)
            raise EngineError(f"instance manager {index} is gone", "WORKER_DIED") from None
        deadline = time.monotonic() + timeout
        with self.progress:
            while not slot:
                if w.dead:
                    self._replies.pop(req, None)
                    raise EngineError(w.dead, "WORKER_DIED")
                left = deadline - time.monotonic()
                if left <= 0:
                    self._replies.pop(req, None)
                    raise EngineError(f"instance manager {index} did not answer {kind!r} within {timeout:.0f} s",
                                      "WORKER_TIMEOUT")
                self.progress.wait(min(left, 0.1))
            self._replies.pop(req, None)
        status, value = slot[0]
        if status != "ok":
            raise EngineError(value, "WORKER_ERROR")
        return value

    def request_all(self, indices, kind: str, *args, timeout: float = REPLY_TIMEOUT_S) -> dict[int, object]:
        return {i: self.request(i, kind, *args, timeout=timeout) for i in indices}

    # --- the collector thread -----------------------------------------------------------
    def _collect(self) -> None:
        while not self._closed:
            try:
                self._collect_loop()
            except Exception:  # a bug here must not leave every waiter hanging: report, keep going
                traceback.print_exc()
                time.sleep(0.01)

    def _collect_loop(self) -> None:
        turns = 0
        while not self._closed:
            moved = 0
            for dep in list(self.deployments.values()):
                if dep.error is None:
                    try:
                        with dep.sink_lock:
                            if not dep.closed:
                                moved += dep.sink.poll()
                    except Exception as e:  # a subscriber or a log failed: the deployment fails
                        dep.fail(EngineError(f"query {dep.query.name}: delivering results failed: "
                                             f"{type(e).__name__}: {e}", "SINK"))
            turns += 1
            if moved:
                with self.progress:
                    self.progress.notify_all()
                if turns % 16:
                    continue
                self._events(0)
                continue
            self._events(0.05)

    def _events(self, timeout: float) -> None:
        """Wait up to ``timeout`` for outputs, control messages or a worker's death; handle them."""
        readers = [rd for dep in list(self.deployments.values()) for _, rd in dep.sink.channels]
        conns = {w.conn: w for w in self.workers if w.dead is None}
        sentinels = {w.process.sentinel: w for w in self.workers if w.dead is None}
        if timeout:
            for rd in readers:
                rd.sleep_flag(True)
            if any(rd.ready() for rd in readers):
                timeout = 0
        try:
            ready, _, _ = select.select([self.sink_bell.fileno(), *conns, *sentinels], [], [], timeout)
        except (OSError, ValueError):
            ready = []
        finally:
            if timeout:
                for rd in readers:
                    rd.sleep_flag(False)
        if self.sink_bell.fileno() in ready:
            self.sink_bell.drain()
        for c in [c for c in ready if c in conns]:
            self._message(conns[c])
        for s in [s for s in ready if s in sentinels]:
            w = sentinels[s]
            if w.conn.poll(0):
                self._message(w)
            self._died(w)

    def _message(self, w: Worker) -> None:
        try:
            while w.conn.poll(0):
                msg = w.conn.recv()
                if msg[0] == "failed":
                    dep = self.deployments.get(msg[1])
                    if dep is not None:
                        dep.fail(EngineError(msg[2], msg[3]))
                    continue
                with self.progress:
                    slot = self._replies.get(msg[1])
                    if slot is not None:
                        slot.append((msg[0], msg[2]))
                    self.progress.notify_all()
        except (EOFError, OSError):
            pass

    def _died(self, w: Worker) -> None:
        if w.dead is not None or self._closed:
            return
        w.process.join(0.5)
        code = w.process.exitcode
        hosted = {dep.query.name: sorted({f"{sq}[{i}]" for (sq, i), im in dep.assignment.items()
                                          if im == w.slot.index}) for dep in self.deployments.values()}
        hosted = {q: v for q, v in hosted.items() if v}
        what = "; ".join(f"query {q}: {', '.join(v)}" for q, v in hosted.items()) or "no instances"
        w.dead = (f"instance manager {w.slot.index} (pid {w.pid}, cpu {w.slot.cpu}, node {w.slot.node}) "
                  f"died with exit code {code}; it ran {what}")
        for dep in self.deployments.values():
            if dep.query.name in hosted:
                dep.fail(EngineError(w.dead, "WORKER_DIED"))
        with self.progress:
            self.progress.notify_all()

    def snapshots(self) -> dict[int, dict]:
        """The metrics snapshot of every live instance manager."""
        out = {}
        for w in self.workers:
            if w.dead is None:
                try:
                    out[w.slot.index] = self.request(w.slot.index, "metrics", timeout=10)
                except EngineError:
                    pass
        return out

    def im_metrics(self, snaps: dict[int, dict], counters: dict) -> dict[int, dict]:
        """Per instance manager: where it runs, whether it lives, memory, bytes in/out, instances,
        Python GC pauses."""
        out = {}
        for w in self.workers:
            i = w.slot.index
            m = {"pid": w.pid, "cpu": w.slot.cpu, "node": w.slot.node, "alive": w.dead is None}
            if w.dead:
                m["error"] = w.dead
            s = snaps.get(i)
            if s is not None:
                m.update(cpu_num=s["cpu_num"], rss_bytes=s["rss"], bytes_in=s["bytes_in"], bytes_out=s["bytes_out"],
                         cpu_s=round(s["cpu_s"], 3), instances=sum(len(d) for d in s["deployments"].values()),
                         gc=s["gc"])
                for k in ("cpu_s", "bytes_in", "bytes_out"):
                    counters[("im", i, k)] = s[k]
            out[i] = m
        return out

    def load(self) -> dict[int, int]:
        """Instances per instance manager over the live deployments."""
        out = {s.index: 0 for s in self.slots}
        for dep in self.deployments.values():
            for im in dep.assignment.values():
                out[im] += 1
        return out


class WorkerDeployment(Deployment):
    """A query whose instances run in the pool's instance managers."""

    def __init__(self, pool: WorkerPool, id: str, query: Query, parallelism=1, bins: int = 128):
        self.pool = pool
        self.sink_lock = threading.Lock()
        self.closed = False
        super().__init__(id, query, parallelism, bins)

    def _connect(self) -> None:
        pool, layout = self.pool, self.layout
        self.assignment = place(layout, pool.slots, pool.topology, None, pool.load())
        self.runners = []
        self.rings: dict[tuple[Endpoint, Endpoint], str] = {}
        tag = "".join(ch if ch.isalnum() else "_" for ch in self.id)
        bells = {w.slot.index: w.bell for w in pool.workers}
        for n, (p, c) in enumerate(layout.channels()):
            path = os.path.join(pool.dir, f"{tag}-{n}")
            create_ring(path, pool.ring_bytes, pool.sink_bell.path if c == ENGINE else bells[self.assignment[c]])
            self.rings[(p, c)] = path
        try:
            query = _pickler.dumps(self.query)
        except Exception as e:
            raise EngineError(f"query {self.query.name!r} cannot be sent to the instance managers: {e}; "
                              "functions given to apply()/stateful() must be picklable", "PICKLE") from None
        spec = DeploySpec(self.id, query, self.parallelism, self.bins, self.assignment, self.rings,
                          bells, pool.send_bell.path, pool.sink_bell.path)
        self._source_channels = {c: RingProducer(self.rings[(ENGINE, c)], pool.send_bell, batches_stay=True)
                                 for c in layout.consumers(ENGINE)}
        self.source_router = Router(layout.routes(ENGINE), self._source_channels, self.bins)
        sinks = {p: RingConsumer(self.rings[(p, ENGINE)], pool.sink_bell, copy=True) for p in layout.producers(ENGINE)}
        self.sink = Sink(layout, self.logs, self.clock, sinks)
        self.hosts = sorted(set(self.assignment.values()))
        try:
            pool.request_all(self.hosts, "deploy", spec)  # readers touch their rings first (NUMA placement)
            pool.request_all(self.hosts, "map", self.id)
            for w in self._source_channels.values():
                w.map_pages()
        except BaseException:
            for i in self.hosts:
                try:
                    pool.request(i, "undeploy", self.id, timeout=5)
                except EngineError:
                    pass
            self._close_channels()
            raise
        finally:
            for path in self.rings.values():  # everyone has mapped them: the files can go
                unlink_quietly(path)
        with pool.lock:
            pool.deployments[self.id] = self

    def placement_lines(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for (sq, i), im in sorted(self.assignment.items(), key=lambda kv: (self.layout.sq[kv[0][0]].id, kv[0][1])):
            w = self.pool.workers[im]
            out.setdefault(sq, []).append(f"instance {i}: instance manager {im} "
                                          f"(pid {w.pid}, cpu {w.slot.cpu}, node {w.slot.node})")
        return out

    # --- progress --------------------------------------------------------------------------
    def flush(self) -> None:
        """Wait until the rings took everything pushed (back-pressure); EngineError BACKPRESSURE_TIMEOUT
        when an instance takes nothing for ``SEND_TIMEOUT_S`` (the engine then aborts the epoch)."""
        for w in self._source_channels.values():
            w.flush_blocking(SEND_TIMEOUT_S, self.check)

    def abort(self) -> None:
        super().abort()
        for w in self._source_channels.values():
            w.flush()

    def _run(self) -> None:
        """Hand the epoch's progress to the rings: it fits in their control reserve once the data is in."""
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
        deadline = time.monotonic() + (WAIT_TIMEOUT_S if timeout is None else timeout)
        with self.pool.progress:
            while self.sink.done_epoch < target:
                self.check()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise EngineError(f"query {self.query.name}: outputs are at epoch {self.sink.done_epoch} of "
                                      f"{target} after {timeout or WAIT_TIMEOUT_S:.0f} s", "WAIT_TIMEOUT")
                self.pool.progress.wait(min(left, 0.1))
        self.check()

    def fail(self, error: EngineError) -> None:
        if self.error is None:
            self.error = error
        with self.pool.progress:
            self.pool.progress.notify_all()

    def check(self) -> None:
        if self.error is None:
            for im in self.hosts:
                w = self.pool.workers[im]
                if w.dead is None and not w.process.is_alive():
                    self.pool._died(w)
        super().check()

    # --- state ---------------------------------------------------------------------------
    def instance_metrics(self) -> dict[Endpoint, dict]:
        out: dict[Endpoint, dict] = {}
        for im, snap in self.pool.request_all(self.hosts, "metrics").items():
            out.update(snap["deployments"].get(self.id, {}))
        return out

    def close(self) -> None:
        with self.pool.lock:
            self.pool.deployments.pop(self.id, None)
        for i in self.hosts:
            if self.pool.workers[i].dead is None:
                try:
                    self.pool.request(i, "undeploy", self.id, timeout=5)
                except EngineError:
                    pass
        self._close_channels()

    def _close_channels(self) -> None:
        with self.sink_lock:
            self.closed = True
        for ch in list(getattr(self, "_source_channels", {}).values()):
            ch.close()
        for _, ch in getattr(getattr(self, "sink", None), "channels", ()):
            ch.close()
