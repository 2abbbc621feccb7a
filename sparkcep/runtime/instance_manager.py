"""The instance manager (UPM-CEP §4.1.2): one single-threaded process per core, running sub-query instances.

It pins itself to its core (``os.sched_setaffinity``), prefers memory of
its NUMA node (libnuma) and first-touches its input rings, then loops:
run every hosted instance over its input channels (numba kernels release
the GIL; there is no other thread anyway), flush what the outputs could not
take, answer the engine's control messages; when nothing moves, spin a
moment, then sleep on its doorbell until a peer rings it.

The engine talks to it over a pipe (control plane, pickled messages):
``("deploy", id, spec)``, ``("map", id, name)`` (map the pages of its output rings, once every
reader has touched its inputs), ``("undeploy", id, name)``, ``("metrics", id)``,
``("stop", id)``; it answers ``("ok", id, value)`` or ``("error", id, text)``
and reports a failing instance as ``("failed", deployment, text, error code)``. Data
never goes through the pipe. It exits by itself when the pipe closes or its
parent process is gone.

``python -m sparkcep.runtime.instance_manager --name NAME --cpu CPU`` runs a
pinned instance manager for the executor launcher (:mod:`sparkcep.spark.executor`);
until the control plane deploys onto registered instance managers over TCP,
such a process idles until SIGTERM.
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import gc
import os
import pickle
import signal
import sys
import time
import traceback
from dataclasses import dataclass

import psutil
import pyarrow as pa

from sparkcep.errors import EngineError, OperatorError
from sparkcep.query.planner import plan
from sparkcep.runtime.balancers import Router
from sparkcep.runtime.channels import Doorbell, RingConsumer, RingProducer
from sparkcep.runtime.instance import InstanceRunner
from sparkcep.runtime.layout import ENGINE, Endpoint, Layout
from sparkcep.runtime.metrics import EpochClock
from sparkcep.runtime.topology import pin, prefer_node
from sparkcep.runtime.warmup import warm_up

SPIN_S = 100e-6     # busy-poll this long after the last message before sleeping
SLEEP_S = 0.2       # longest sleep: bounds a missed wake-up and the parent-death check
CONTROL_EVERY = 32  # loop turns between looks at the control pipe while busy
KEEP_BYTES = 256 << 20  # freed memory an instance manager keeps for reuse (glibc malloc)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (glibc malloc.h)


@dataclass
class IMConfig:
    """What an instance-manager process is told when it starts (picklable)."""

    index: int
    cpu: int | None
    node: int | None
    doorbell: str
    name: str = ""


@dataclass
class DeploySpec:
    """One deployment as the instance managers get it: picklable names and numbers only."""

    id: str
    query: bytes                         # the Query, pickled (cloudpickle when available)
    parallelism: dict[str, int]
    bins: int
    assignment: dict[Endpoint, int]      # instance -> instance manager
    rings: dict[tuple[Endpoint, Endpoint], str]  # (producer, consumer) -> ring file
    doorbells: dict[int, str]            # instance manager -> doorbell FIFO
    engine_send_bell: str                # the engine's thread that writes source data
    engine_sink_bell: str                # the engine's thread that reads the outputs
    zero_copy: bool = True


@dataclass
class Hosted:
    """The instances of one deployment on this instance manager."""

    spec: DeploySpec
    runners: list[InstanceRunner]
    readers: list[RingConsumer]
    writers: list[RingProducer]
    failed: bool = False


class GCPauses:
    """Python's garbage-collector pauses in this process (a ``gc.callbacks`` entry)."""

    def __init__(self):
        self.collections = self.total_ns = self.max_ns = self._start = 0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter_ns()
            return
        pause = time.perf_counter_ns() - self._start
        self.collections += 1
        self.total_ns += pause
        self.max_ns = max(self.max_ns, pause)

    def snapshot(self) -> dict:
        return {"collections": self.collections, "pause_ms_total": round(self.total_ns / 1e6, 3),
                "pause_ms_max": round(self.max_ns / 1e6, 3), "frozen_objects": gc.get_freeze_count()}


