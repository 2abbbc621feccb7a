"""Bounds before allocation: what the counts a user passes would take of this machine, checked first.

A count that passes the API's own rules (instances at most bins, bins a
power of two) can still ask for more than the machine holds: a rescale of
a window count to 1,000 instances on two workers is 3,002 shared-memory
rings of 16 MiB, 47 GiB in ``/dev/shm``. The kernel then kills processes,
the engine's among them, and leaves the rings behind. So every request is
sized here, from the plan alone, before any of it exists:

* :func:`check_workers` — ``Engine.local(workers=, standby=)``: processes
  against the CPUs of the topology and the memory free;
* :func:`ring_bytes_of` — ``Engine.local(ring_bytes=)``: a sane ring size
  that fits ``/dev/shm``;
* :func:`check_deployment` (``Engine.deploy``) and :func:`check_generation`
  (a rescale or a move deploys a whole new generation beside the running
  one): the rings between its processes against ``/dev/shm``, its
  instances' state, the rings and the output logs' retention against memory.

A request that does not fit raises :class:`~sparkcep.errors.EngineError`
``CAPACITY`` naming the limit and both figures; nothing was allocated, and
the engine goes on serving. A machine's figures that cannot be read (no
``/proc/meminfo``, no ``/dev/shm``) bound nothing.
"""

from __future__ import annotations

import gc
import os
import types
from dataclasses import dataclass

import numpy as np

from sparkcep.arguments import integer
from sparkcep.errors import EngineError
from sparkcep.query.operators import Aggregate
from sparkcep.query.planner import Plan, plan
from sparkcep.runtime.channels.ring import HEADER_BYTES
from sparkcep.runtime.deployment import bins_of, parallelism_of
from sparkcep.runtime.layout import ENGINE, Layout
from sparkcep.runtime.output_log import DEFAULT_RETENTION, Retention
from sparkcep.runtime.wiring import machine_id

SHM = "/dev/shm"
MEMINFO = "/proc/meminfo"
FREE_SHARE = 0.8  # of what the machine has free, a request may take this much: the rest is for what estimates miss
WORKER_BYTES = 256 << 20  # a `sparkcep worker` process: 140-145 MiB of its own once started, measured; then batches
MAX_WORKERS_PER_CPU = 4  # instance managers are single-threaded loops pinned to a core: more than this is no use
MIN_RING_BYTES, MAX_RING_BYTES = 64 << 10, 1 << 30
INSTANCE_BYTES = 32 << 10  # an instance's objects besides its state (a stateless one measured 24 KiB)
TABLE_BYTES_PER_BIN = 8  # each instance's router keeps a bin -> instance table per keyed operator downstream
ROW_BYTES = 16  # an output log keeps at least a row's output id (two int64) whatever its fields
SAMPLE_BINS = (64, 128)  # an aggregate's state is measured at these and extrapolated (it is linear in bins)


@dataclass(frozen=True)
class Machine:
    """What this machine has free now: memory (``MemAvailable``), its total, and ``/dev/shm``'s free
    bytes; None where it cannot be read."""

    memory_free: int | None
    memory_total: int | None
    shm_free: int | None

    @classmethod
    def now(cls) -> "Machine":
        info = {}
        try:
            with open(MEMINFO) as f:
                for line in f:
                    key, _, value = line.partition(":")
                    info[key] = int(value.split()[0]) * 1024
        except (OSError, ValueError, IndexError):
            pass
        try:
            st = os.statvfs(SHM)
            shm = st.f_bavail * st.f_frsize
        except OSError:
            shm = None
        return cls(info.get("MemAvailable"), info.get("MemTotal"), shm)


def check_workers(n: int, cpus: int, machine: Machine | None = None) -> None:
    """``n`` instance manager processes (workers and standbys) on ``cpus`` CPUs: CAPACITY when there
    are more than :data:`MAX_WORKERS_PER_CPU` a CPU, or their memory exceeds what is free."""
    if n > MAX_WORKERS_PER_CPU * cpus:
        raise EngineError(f"{n} instance managers on {cpus} CPUs: at most {MAX_WORKERS_PER_CPU} a CPU "
                          f"({MAX_WORKERS_PER_CPU * cpus}); each is a single-threaded process pinned to a core",
                          "CAPACITY")
    machine = machine or Machine.now()
    _fits(f"{n} instance managers", n * WORKER_BYTES, "memory", machine.memory_free,
          f"{_size(WORKER_BYTES)} each", "start fewer workers")


def ring_bytes_of(value, machine: Machine | None = None) -> int:
    """``ring_bytes`` checked: an integer, a power of two from 64 KiB to 1 GiB (``BAD_RING_BYTES``), and
    two rings of it (the least a deployment on workers has: one in, one out) within ``/dev/shm``'s free
    bytes (``CAPACITY``)."""
    n = integer(value, "ring_bytes", minimum=MIN_RING_BYTES, maximum=MAX_RING_BYTES, error=EngineError,
                code="BAD_RING_BYTES")
    if n & (n - 1):
        raise EngineError(f"ring_bytes must be a power of two, got {n}", "BAD_RING_BYTES")
    machine = machine or Machine.now()
    _fits("two rings", 2 * (n + HEADER_BYTES), SHM, machine.shm_free, f"ring_bytes={n:,}",
          "choose a smaller ring_bytes")
    return n


