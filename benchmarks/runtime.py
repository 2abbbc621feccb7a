"""The parallel runtime's own costs, each beside its peer from the same run.

    python benchmarks/runtime.py [--rows 4000000] [--batch 65536]

1. channel: batches of 64K rows x 24 bytes from one pinned process to another,
   through a shared-memory ring (spin, then doorbell wait) vs multiprocessing.Queue
   (pickle) — tuples/s and the ratio.
2. engine: a stateless query (map + filter, every instance busy) and a keyed
   time-window aggregate, ``workers=0`` (one process) vs ``workers=2`` (two instance
   managers): tuples/s and latency percentiles (arrival at the engine -> result out)
   from ``engine.metrics()``, as fast as possible, then open loop below saturation.
   On a 2-core machine the engine process shares the cores with both workers.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

try:
    import sparkcep as cep
except ModuleNotFoundError:  # run from a source checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import sparkcep as cep

from sparkcep.arguments import bounded
from sparkcep.runtime.channels import Doorbell, Progress, RingConsumer, RingProducer, create_ring

MAX_ROWS = 50_000_000  # made up front as Arrow batches, ~30 B a row (a 9-byte key, a time, an int64): 1.5 GB
MAX_BATCH = 1 << 24  # rows a batch; the channel's is 24 B a row (400 MB) and multiprocessing.Queue pickles it


def _pin(i):
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[i % len(cpus)]})


def _ring_reader(path, reader_bell, out):
    _pin(1)
    bell = Doorbell(reader_bell)
    r = RingConsumer(path, bell, copy=False)
    rows = 0
    while True:
        m = r.receive()
        if m is None:
            r.sleep_flag(True)
            if not r.ready():
                bell.wait(0.05)
            r.sleep_flag(False)
            continue
        if isinstance(m, Progress):
            break
        rows += m.batch.num_rows
    out.put(rows)


def _queue_reader(q, out):
    _pin(1)
    rows = 0
    while (b := q.get()) is not None:
        rows += b.num_rows
    out.put(rows)


def channel(rows: int, batch_rows: int) -> tuple[float, float]:
    b = pa.record_batch({c: np.arange(batch_rows, dtype=np.int64) for c in "abc"})
    n = rows // batch_rows
    ctx = mp.get_context("fork")
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as d:
        path = os.path.join(d, "ring")
        rb, wb = Doorbell.create(os.path.join(d, "r")), Doorbell.create(os.path.join(d, "w"))
        create_ring(path, 16 << 20, rb.path)
        out = ctx.Queue()
        p = ctx.Process(target=_ring_reader, args=(path, rb.path, out))
        p.start()
        _pin(0)
        w = RingProducer(path, wb)
        t0 = time.perf_counter()
        for i in range(n):
            w.send_data(0, (i, i, 0), b)
            w.flush_blocking(30)
        w.send_progress(n, n, n, 0)
        w.flush_blocking(30)
        got = out.get(timeout=60)
        ring = got / (time.perf_counter() - t0)
        p.join()
    q = ctx.Queue(maxsize=8)
    p = ctx.Process(target=_queue_reader, args=(q, out))
    p.start()
    t0 = time.perf_counter()
    for _ in range(n):
        q.put(b)
    q.put(None)
    got = out.get(timeout=60)
    queue = got / (time.perf_counter() - t0)
    p.join()
    os.sched_setaffinity(0, set(range(os.cpu_count())) & os.sched_getaffinity(os.getppid()) or {0})
    return ring, queue


def engine_run(kind: str, workers: int, rows: int, batch_rows: int, rate: float | None = None) -> dict:
    q = cep.Query(f"bench_{kind}")
    s = q.stream("bench_in", "k string, ts timestamp, v int64")
    if kind == "stateless":
        q.output("bench_out", s.map(k="k", ts="ts", v=cep.col("v") * 2, name="m").filter(cep.col("v") >= 0, name="f"))
        par = 2
    else:
        q.output("bench_out", s.aggregate(cep.TimeWindow("1s"), by="k", name="agg", n=cep.count(), sv=cep.sum("v")))
        par = 2
    keys = np.array([f"10.0.{i // 256}.{i % 256}" for i in range(10_000)], dtype=object)
    rng = np.random.default_rng(0)
    batches = []
    for i in range(0, rows, batch_rows):
        n = min(batch_rows, rows - i)
        batches.append(pa.record_batch({"k": pa.array(keys[rng.integers(0, len(keys), n)], pa.string()),
                                        "ts": pa.array(np.arange(i, i + n) * 100, pa.timestamp("us")),
                                        "v": pa.array(np.arange(i, i + n))}))
    with cep.Engine.local(workers=workers) as e:
        e.deploy(q, parallelism=par if workers else 1)
        e.send("bench_in", batches[0].slice(0, 10))  # kernels warm, channels open
        t0 = time.perf_counter()
        for j, b in enumerate(batches):
            if rate:  # open loop: batch j goes out at j * batch_rows / rate
                wait = t0 + j * batch_rows / rate - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
            e.send("bench_in", b)
        e.end("bench_in")
        elapsed = time.perf_counter() - t0
        m = e.metrics()["queries"][q.name]
    return {"tuples/s": rows / elapsed, "latency_ms": m["latency_ms"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=bounded(int, 1, MAX_ROWS), default=4_000_000)
    p.add_argument("--batch", type=bounded(int, 1, MAX_BATCH), default=65_536,
                   help="rows per batch (at most 4 x --rows: the channel moves 4 x --rows)")
    a = p.parse_args(argv)
    if a.batch > 4 * a.rows:  # the channel would move no batch at all
        p.error(f"argument --batch: at most 4 x --rows ({4 * a.rows:,}), got {a.batch:,}")
    ring, queue = channel(a.rows * 4, a.batch)
    print(f"channel, {a.batch:,}-row batches of 24 B rows between two pinned processes:")
    print(f"  shared-memory ring     {ring / 1e6:8.1f} M tuples/s")
    print(f"  multiprocessing.Queue  {queue / 1e6:8.1f} M tuples/s   (ring / queue = {ring / queue:.1f}x)")
    for kind in ("stateless", "aggregate"):
        one = engine_run(kind, 0, a.rows, a.batch)
        two = engine_run(kind, 2, a.rows, a.batch)
        print(f"engine, {kind} query, {a.rows:,} tuples:")
        for name, r in (("workers=0 (one process)", one), ("workers=2 (2 instance managers)", two)):
            lat = "  ".join(f"{k} {v:g} ms" for k, v in r["latency_ms"].items())
            print(f"  {name:32s} {r['tuples/s'] / 1e6:6.2f} M tuples/s   latency {lat}")
        print(f"  ratio workers=2 / workers=0: {two['tuples/s'] / one['tuples/s']:.2f}")
    rate, small = 200_000, 1_000
    print(f"engine, stateless query at {rate:,} tuples/s in {small:,}-tuple sends (latency below saturation):")
    for workers in (0, 2):
        r = engine_run("stateless", workers, rate * 3, small, rate=rate)
        lat = "  ".join(f"{k} {v:g} ms" for k, v in r["latency_ms"].items())
        print(f"  workers={workers}  {r['tuples/s'] / 1e6:6.2f} M tuples/s   latency {lat}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
