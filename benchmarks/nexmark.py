"""NEXMark Q5, Q7 and Q8: sparkcep on instance managers beside Spark Structured Streaming
(local[2]) on the same events, in the same run.

    python benchmarks/nexmark.py [--queries q5 q7 q8] [--events 2000000] [--rate R] [--workers 2] [--no-spark]

Without ``--rate`` both engines get the events as fast as they take them
(sparkcep: back-to-back ``send`` per stream; Spark: Parquet files written
beforehand), event times following the generator at 100,000 events/s, and
NEXMark's windows (Q5 10 s sliding by 2 s, Q7 and Q8 10 s); with ``--rate``
both are fed open loop at that rate and the windows are 100 times shorter.
Each engine first runs each query untimed on 80,000 events of another seed.
Prints events/s for both and the ratio, and both engines' latency per result
row and per window close, with how many samples each summarises.
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
from sparkcep.bench import cli, nexmark_queries


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--queries", nargs="+", choices=nexmark_queries.QUERIES, default=list(nexmark_queries.QUERIES))
    p.add_argument("--events", type=bounded(int, 1), default=2_000_000)
    p.add_argument("--rate", type=bounded(float, 0), default=None, help="events/s, open loop (default: as fast as possible)")
    p.add_argument("--workers", type=bounded(int, 0), default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-spark", action="store_true", help="sparkcep only")
    a = p.parse_args(argv)
    if a.workers and cli.workers_refused(a.workers):
        return 2
    args = SimpleNamespace(workers=a.workers, instances=max(1, a.workers), ips=0, seed=a.seed)
    if not a.no_spark and (why := cli.room_refused(a.queries, a.events, args)):
        p.error(f"argument --events: {why}")
    console = Console(stderr=True)
    latency = bool(a.rate)
    ours = {q: cli.run_sparkcep(q, a.rate, a.events, args, console, latency) for q in a.queries}
    theirs = {}
    if not a.no_spark:
        from sparkcep.bench import spark as sb
        console.print("starting Spark (local[2]) ...")
        session = sb.session()
        session.sparkContext.setLogLevel("ERROR")
        try:
            cli.warm_spark(session, [(q, latency) for q in a.queries], args)
            theirs = {q: cli.run_spark(session, q, a.rate, a.events, args, console, latency) for q in a.queries}
        finally:
            session.stop()
    offered = "as fast as possible" if not a.rate else f"offered {a.rate:,.0f} events/s"
    print(f"NEXMark, {a.events:,} events, {offered}, sparkcep workers={a.workers}")
    for q in a.queries:
        line = f"  {q}: sparkcep {ours[q]['throughput']:>12,.0f} events/s"
        if q in theirs:
            line += (f", Spark {theirs[q]['throughput']:>12,.0f} events/s, "
                     f"ratio {ours[q]['throughput'] / theirs[q]['throughput']:.2f}x")
        print(line)
        for name, r in (("sparkcep", ours[q]), ("Spark", theirs.get(q))):
            if r is not None and r["latency_samples"]:
                lat, cl = r["latency_ms"], r["close_latency_ms"]
                print(f"      {name} latency per row ({r['latency_samples']:,}) p50 {lat['p50']:.2f} ms, "
                      f"p99 {lat['p99']:.2f} ms; per close ({r['closes']:,}) p50 {cl['p50']:.2f} ms, "
                      f"p99 {cl['p99']:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
