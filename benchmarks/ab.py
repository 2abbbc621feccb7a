"""A/B of two checkouts of sparkcep on one workload, in one session, run after run in turn.

    python benchmarks/ab.py OLD_CHECKOUT NEW_CHECKOUT [--runs 6] [--events 4000000] [--rate 1000000]

For a change to the runtime (e.g. ``git worktree add /tmp/old <commit>``): each
run starts a fresh process on one checkout (``PYTHONPATH`` pointing at it),
alternating A, B, A, B ..., so both meet the same noise. The workload uses
only API both sides have: HiBench-shaped records (an IP among 100K, an event
time, a 180-byte value) into a keyed tumbling window (count and first time
per IP), ``Engine.local(workers=2)``, every sub-query on 2 instances.
Without ``--rate`` records go in as fast as the engine takes them (1 s
windows) and a run reports records/s; with ``--rate`` they go in open loop
(10K-record batches, 100 ms windows) and a run reports latency (window
closed, i.e. the first record past its end due -> result out) per result
row and per window close, with how many closes. Prints each
run, then per side the median and the spread, and the median of the
pairwise ratios B/A.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

try:
    from sparkcep.arguments import bounded
except ImportError as e:
    if e.name == "sparkcep":  # a source checkout without install
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from sparkcep.arguments import bounded
    else:  # --inner on a checkout under test older than it (first on PYTHONPATH): the outer process, on this
        def bounded(kind, minimum, maximum=None):  # script's checkout, checked the numbers it passes on
            return kind

MAX_RUNS = 100
MAX_EVENTS = 6_000_000  # made up front: 1.1 GB a million at the peak (numpy's 180-character values)
TIMEOUT_S = 900  # a run's process
MAX_INPUT_S = 600  # of open-loop input (--events / --rate), within a run's TIMEOUT_S


def records(n: int, seed: int, start_us: int, step_us: float):
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    pool = np.array([f"{a}.{b}.{c}.{d}" for a, b, c, d in rng.integers(1, 255, (100_000, 4))])
    ip = pool[rng.integers(0, len(pool), n)]
    ts = start_us + (np.arange(n) * step_us).astype(np.int64)
    value = np.full(n, "x" * 180)
    return pa.table({"ip": ip, "ts": pa.array(ts, pa.timestamp("us")), "value": value})


def inner(events: int, rate: float | None) -> dict:
    """One run in this process: the figures as a dict."""
    import pandas as pd
    import pyarrow as pa

    import sparkcep as cep

    window = "100ms" if rate else "1s"
    q = cep.Query("ab")
    s = q.stream("visits", "ip string, ts timestamp, value string")
    q.output("out", s.aggregate(cep.TimeWindow(window), by=["ip"], n=cep.count(), first=cep.min("ts")))
    batch = 10_000 if rate else 65_536
    step = 1e6 / (rate or 1e6)  # event time advances with the offered rate (1M records per second otherwise)
    start_us = 1_700_000_000_000_000
    data = records(events, 1, start_us, step)
    arrivals = []  # (when a result batch came out, its window ends)
    with cep.Engine.local(workers=2) as engine:
        warm = records(80_000, 2, 1_600_000_000_000_000, step)
        q_warm = cep.Query("warm")
        w = q_warm.stream("w", "ip string, ts timestamp, value string")
        q_warm.output("w_out", w.aggregate(cep.TimeWindow(window), by=["ip"], n=cep.count(), first=cep.min("ts")))
        engine.deploy(q_warm, parallelism=2)
        engine.send("w", warm)
        engine.end("w")
        engine.collect("w_out")
        engine.undeploy("warm")
        engine.deploy(q, parallelism=2, retain=False)
        engine.subscribe("out", lambda b: arrivals.append((time.perf_counter(), b.column("window_end"))))
        t0 = time.perf_counter()
        for i in range(0, events, batch):
            if rate:
                due = t0 + i / rate
                while time.perf_counter() < due:
                    time.sleep(max(0.0, min(0.001, due - time.perf_counter())))
            engine.send("visits", data.slice(i, batch))
        engine.end("visits")
        engine.deployments["ab"].wait(600)  # the outputs reflect every send
        elapsed = time.perf_counter() - t0
    rows = sum(len(ends) for _, ends in arrivals)
    figures = {"throughput": events / elapsed, "rows": rows}
    if rate:  # a window closes when the first record past its end is due: t0 + (end - start) in event time
        ends = [e.cast(pa.int64()).to_numpy() for _, e in arrivals]
        per_row = np.concatenate([(out - t0 - (e - start_us) / 1e6) * 1e3 for (out, _), e in zip(arrivals, ends)])
        per_close = pd.Series(per_row).groupby(np.concatenate(ends)).max().to_numpy()
        figures.update(row_p50=np.percentile(per_row, 50), row_p99=np.percentile(per_row, 99),
                       close_p50=np.percentile(per_close, 50), close_p99=np.percentile(per_close, 99),
                       closes=len(per_close))
    return figures


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--runs", type=bounded(int, 1, MAX_RUNS), default=6, help="runs of each side")
    p.add_argument("--events", type=bounded(int, 1, MAX_EVENTS), default=4_000_000)
    p.add_argument("--rate", type=bounded(float, 1), default=None,
                   help=f"records/s, open loop (--events / --rate: at most {MAX_INPUT_S} s)")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.rate and a.events / a.rate > MAX_INPUT_S:
        p.error(f"--events / --rate must be at most {MAX_INPUT_S} s of input (a run's process has {TIMEOUT_S} s), "
                f"got {a.events / a.rate:,.0f} s")
    if a.inner:
        print(json.dumps(inner(a.events, a.rate)))
        return 0
    key = "close_p99" if a.rate else "throughput"
    got: dict[str, list[dict]] = {"A": [], "B": []}
    for run in range(a.runs):
        for side, path in (("A", a.old), ("B", a.new)):
            env = dict(os.environ, PYTHONPATH=os.path.abspath(path))
            cmd = [sys.executable, os.path.abspath(__file__), path, path, "--inner", "--events", str(a.events)]
            if a.rate:
                cmd += ["--rate", str(a.rate)]
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=path, timeout=TIMEOUT_S)
            if out.returncode:
                print(out.stderr[-2000:], file=sys.stderr)
                return 1
            r = json.loads(out.stdout.strip().splitlines()[-1])
            got[side].append(r)
            print(f"run {run + 1} {side}: " + ", ".join(f"{k} {v:,.2f}" for k, v in r.items() if v is not None),
                  flush=True)
    for side, path in (("A", a.old), ("B", a.new)):
        xs = [r[key] for r in got[side]]
        print(f"{side} {path}: {key} median {statistics.median(xs):,.2f} (min {min(xs):,.2f}, max {max(xs):,.2f}, "
              f"{len(xs)} runs)")
    ratios = [b[key] / a_[key] for a_, b in zip(got["A"], got["B"])]
    print(f"B/A {key}, pair by pair: median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, "
          f"max {max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
