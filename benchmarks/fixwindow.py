"""HiBench fixwindow end to end: sparkcep on 2 instance managers beside Spark Structured
Streaming (local[2]) on the same records, in the same run.

    python benchmarks/fixwindow.py [--events 2000000] [--rate R] [--workers 2] [--no-spark]

Count and minimum time per IP over tumbling windows, 100K IPs, 200-byte
HiBench records. Without ``--rate`` both engines get the records as fast as
they take them (sparkcep: back-to-back ``send``; Spark: Parquet files written
beforehand) and the windows are HiBench's 10 s; with ``--rate`` both are fed
open loop at that rate and the windows are 100 ms, so a run closes hundreds
of them. Each engine first runs the query untimed on 80,000 records of
another seed. Prints records/s for both, the ratio, and both engines'
latency (window closed -> result out) per result row and per window close,
with how many samples each summarises.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

try:
    import sparkcep  # noqa: F401
except ModuleNotFoundError:  # run from a source checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console

from sparkcep.arguments import bounded
from sparkcep.bench import cli
from sparkcep.bench.generator import MAX_IPS


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--events", type=bounded(int, 1), default=2_000_000)
    p.add_argument("--rate", type=bounded(float, 0), default=None, help="records/s, open loop (default: as fast as possible)")
    p.add_argument("--workers", type=bounded(int, 0), default=2)
    p.add_argument("--ips", type=bounded(int, 1, MAX_IPS), default=100_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-spark", action="store_true", help="sparkcep only")
    a = p.parse_args(argv)
    if a.workers and cli.workers_refused(a.workers):
        return 2

    workers = a.workers
    args = SimpleNamespace(workers=workers, instances=max(1, workers), ips=a.ips, seed=a.seed)
    if not a.no_spark and (why := cli.room_refused(["fixwindow"], a.events, args)):
        p.error(f"argument --events: {why}")
    console = Console(stderr=True)
    latency = bool(a.rate)
    ours = cli.run_sparkcep("fixwindow", a.rate, a.events, args, console, latency)
    theirs = None
    if not a.no_spark:
        from sparkcep.bench import spark as sb
        console.print("starting Spark (local[2]) ...")
        session = sb.session()
        session.sparkContext.setLogLevel("ERROR")
        try:
            cli.warm_spark(session, [("fixwindow", latency)], args)
            theirs = cli.run_spark(session, "fixwindow", a.rate, a.events, args, console, latency)
        finally:
            session.stop()

    offered = "as fast as possible" if not a.rate else f"offered {a.rate:,.0f} records/s"
    print(f"fixwindow, {a.events:,} records, {a.ips:,} IPs, {offered}")
    print(f"  sparkcep (workers={workers}):  {ours['throughput']:>12,.0f} records/s")
    if theirs is not None:
        print(f"  Spark (local[2]):       {theirs['throughput']:>12,.0f} records/s")
        print(f"  ratio sparkcep / Spark: {ours['throughput'] / theirs['throughput']:>12.2f}x")
    for name, r in (("sparkcep", ours), ("Spark", theirs)):
        if r is not None and r["latency_samples"]:
            lat, cl = r["latency_ms"], r["close_latency_ms"]
            print(f"  {name} latency, window closed -> result out: per row ({r['latency_samples']:,}) "
                  f"p50 {lat['p50']:.2f} ms, p99 {lat['p99']:.2f} ms; per close ({r['closes']:,}) "
                  f"p50 {cl['p50']:.2f} ms, p99 {cl['p99']:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
