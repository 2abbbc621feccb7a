"""Fixwindow by Spark alone beside Spark -> format("upmcep") -> engine -> format("upmcep") -> Spark.

    python benchmarks/spark_pipeline.py                  # 2M events, 10 min of event time, 10 files, 3 runs each
    python benchmarks/spark_pipeline.py --events 400000 --runs 1

Both paths read the same Parquet files in one local[2] Spark session, each
warmed by two untimed runs over them; the measured runs alternate native and
routed. The routed path's reading query is its standing consumer: it is
started before the clock, and the time it took is printed beside the run.
The routed results must be complete: the engine's windows equal a batch
Spark computation of fixwindow over the same files (rows, sum of counts, sum
of first keys), and the Spark reader read every one of them; the native run
must emit as many windows. What is timed and how:
:mod:`sparkcep.bench.pipeline`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

try:
    from sparkcep.arguments import bounded
except ModuleNotFoundError:  # a source checkout without install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from sparkcep.arguments import bounded

MAX_EVENTS = 20_000_000  # HiBench records of 200 bytes, made up front a file at a time, then read by Spark
MAX_FILES = 1000
MAX_SPAN_S = 10 ** 8  # about 3 years of event time
MAX_RUNS = 100


def main(argv=None) -> int:
    from sparkcep.runtime.capacity import MAX_WORKERS_PER_CPU
    from sparkcep.runtime.topology import Topology

    workers = MAX_WORKERS_PER_CPU * len(Topology.load().cpus)  # the most the engine starts on this machine
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=bounded(int, 1, MAX_EVENTS), default=2_000_000)
    ap.add_argument("--files", type=bounded(int, 1, MAX_FILES), default=10)
    ap.add_argument("--span", type=bounded(float, 0.001, MAX_SPAN_S), default=600.0,
                    help="seconds of event time the events cover")
    ap.add_argument("--runs", type=bounded(int, 1, MAX_RUNS), default=3, help="measured runs of each path")
    ap.add_argument("--warm-ups", type=bounded(int, 0, MAX_RUNS), default=2, help="untimed runs of each path first")
    ap.add_argument("--workers", type=bounded(int, 0, workers), default=0,
                    help=f"instance managers of the engine (0: in-process; at most {workers} on this machine)")
    a = ap.parse_args(argv)

    os.environ.setdefault("SPARKCEP_HOME", tempfile.mkdtemp(prefix="sparkcep-bench-"))
    # Spark's Python workers must be this Python, the one with sparkcep and its data source `upmcep`:
    # the `python3` on the PATH may be another (DATA_SOURCE_NOT_FOUND: upmcep)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from sparkcep.bench import pipeline
    from sparkcep.bench.spark import session

    work = Path(tempfile.mkdtemp(prefix="sparkcep-pipeline-"))
    data = pipeline.write_input(work / "input", a.events, a.files, a.span)
    spark = session("sparkcep-pipeline")
    spark.sparkContext.setLogLevel("ERROR")
    print(f"{a.events:,} events over {a.span:.0f} s of event time in {a.files} Parquet files; "
          f"local[2], engine workers={a.workers}; {a.warm_ups} untimed runs of each path first", flush=True)

    def show(k, run, complete):
        stages = "".join(f", {s} {v:.2f} s" for s, v in run.stages.items())
        cpu = ", ".join(f"{g} {v:.1f}" for g, v in run.cpu.items())
        reader = f", reader started in {run.reader_start:.2f} s before the clock" if run.path == "routed" else ""
        print(f"run {k + 1} {run.path:6s} {run.seconds:6.2f} s {run.rate:>10,.0f} events/s, "
              f"{run.totals.rows:,} windows  CPU s: {cpu}, total {sum(run.cpu.values()):.1f}{stages}{reader}"
              f"{'' if complete else '  INCOMPLETE'}", flush=True)

    results = pipeline.compare(spark, data, work, a.runs, a.workers, show, a.warm_ups)
    spark.stop()
    if not all(c for rs in results.values() for _, c in rs):
        print("INCOMPLETE results: see the runs marked above")
        return 1
    runs = {p: [r for r, _ in rs] for p, rs in results.items()}
    native = statistics.median(r.rate for r in runs["native"])
    routed = statistics.median(r.rate for r in runs["routed"])
    cpu = {p: statistics.median(sum(r.cpu.values()) for r in rs) for p, rs in runs.items()}
    print(f"median of {a.runs}: Spark native {native:,.0f} events/s, routed through the engine "
          f"{routed:,.0f} events/s: {routed / native:.2f}x (results complete); CPU seconds "
          f"{cpu['native']:.1f} native, {cpu['routed']:.1f} routed: {cpu['native'] / cpu['routed']:.2f}x less")
    return 0


if __name__ == "__main__":
    sys.exit(main())
