"""What exchanging rows costs: each instance manager's CPU per record, and the engine's CPU per send.

    python benchmarks/exchange.py [--records 20000000] [--repeat 3] [--sends 100,10000,65536]

HiBench fixwindow (count and min time per IP over 10 s tumbling windows,
100K IPs, 200-byte records, event time at 1M records/s), every sub-query on
as many instances as there are instance managers. The records are made
before the clock starts and sent back to back.

1. **Instance managers**: ``--records`` in 64K-row sends at workers=1 and
   workers=2, in turn, ``--repeat`` times each. Per instance manager: its CPU
   seconds over the run (user + system, from /proc) per record it took in.
   At workers=2 every record is hashed by its IP and half of them cross to
   the other instance manager; at workers=1 none does: the ratio is what the
   exchange costs. Target: workers=2 within 15% of workers=1.
2. **Engine**: workers=2, sends of 100, 10K and 64K rows: the engine
   process's CPU (every thread: stamping and routing sends, writing rings,
   collecting results) per record and per send, from the first send until
   the outputs reflect the last. Targets: <= 0.03 us per record at 10K-row
   sends, <= 100 us per send at 100-row sends.

Prints medians over ``--repeat`` runs with every run's figure and the load
average; the peer of each figure is the other configuration of the same
run (workers=1, another send size) and the issue's target.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa

try:
    import sparkcep as cep
except ModuleNotFoundError:  # run from a source checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import sparkcep as cep

from sparkcep.arguments import bounded, bounded_list
from sparkcep.bench import suite, workloads
from sparkcep.bench.generator import RECORD_SCHEMA, UserVisits

T0_US = 1_704_067_200_000_000
EVENT_RATE = 1_000_000  # event time advances 1 s per 1M records
IM_TARGET = 1.15  # workers=2 CPU per record within 15% of workers=1
ENGINE_RECORD_TARGET_US = 0.03  # at 10K-row sends
ENGINE_SEND_TARGET_US = 100.0
MAX_RECORDS = 40_000_000  # records are made up front: about 200 bytes each


def make_batches(gen: UserVisits, records: int, rows: int, start: int = 0) -> list[pa.RecordBatch]:
    """``records`` records from ``start`` in batches of ``rows``, event time at EVENT_RATE."""
    out = []
    for s in range(start, start + records, rows):
        n = min(rows, start + records - s)
        keys = T0_US + np.arange(s, s + n, dtype=np.int64) * (1_000_000 // EVENT_RATE)
        out.append(pa.RecordBatch.from_arrays([pa.array(keys, pa.timestamp("us")), gen.values(s, n)],
                                              schema=RECORD_SCHEMA))
    return out


def deployed(workers: int) -> tuple[cep.Engine, object]:
    """An engine with ``workers`` instance managers, and fixwindow deployed on it, warmed up."""
    engine = cep.Engine.local(workers=workers)
    try:
        q = workloads.query("fixwindow")
        suite.warm_up(engine, q, suite.warm_up_source("fixwindow", 100_000), workers)
        dep = engine.deploy(q, parallelism=workers, retain=False)
        engine.subscribe("fixwindow", lambda batch: None)
    except BaseException:
        engine.close()
        raise
    return engine, dep


def send_all(engine: cep.Engine, dep, batches: list[pa.RecordBatch]) -> None:
    for b in batches:
        engine.send(workloads.STREAM, b)
    dep.wait()  # returns once the outputs reflect every send


def im_cpu(engine: cep.Engine) -> dict[str, float]:
    """CPU seconds so far of each instance manager, by name."""
    out = {}
    for im in engine.instance_managers():
        t = psutil.Process(im["pid"]).cpu_times()
        out[im["name"]] = t.user + t.system
    return out


def im_run(workers: int, batches: list[pa.RecordBatch]) -> dict[str, float]:
    """us of CPU per record taken in, per instance manager, over one run (round-robin gives each
    instance manager's first sub-query an equal share of the records)."""
    n = sum(b.num_rows for b in batches)
    engine, dep = deployed(workers)
    with engine:
        cpu0 = im_cpu(engine)
        send_all(engine, dep, batches)
        cpu1 = im_cpu(engine)
    return {name: (cpu1[name] - cpu0[name]) * 1e6 / (n / workers) for name in cpu1}


def engine_run(engine: cep.Engine, dep, batches: list[pa.RecordBatch]) -> tuple[float, float, float]:
    """(us of engine CPU per record, per send, wall seconds) of sending ``batches``."""
    n = sum(b.num_rows for b in batches)
    me = psutil.Process()
    t0, w0 = me.cpu_times(), time.perf_counter()
    send_all(engine, dep, batches)
    t1, w1 = me.cpu_times(), time.perf_counter()
    cpu = (t1.user + t1.system) - (t0.user + t0.system)
    return cpu * 1e6 / n, cpu * 1e6 / len(batches), w1 - w0


def fmt_runs(xs: list[float], digits: int = 3) -> str:
    return ", ".join(f"{x:.{digits}f}" for x in xs)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--records", type=bounded(int, 1_000_000, MAX_RECORDS), default=20_000_000,
                   help="records per instance-manager run, and at most per engine run")
    p.add_argument("--repeat", type=bounded(int, 1, 100), default=3)
    p.add_argument("--sends", type=bounded_list(int, 1, 1 << 20), default=[100, 10_000, 65_536],
                   help="rows per send of the engine runs, comma-separated (default 100,10000,65536)")
    p.add_argument("--seconds", type=bounded(float, 0.1, 60), default=2.0, help="about how long each engine run sends")
    p.add_argument("--skip", choices=["im", "engine"], default=None, help="leave one part out")
    a = p.parse_args(argv)
    gen = UserVisits(seed=0, distinct_ips=100_000)
    print(f"load average at start: {os.getloadavg()[0]:.2f}")

    if a.skip != "im":
        batches = make_batches(gen, a.records, 65_536)
        per: dict[int, list[float]] = {1: [], 2: []}
        each: dict[int, list[str]] = {1: [], 2: []}
        for _ in range(a.repeat):
            for workers in (1, 2):
                r = im_run(workers, batches)
                per[workers].append(statistics.mean(r.values()))
                each[workers].append(" ".join(f"{k} {v:.3f}" for k, v in sorted(r.items())))
                print(f"  workers={workers}: us of CPU per record taken in: {each[workers][-1]}", flush=True)
        one, two = statistics.median(per[1]), statistics.median(per[2])
        verdict = "met" if two <= one * IM_TARGET else "NOT met"
        print(f"\n1. instance managers, fixwindow, {a.records:,} records in 64K-row sends, "
              f"median of {a.repeat} runs each (load {os.getloadavg()[0]:.2f})")
        print(f"   workers=1: {one:.3f} us of CPU per record ({fmt_runs(per[1])})")
        print(f"   workers=2: {two:.3f} us of CPU per record, mean of the two ({fmt_runs(per[2])})")
        print(f"   workers=2 / workers=1: {two / one:.2f}x; target <= {IM_TARGET:.2f}x: {verdict}")
        del batches

    if a.skip != "engine":
        results = {}
        engine, dep = deployed(2)
        with engine:
            start = 0
            for rows in a.sends:
                # about --seconds of sending at the rate the first run of this size reaches
                probe = make_batches(gen, min(rows * 200, 2_000_000), rows, start)
                start += sum(b.num_rows for b in probe)
                _, _, wall = engine_run(engine, dep, probe)
                count = min(max(200, int(a.seconds * len(probe) / max(wall, 1e-3))), max(1, a.records // rows))
                runs = []
                for _ in range(a.repeat):
                    batches = make_batches(gen, count * rows, rows, start)
                    start += count * rows
                    runs.append((*engine_run(engine, dep, batches), count))
                results[rows] = runs
        print(f"\n2. engine (workers=2), fixwindow, median of {a.repeat} runs per send size "
              f"(load {os.getloadavg()[0]:.2f})")
        print(f"   {'rows/send':>9s} {'sends':>7s} {'us CPU/record':>14s} {'us CPU/send':>12s} {'records/s':>12s}"
              f"   runs (us/record)")
        for rows, runs in results.items():
            rec = statistics.median(r[0] for r in runs)
            snd = statistics.median(r[1] for r in runs)
            rate = statistics.median(r[3] * rows / r[2] for r in runs)
            print(f"   {rows:>9,} {runs[0][3]:>7,} {rec:>14.4f} {snd:>12.1f} {rate:>12,.0f}   "
                  f"{fmt_runs([r[0] for r in runs], 4)}")
        if 10_000 in results:
            rec = statistics.median(r[0] for r in results[10_000])
            verdict = "met" if rec <= ENGINE_RECORD_TARGET_US else "NOT met"
            print(f"   target: <= {ENGINE_RECORD_TARGET_US} us of CPU per record at 10K-row sends: {verdict} "
                  f"({rec:.4f})")
        smallest = min(results)
        snd = statistics.median(r[1] for r in results[smallest])
        verdict = "met" if snd <= ENGINE_SEND_TARGET_US else "NOT met"
        print(f"   target: <= {ENGINE_SEND_TARGET_US:.0f} us of CPU per send at {smallest:,}-row sends: {verdict} "
              f"({snd:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