class InstanceManager:
    def __init__(self, config: IMConfig, conn):
        self.config, self.conn = config, conn
        self.bell = Doorbell(config.doorbell)
        self.bell.fileno()
        self.bells: dict[str, Doorbell] = {config.doorbell: self.bell}
        self.hosted: dict[str, Hosted] = {}
        self.stopping = False
        self.ppid = os.getppid()
        self.process = psutil.Process()
        self.gc_pauses = GCPauses()
        gc.callbacks.append(self.gc_pauses)

    # --- the loop ----------------------------------------------------------------------
    def loop(self) -> None:
        turns, idle_since = 0, None
        while not self.stopping:
            work = 0
            for h in list(self.hosted.values()):
                if not h.failed:
                    work += self._step(h)
            turns += 1
            if work:
                idle_since = None
                if turns % CONTROL_EVERY == 0:
                    self._control(0)
                continue
            now = time.perf_counter()
            if idle_since is None:
                idle_since = now
                self._control(0)
            elif now - idle_since > SPIN_S:
                self._sleep()
                idle_since = None

    def _step(self, h: Hosted) -> int:
        work, current = 0, None
        try:
            for current in h.runners:
                if current.router.backlog_bytes:
                    current.router.flush()
                if current.ready:
                    work += current.poll()
        except Exception as e:  # an operator failed: report it, stop running this deployment
            h.failed = True
            where = (f"instance manager {self.config.index} (pid {os.getpid()}): "
                     f"{current.name if current else '?'} of query {h.spec.id.split('#')[0]}")
            if isinstance(e, OperatorError):
                self._send(("failed", h.spec.id, f"{where}: {e}", e.code))
            else:
                self._send(("failed", h.spec.id, f"{where} failed: {type(e).__name__}: {e}\n"
                                                 f"{traceback.format_exc()}", "INSTANCE_FAILED"))
        return work

    def _sleep(self) -> None:
        live = [h for h in self.hosted.values() if not h.failed]
        readers = [rd for h in live for rd in h.readers]
        writers = [w for h in live for w in h.writers if w.backlog_bytes]
        for rd in readers:
            rd.sleep_flag(True)
        for w in writers:
            w.sleep_flag(True)
        ready = []
        try:
            if not any(rd.ready() for rd in readers) and not any(w.flush() for w in writers):
                ready = self.bell.wait(SLEEP_S, also=[self.conn])
        finally:
            for rd in readers:
                rd.sleep_flag(False)
            for w in writers:
                w.sleep_flag(False)
        if self.conn in ready:
            self._control(0)  # after the flags: a control message may close these channels
        if os.getppid() != self.ppid:  # the engine is gone
            self.stopping = True

    # --- control -----------------------------------------------------------------------
    def _control(self, timeout: float) -> None:
        try:
            while self.conn.poll(timeout):
                msg = self.conn.recv()
                self._handle(msg)
                timeout = 0
        except (EOFError, OSError):
            self.stopping = True  # the engine closed the pipe or died

    def _handle(self, msg) -> None:
        kind, req = msg[0], msg[1]
        try:
            if kind == "deploy":
                value = self._deploy(msg[2])
            elif kind == "map":
                for w in self.hosted[msg[2]].writers:
                    w.map_pages()
                value = None
            elif kind == "undeploy":
                value = self._undeploy(msg[2])
            elif kind == "metrics":
                value = self.snapshot()
            elif kind == "stop":
                self.stopping = True
                value = None
            else:
                raise EngineError(f"unknown control message {kind!r}", "CONTROL")
            self._send(("ok", req, value))
        except Exception as e:
            self._send(("error", req, f"instance manager {self.config.index}: {type(e).__name__}: {e}\n"
                                      f"{traceback.format_exc()}"))

    def _send(self, msg) -> None:
        try:
            self.conn.send(msg)
        except (OSError, EOFError):
            self.stopping = True

    def _bell(self, path: str) -> Doorbell:
        if path not in self.bells:
            self.bells[path] = Doorbell(path)
        return self.bells[path]

    def _deploy(self, spec: DeploySpec) -> dict:
        query = pickle.loads(spec.query)
        layout = Layout(plan(query), spec.parallelism)
        clock = EpochClock()

        runners, readers, writers = [], [], []
        try:
            for ep in layout.instances():
                if spec.assignment[ep] != self.config.index:
                    continue
                stateful = layout.sq[ep[0]].head.stateful
                ins = {p: RingConsumer(spec.rings[(p, ep)], self.bell, copy=stateful or not spec.zero_copy)
                       for p in layout.producers(ep)}
                outs = {c: RingProducer(spec.rings[(ep, c)], self.bell) for c in layout.consumers(ep)}
                readers += ins.values()
                writers += outs.values()
                router = Router(layout.routes(ep), outs, spec.bins)
                runners.append(InstanceRunner(layout, ep, spec.bins, ins, router, clock))
        except BaseException:
            for ch in readers + writers:
                ch.close()
            raise
        self.hosted[spec.id] = Hosted(spec, runners, readers, writers)
        return {"instances": [r.endpoint for r in runners], "pid": os.getpid()}

    def _undeploy(self, dep_id: str) -> None:
        h = self.hosted.pop(dep_id, None)
        if h is not None:
            h.runners.clear()
            for ch in h.readers + h.writers:
                ch.close()

    def snapshot(self) -> dict:
        """Counters of every hosted instance, plus this process's bytes in/out, CPU, memory and GC pauses."""
        deps = {}
        bytes_in = bytes_out = 0
        for dep_id, h in self.hosted.items():
            deps[dep_id] = {r.endpoint: {**r.counters.snapshot(), "queue": r.queued(), "late": r.late()}
                            for r in h.runners}
            bytes_in += sum(rd.bytes_in for rd in h.readers)
            bytes_out += sum(w.bytes_out for w in h.writers)
        mem = self.process.memory_info()
        cpu = self.process.cpu_times()
        return {"deployments": deps, "bytes_in": bytes_in, "bytes_out": bytes_out,
                "cpu_s": cpu.user + cpu.system, "rss": mem.rss, "cpu_num": self.process.cpu_num(),
                "pid": os.getpid(), "time": time.monotonic(), "gc": self.gc_pauses.snapshot()}