def check_deployment(query, parallelism, bins, replicas: int, retain, cluster) -> None:
    """``Engine.deploy(query, parallelism, bins, retain, replicas)`` on ``cluster`` (the engine's instance
    managers; None: in the engine's process) fits this machine? Checks the arguments as the deployment
    will (QueryError codes), then :func:`check_generation` for each replica and the output logs'
    retention against the machine's memory."""
    p = plan(query)
    bins = bins_of(bins)
    _check_retention(query, retain, Machine.now())
    check_generation(p, parallelism_of(p, parallelism, bins), bins, replicas, cluster,
                     f"query {query.name!r} at parallelism {parallelism!r}"
                     f"{f' with {replicas:,} replicas' if replicas > 1 else ''}")


def check_generation(p: Plan, parallelism: dict[str, int], bins: int, copies: int, cluster, what: str) -> None:
    """``copies`` generations of ``p`` with ``parallelism`` instances per sub-query (one per replica)
    fit beside what runs? On instance managers of this machine: their rings against ``/dev/shm``, and
    rings plus instance state against memory; in the engine's process (``cluster`` None, or no instance
    manager alive): the instances' state against memory. Every channel is counted as a ring (an upper
    bound: one to another host is TCP, which holds as much in flight, in memory). Instance managers all
    on other machines are not sized from here."""
    layout = Layout(p, parallelism)
    instances = _count(sum(parallelism.values()), "instance")
    each, fewer = (f"{copies:,} replicas of ", "use fewer replicas, instances or bins") if copies > 1 else \
        ("", "use fewer instances or fewer bins")
    state = sum(n * (instance_state_bytes(p, sq, bins) + INSTANCE_BYTES) for sq, n in parallelism.items())
    machine = Machine.now()
    live = [] if cluster is None else [im for im in cluster.ims if im.dead is None]
    if not live:
        _fits(what, copies * state, "memory", machine.memory_free,
              f"{each}{instances} in the engine's process", fewer)
        return
    if not any(im.info.host.startswith(machine_id() + "/") for im in live):
        return
    rings = channel_count(layout)
    ring = cluster.ring_bytes + HEADER_BYTES
    _fits(what, copies * rings * ring, SHM, machine.shm_free, f"{each}{_count(rings, 'ring')} of {_size(ring)}",
          "use fewer instances, or a smaller ring_bytes")
    _fits(what, copies * (rings * ring + state), "memory", machine.memory_free,
          f"{each}{_count(rings, 'ring')} and {instances}", fewer)


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def channel_count(layout: Layout) -> int:
    """The channels of ``layout``: one per (producer, consumer) pair (:meth:`Layout.channels`), counted
    without listing them (every instance of a sub-query has the producers of its first)."""
    return len(layout.producers(ENGINE)) + sum(n * len(layout.producers((sq, 0)))
                                               for sq, n in layout.parallelism.items())


def instance_state_bytes(p: Plan, sq: str, bins: int) -> int:
    """Bytes one instance of sub-query ``sq`` allocates when it starts, with ``bins`` bins: a window or
    running aggregate preallocates its hash slots for every bin (about 1 KiB a bin for a count),
    measured by building it with :data:`SAMPLE_BINS` bins and extrapolating; a join allocates as rows
    come, a user's operator's state is its own. Plus each router's bin table."""
    from sparkcep.core.operators import physical
    total = TABLE_BYTES_PER_BIN * bins
    for op in next(s for s in p.subqueries if s.name == sq).operators:
        if isinstance(op, Aggregate):
            lo, hi = (_array_bytes(physical(op, b)) for b in SAMPLE_BINS)
            per_bin = (hi - lo) / (SAMPLE_BINS[1] - SAMPLE_BINS[0])
            total += int(lo + per_bin * (bins - SAMPLE_BINS[0]))
    return total


def _check_retention(query, retain, machine: Machine) -> None:
    """The most the output logs of ``query`` may keep (their :class:`Retention`) within the machine's memory."""
    r = DEFAULT_RETENTION if retain is True else retain
    if not isinstance(r, Retention):
        return
    each = r.bytes if r.bytes is not None else None if r.rows is None else r.rows * ROW_BYTES
    if each is not None:
        n = len(query.outputs)
        _fits(f"the output logs of query {query.name!r}", n * each, "memory", machine.memory_total,
              f"{n} outputs, retain={r}", "give a smaller cep.Retention(bytes=...) or retain=False", "in all")


def _fits(what: str, need: int, limit: str, free: int | None, made_of: str, advice: str, has: str = "free") -> None:
    """CAPACITY unless ``need`` bytes of ``limit`` are at most :data:`FREE_SHARE` of the ``free`` ones."""
    if free is not None and need > FREE_SHARE * free:
        raise EngineError(f"{what} needs {_size(need)} of {limit} ({made_of}); this machine has {_size(free)} "
                          f"{has}, of which a request may take {FREE_SHARE:.0%}: {advice}", "CAPACITY")


def _array_bytes(root) -> int:
    """Bytes of the numpy arrays reachable from ``root`` (not through modules, classes or functions)."""
    skip = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, str, bytes)
    seen, stack, total = set(), [root], 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            total += obj.nbytes
        else:
            stack.extend(gc.get_referents(obj))
    return total


def _size(n: int) -> str:
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"
