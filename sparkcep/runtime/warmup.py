"""Compile (or load from numba's on-disk cache) the kernels deployments use, before the first batch.

An instance manager calls :func:`warm_up` before it says it is ready, so it
answers its first batch at once instead of compiling for seconds (all of
them at the same time). With numba's cache warm it takes about a second;
cold, a minute or two on 2 cores, which is why the install runs
``sparkcep warm-up`` once: it leaves every kernel in the cache, so the first
run on a machine is as fast as the next ones.

While it runs, a starting worker tells the engine what it is doing
(:func:`heartbeat`), so the engine can wait for a worker that is busy
compiling and still name one that is stuck or dead within seconds.
"""

from __future__ import annotations

import datetime as dt
import multiprocessing
import os
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager

_done = False
_lock = threading.Lock()
HEARTBEAT_S = 1.0  # a starting worker says it is alive this often
PHASE = "warming up kernels"  # what a starting worker says it does meanwhile
PARTS = dict(__warm_a=0, __warm_b=0, __warm_c=0, __warm_i=0, __warm_d=0, __warm_e=0, __warm_h=0,
             __warm_f=1, __warm_g=1, __warm_j=1, __warm_k=1)  # two halves of about equal compile time


def _outputs(s, r):
    """The warm-up query's outputs, one a kernel family: ``(name, stream)`` pairs to pick from."""
    from sparkcep.query import aggregates as fn
    from sparkcep.query.expressions import col
    from sparkcep.query.running import Running
    from sparkcep.query.windows import TimeWindow, TupleWindow

    funcs = dict(n=fn.count(), c=fn.count("v"), sv=fn.sum("v"), sx=fn.sum("x"), a=fn.avg("x"),
                 mi=fn.min("v"), mx=fn.max("x"), ms=fn.min("k"), Ms=fn.max("k"), f=fn.first("v"),
                 lx=fn.last("x"), fs=fn.first("k"), ls=fn.last("k"))
    f = s.filter((col("v") > 0) | col("k").is_null())
    return [
        ("__warm_a", f.aggregate(TimeWindow("10s", advance="5s"), by=["k"], **funcs)),
        ("__warm_b", s.aggregate(TupleWindow(2), by=["g", "k"], **funcs)),
        ("__warm_c", s.aggregate(TupleWindow(2), n=fn.count())),
        ("__warm_d", s.map(k="k", ts="ts", w=col("v") * 2).join(r, TimeWindow("10s"), on="k")),
        ("__warm_e", s.join(r, TimeWindow("10s"), where=col("v_left") < col("v_right"))),
        # a key of one string field is hashed as it is, any other is encoded first: each kind of key
        # compiles its own kernels, so each keyed operator runs with both
        ("__warm_h", s.join(r, TimeWindow("10s"), on="g")),
        ("__warm_i", s.aggregate(TupleWindow(2), by="k", n=fn.count())),
        ("__warm_j", s.aggregate(Running(), by="g", n=fn.count())),
        ("__warm_k", s.filter(col("k").startswith("a") | (col("k") == "b") | (col("k") < col("k")))
         .map(k=col("k").split_part(",", 2), ts="ts")),
        ("__warm_f", f.union(s.filter(col("v") < 2)).aggregate(Running(), by=["k"], **funcs)),
        ("__warm_g", s.map(k=col("k").split_part(",", 1), ts="ts").aggregate(Running(), by="k", n=fn.count())),
    ]


