"""HiBench fixwindow on sparkcep: count and first (minimum) time per IP over 10 s
tumbling windows, on generated HiBench ``uservisits`` records.

    python examples/fixwindow.py                       # 3M records at 300K/s, in this process
    python examples/fixwindow.py --rate 0              # as fast as possible
    python examples/fixwindow.py --workers 2           # two instance managers
    python examples/fixwindow.py --window 100ms        # shorter windows: more closes to measure

A record's key is the time it is sent (as in HiBench), so windows are wall-
clock aligned: a window closes when the first record of the next one arrives,
and the rest close at the end of input. Prints throughput every second, then
a summary and a few result rows.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

try:
    import sparkcep as cep
except ModuleNotFoundError:  # run from a source checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import sparkcep as cep

import pyarrow.compute as pc

from sparkcep.arguments import bounded
from sparkcep.bench import suite, workloads
from sparkcep.bench.cli import MAX_EVENTS, rate
from sparkcep.bench.driver import drive
from sparkcep.bench.generator import MAX_IPS, UserVisits
from sparkcep.bench.metrics import latencies, summarize
from sparkcep.query.windows import duration_us


def window(text: str) -> int:
    """``--window`` in microseconds: a duration the engine reads (``10s``, ``100ms``), above zero."""
    try:
        us = duration_us(text, "window")
    except cep.QueryError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if us <= 0:
        raise argparse.ArgumentTypeError(f"must be above zero, got {text}")
    return us


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="HiBench fixwindow on sparkcep")
    p.add_argument("--workers", type=bounded(int, 0), default=0, help="instance manager processes (0: run in this process)")
    p.add_argument("--events", type=bounded(int, 1, MAX_EVENTS), default=3_000_000, help="records to send")
    p.add_argument("--rate", type=rate, default=300_000, help="records/s (0: as fast as possible)")
    p.add_argument("--ips", type=bounded(int, 1, MAX_IPS), default=100_000, help="distinct source IPs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--window", type=window, default="10s", help="window length (HiBench: 10s)")
    a = p.parse_args(argv)

    try:
        engine = cep.Engine.local(workers=a.workers)
    except cep.SparkcepError as e:
        print(f"error: {e} [{e.code}]", file=sys.stderr)
        return 2
    with engine:
        query = workloads.query("fixwindow", window_us=a.window)
        suite.warm_up(engine, query, suite.warm_up_source("fixwindow", a.ips), a.workers)  # untimed
        engine.deploy(query, parallelism=workloads.parallelism("fixwindow", a.workers))
        gen = UserVisits(seed=a.seed, distinct_ips=a.ips)
        print(f"fixwindow: {a.events:,} records of {gen.record_bytes} bytes, {a.ips:,} IPs, "
              f"{a.window / 1e6:g} s windows, rate {'max' if not a.rate else f'{a.rate:,.0f}/s'}, workers={a.workers}")
        state = {"t": 0, "sent": 0, "rows": 0}

        def tick(run, sent):
            now = time.time_ns()
            state["t"] = max(state["t"], run.t_start)
            rows = run.out_rows
            dt = max(now - state["t"], 1) / 1e9
            print(f"  {(now - run.t_start) / 1e9:6.1f} s  sent {sent:>11,}  "
                  f"{(sent - state['sent']) / dt:>11,.0f} records/s  "
                  f"windows out {rows:>9,} (+{rows - state['rows']:,})", flush=True)
            state.update(t=now, sent=sent, rows=rows)

        run = drive(engine, workloads.Records(gen), "fixwindow", a.events, rate=a.rate or None, tick=tick)
        res = summarize(run, latencies("fixwindow", run))
        out = engine.collect("fixwindow")

    print(f"\nsent {run.events:,} records in {(run.t_end - run.t_start) / 1e9:.2f} s; "
          f"throughput {res['throughput']:,.0f} records/s (first send to last result)")
    print(f"{out.num_rows:,} results (window, ip) in {len(pc.unique(out.column('window_start')))} windows; "
          f"counts sum to {pc.sum(out.column('count')).as_py():,}")
    for what, key, n in (("per result row", "latency_ms", res["latency_samples"]),
                         ("per window close", "close_latency_ms", res["closes"])):
        print(f"latency, window closed -> result out (ms), {what} ({n:,}): "
              + "  ".join(f"{k} {v:.2f}" for k, v in res[key].items()))
    top = out.sort_by([("count", "descending"), ("ip", "ascending")]).slice(0, 5)
    print("\nbusiest IPs of any window:")
    print(top.select(["window_start", "window_end", "ip", "count", "first"]).to_pandas().to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