def keep_freed_memory() -> None:
    """Allocate Arrow buffers with malloc, and let malloc keep what is freed for the next batch.

    Arrow's default mimalloc pool hands freed pages back and faults them in
    again as 2 MiB huge pages (THP), zeroing each: a third of fixwindow's
    time. glibc's malloc, left alone, maps large blocks fresh each time and
    trims its heap; raising both thresholds keeps the memory of the last
    batches (up to about ``KEEP_BYTES``) instead of faulting it in again.
    ``KEEP_BYTES // 8`` of heap is faulted in now, so the first large batches
    (a window closing over 50K keys allocates some MB) do not fault either.
    """
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        libc = ctypes.CDLL(None)
        mallopt, malloc, free = libc.mallopt, libc.malloc, libc.free
    except (OSError, AttributeError):  # not glibc
        return
    mallopt(M_MMAP_THRESHOLD, KEEP_BYTES // 4)
    mallopt(M_TRIM_THRESHOLD, KEEP_BYTES)
    malloc.restype, free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    block = malloc(KEEP_BYTES // 8)  # below the mmap threshold: from the heap, which keeps it once freed
    if block:
        ctypes.memset(block, 0, KEEP_BYTES // 8)
        free(block)


def serve(config: IMConfig, conn, close=()) -> None:
    """Body of an instance-manager process started by the engine (any start method)."""
    for c in close:  # fork: pipe ends of other instance managers inherited from the parent
        try:
            c.close()
        except OSError:
            pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the engine; it stops us
    faulthandler.register(signal.SIGUSR1, all_threads=False)  # kill -USR1 <pid>: where is it stuck?
    try:
        pin(config.cpu)
        prefer_node(config.node)
        keep_freed_memory()
        warm_up()  # at once when forked from a warm parent; else compiles or loads numba's cache
        # numba, pyarrow and numpy leave ~150K long-lived objects; a full collection scanning them
        # stops this process for ~100 ms. Frozen, they are never scanned (a deployment adds hundreds).
        gc.freeze()
        im = InstanceManager(config, conn)
        conn.send(("ready", config.index, {"pid": os.getpid(), "cpu": config.cpu, "node": config.node}))
    except Exception as e:
        try:
            conn.send(("error", config.index, f"{type(e).__name__}: {e}"))
        finally:
            return
    profile = os.environ.get("SPARKCEP_PROFILE_IM")  # a directory: write cProfile stats per worker there
    if profile:
        import cProfile
        prof = cProfile.Profile()
        prof.runcall(im.loop)
        prof.dump_stats(os.path.join(profile, f"im-{config.index}.prof"))
    else:
        im.loop()
    for h in list(im.hosted):
        im._undeploy(h)
    im.bell.close()


def main(argv: list[str] | None = None) -> int:
    """A standalone, pinned instance manager for the executor launcher; idles until SIGTERM."""
    ap = argparse.ArgumentParser(prog="python -m sparkcep.runtime.instance_manager")
    ap.add_argument("--name", default="")
    ap.add_argument("--cpu", type=int, default=None)
    ap.add_argument("--engine", default=None)
    args = ap.parse_args(argv)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    pin(args.cpu)
    parent = os.getppid()
    while not stop and os.getppid() == parent:
        time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