def warm_up(progress=None, part=None) -> None:
    """Run a tiny query over every kernel family once in this process (idempotent).

    ``progress(step, steps)`` is called before each of its steps. ``part`` (0 or 1) runs only half
    of the families, for two processes to fill the cache side by side.
    """
    global _done
    with _lock:
        if _done:
            return
        from sparkcep.core.columns import as_int64, stamp
        from sparkcep.core.ingest import to_batch
        from sparkcep.query.query import Query
        from sparkcep.runtime.deployment import Deployment

        schema = "k string, g int64, ts timestamp, v int64, x float64, i int32"
        q = Query("__sparkcep_warm_up__")
        s, r = q.stream("__warm_l", schema), q.stream("__warm_r", schema)
        for name, out in _outputs(s, r):
            if part is None or PARTS[name] == part:
                q.output(name, out)
        t0 = dt.datetime(2024, 1, 1)
        rows = {"k": ["a", None, "b", "a"], "g": [1, 2, None, 1], "v": [1, None, 3, 4], "x": [0.5, 1.0, None, 2.0],
                "i": [1, 2, 3, 4], "ts": [t0 + dt.timedelta(seconds=i) for i in range(4)]}
        many = {"k": [f"key-{i}" for i in range(200)], "g": list(range(200)), "v": list(range(200)),
                "x": [0.5] * 200, "i": [7] * 200, "ts": [t0] * 200}  # enough keys to grow the tables: rebuilds compile too
        # rows that fire the windows before them, then rows added after a fire (which frees its slots)
        later = [dict(rows, ts=[t0 + dt.timedelta(seconds=s + i) for i in range(4)]) for s in (30, 60)]
        dep = Deployment("warm#1", q, parallelism=2, bins=4)
        seq, step, steps = 0, 0, 10
        for stream in ("__warm_l", "__warm_r"):
            src = q.sources[stream]
            for data in (rows, many, *later):
                step += 1
                if progress is not None:
                    progress(step, steps)
                batch = to_batch(stream, src.schema, data, src.time_field)
                times = as_int64(batch.column(src.time_field))
                dep.push(stream, stamp(batch, seq, times, dep.sources[stream].max_ts),
                         int(times.to_numpy().max()), seq + batch.num_rows - 1)
                seq += batch.num_rows
                dep.progress(seq - 1)
            step += 1
            if progress is not None:
                progress(step, steps)
            dep.end(stream, seq - 1)
        _done = part is None


@contextmanager
def heartbeat(say):
    """While the block runs, ``say(line)`` every :data:`HEARTBEAT_S` from a thread of its own: the
    phase, its step and the seconds spent. ``say`` also gets the line of each new step at once.

    Yields ``progress(step, steps)`` to hand to :func:`warm_up`. The thread keeps ticking while
    numba compiles (LLVM runs without the GIL), so silence means the process is frozen.

    Entered in the main thread of a starting worker: SIGTERM or SIGINT, when the caller handles it,
    reaches the caller's handler and then ends the process (exit 128 + the signal's number) at
    once, instead of after a warm-up of minutes.
    """
    start, state, stop = time.monotonic(), {"step": "", "new": True}, threading.Event()
    lock = threading.Lock()

    def line() -> str:
        return f"{PHASE} {state['step']} {time.monotonic() - start:.0f}s".replace("  ", " ")

    def progress(step: int, steps: int) -> None:
        with lock:
            state["step"] = f"step {step}/{steps}"
            say(line())

    def tick() -> None:
        while not stop.wait(HEARTBEAT_S):
            with lock:
                say(line())
    thread = threading.Thread(target=tick, name="sparkcep-heartbeat", daemon=True)
    thread.start()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for sig, handler in handlers.items():
            if callable(handler):
                signal.signal(sig, _then_exit(handler))
        yield progress
    finally:
        stop.set()
        thread.join()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def _then_exit(handler):
    """A signal handler calling ``handler``, then ending the process as the signal asks: with
    ``os._exit``, as an exception raised while numba compiles may be lost in LLVM's callbacks. A
    warming-up worker holds nothing the end of its process does not release."""
    def stop(signum, frame):
        handler(signum, frame)
        os._exit(128 + signum)
    return stop


def add_arguments(parser) -> None:
    """``sparkcep warm-up`` takes no arguments."""


def _warm_part(part: int) -> None:
    warm_up(lambda step, steps: print(f"sparkcep warm-up: part {part + 1}/2 step {step}/{steps}",
                                      file=sys.stderr, flush=True), part=part)


def run(args) -> int:
    """Body of ``sparkcep warm-up``: fill numba's cache with every kernel the engine uses.

    Two processes compile half of the kernel families each (compiling is single-threaded), then
    this one runs them all: it loads them from the cache and compiles any a concurrent cache write lost.
    """
    t0 = time.monotonic()
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_warm_part, (0, 1)))
    warm_up()
    print(f"sparkcep warm-up: the engine's kernels are in numba's cache ({time.monotonic() - t0:.1f} s)", flush=True)
    return 0
