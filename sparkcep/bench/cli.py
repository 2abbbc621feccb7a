"""``sparkcep bench``: run HiBench and NEXMark workloads on sparkcep, optionally beside Spark.

    sparkcep bench fixwindow --rate 100000 --events 2000000
    sparkcep bench q7 --compare spark --out bench-out
    sparkcep bench all --compare spark --workers 2 --report docs/benchmarks.md

Workloads: HiBench's identity, repartition, wordcount (the running count),
wordcount_tuples (UPM-CEP's tuple-window wordcount, no Spark peer) and
fixwindow; NEXMark's q5, q7 and q8 (:mod:`sparkcep.bench.suite`); ``all``,
``hibench`` or ``nexmark`` for a suite. Input is open loop: ``--rate``
events/s on a fixed schedule (latency then includes any falling behind), or
as fast as possible without ``--rate``. Prints throughput and latency
percentiles per result row (p50, p75, p95, p99, p99.9, max — HiBench's
figures) and per window close; ``--out DIR`` writes ``results.csv``,
``results.json`` (with per-second series) and a PNG per workload. How
latency is measured: :mod:`sparkcep.bench.metrics` and
:mod:`sparkcep.bench.spark`. ``--report FILE`` runs every workload as fast as
possible ``--repeat`` times (throughput: the median) and once at
``--latency-rate`` with short windows (latency), then writes the markdown of
``docs/benchmarks.md`` (:mod:`sparkcep.bench.report`).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import signal
import sys
import time
from pathlib import Path

from sparkcep.arguments import bounded
from sparkcep.bench import suite
from sparkcep.bench.generator import MAX_IPS
from sparkcep.errors import SparkcepError
from sparkcep.runtime import capacity
from sparkcep.runtime.topology import Topology

GROUPS = {"all": suite.ALL, "hibench": suite.HIBENCH, "nexmark": suite.NEXMARK}
# a run keeps what latency is computed from: per event, the output columns kept (HiBench identity and
# wordcount: a row per event), then the samples; NEXMark renders every event up front. At the peak that
# is 50-140 bytes an event (q5 the most), so a run of the most stays within about 3 GB
MAX_EVENTS = 20_000_000


def rate(text: str) -> float:
    """``--rate``: 0 (as fast as possible) or 1 event/s or more: a lower one sends no event in a run of
    the default length, and --events over as long as it likes."""
    value = bounded(float, 0)(text)
    if 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be 0 (as fast as possible) or 1 or more, got {text}")
    return value


def rate_events(rate: float) -> int:
    """The events of a run at ``rate`` without --events: LATENCY_SECONDS worth, up to MAX_EVENTS."""
    return min(int(rate * suite.LATENCY_SECONDS), MAX_EVENTS)


def add_arguments(parser) -> None:
    parser.add_argument("workload", choices=list(suite.ALL) + list(GROUPS))
    parser.add_argument("--rate", type=rate, default=None,
                        help="events/s, open loop (default, or 0: as fast as possible)")
    parser.add_argument("--events", type=bounded(int, 1, MAX_EVENTS), default=None,
                        help=f"events to send (default {suite.DEFAULT_EVENTS:,}; "
                             f"with --rate, {suite.LATENCY_SECONDS} s worth up to {MAX_EVENTS:,})")
    parser.add_argument("--workers", type=bounded(int, 0), default=0,
                        help="instance manager processes (0: in this process)")
    parser.add_argument("--instances", type=bounded(int, 1), default=2,
                        help="instances of repartition's map (HiBench: cores)")
    parser.add_argument("--ips", type=bounded(int, 1, MAX_IPS), default=100_000, help="HiBench: distinct source IPs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compare", choices=["spark"], default=None, help="also run Spark Structured Streaming")
    parser.add_argument("--out", type=Path, default=None, help="directory for results.csv/json and PNG plots")
    parser.add_argument("--report", type=Path, default=None, help="write the markdown benchmark report to this file")
    parser.add_argument("--latency-rate", type=bounded(float, 1), default=suite.LATENCY_RATE,
                        help=f"with --report: the offered rate of the latency runs (default {suite.LATENCY_RATE:,})")
    parser.add_argument("--repeat", type=bounded(int, 1), default=3,
                        help="with --report: throughput runs per workload and engine (the median is reported)")


def plans(args) -> list[tuple[str, float | None, int, bool]]:
    """(workload, rate, events, latency run?) of every run, in order."""
    names = GROUPS.get(args.workload, (args.workload,))
    out = []
    for w in names:
        if args.report is not None:
            out += [(w, None, args.events or suite.DEFAULT_EVENTS, False)] * args.repeat
            out.append((w, args.latency_rate, rate_events(args.latency_rate), True))
        else:
            events = args.events or (rate_events(args.rate) if args.rate else suite.DEFAULT_EVENTS)
            out.append((w, args.rate, events, bool(args.rate)))
    return out


def workers_refused(workers: int) -> bool:
    """Whether this machine cannot run ``workers`` instance managers (said on stderr, as the engine would
    refuse them), found before anything starts."""
    try:
        capacity.check_workers(workers, len(Topology.load().cpus))
    except SparkcepError as e:
        print(f"error: {e} [{e.code}]", file=sys.stderr)
        return True
    return False


def room_refused(workloads: list[str], events: int, args) -> str | None:
    """Why Spark's input of ``events`` events for one of ``workloads`` would not fit on the disk, or None
    (each run's input is removed before the next one's is written)."""
    from sparkcep.bench import spark as sb
    for w in workloads:
        if suite.has_spark_peer(w) and (why := sb.room_refused(suite.source(w, args.seed, args.ips), events)):
            return why
    return None


def run(args) -> int:
    """Body of ``sparkcep bench``. An engine's error ends it in one line (exit 1), Ctrl-C quietly (130);
    SIGTERM stops it as Ctrl-C does, the instance managers it started with it (exit 143)."""
    if args.workers and workers_refused(args.workers):
        return 2
    signal.signal(signal.SIGTERM, _terminated)
    try:
        return run_all(args)
    except KeyboardInterrupt:
        return 130
    except SparkcepError as e:
        print(f"sparkcep bench: {e} [{e.code}]", file=sys.stderr)
        return 1


def _terminated(signum, frame):
    raise SystemExit(128 + signum)  # unwinds like Ctrl-C: each engine stops its instance managers on the way


def run_all(args) -> int:
    """Run every workload ``args`` asks for, print and write the results."""
    from rich.console import Console
    console = Console(stderr=True)
    todo = plans(args)
    results = []
    for w, rate, events, latency in todo:  # ours first, then Spark's: no idle JVM beside our runs, no engine beside its
        results.append(run_sparkcep(w, rate, events, args, console, latency))
        _print_result(console, results[-1])
    pipeline = None
    if args.compare == "spark":
        console.print("starting Spark (local[2]) ...")
        from sparkcep.bench import spark as sb
        spark = sb.session()
        spark.sparkContext.setLogLevel("ERROR")
        try:
            warm_spark(spark, [(w, latency) for w, _, _, latency in todo], args)
            for w, rate, events, latency in todo:
                if suite.has_spark_peer(w):
                    results.append(run_spark(spark, w, rate, events, args, console, latency))
                    _print_result(console, results[-1])
            if args.report is not None:
                from sparkcep.bench import report
                pipeline = report.pipeline_runs(spark, args, console)
        finally:
            spark.stop()
    _print_table(results)
    if args.out is not None:
        write_outputs(args.out, results)
    if args.report is not None:
        from sparkcep.bench import report
        report.write(args.report, results, args, pipeline)
        print(f"wrote {args.report}")
    return 0


def _progress(console, label: str):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    return Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                    TimeElapsedColumn(), console=console, transient=True)


def run_sparkcep(workload: str, rate, events: int, args, console, latency: bool = False) -> dict:
    """One run of ``workload`` on a fresh sparkcep engine (warmed first); its summary."""
    import sparkcep as cep
    from sparkcep.bench.driver import drive
    from sparkcep.bench.metrics import latencies, latency_columns, summarize, timeline
    src = suite.source(workload, args.seed, args.ips)
    instances = args.instances if workload == "repartition" else max(1, args.workers)
    label = f"sparkcep {workload} {_fmt_rate(rate)}"
    with _progress(console, label) as bar, cep.Engine.local(workers=args.workers) as engine:
        task = bar.add_task(label, total=events, rate="")
        suite.warm_up(engine, suite.query(workload, latency), suite.warm_up_source(workload, args.ips), instances)
        q = suite.query(workload, latency)
        engine.deploy(q, parallelism=instances,
                      retain=False)  # like Spark's noop sink: results are counted and timed, not kept

        def tick(r, sent):
            el = max(time.time_ns() - r.t_start, 1) / 1e9
            bar.update(task, completed=sent, rate=f"{sent / el:,.0f} ev/s")

        run = drive(engine, src, workload, events, rate=rate, tick=tick, tick_s=0.25,
                    keep=latency_columns(workload))
    lat = latencies(workload, run, suite.occurrences(workload, src, events))
    res = summarize(run, lat)
    res.update(engine="sparkcep", workload=workload, latency_run=latency, workers=args.workers,
               instances=instances, timeline=timeline(run, lat))
    return res


def warm_spark(spark, plans, args) -> None:
    """Run each workload of ``plans`` ((workload, latency run?) pairs) once per configuration, untimed,
    on as many events as sparkcep warms up on: Spark's first queries pay for planning, code generation,
    a cold JIT and (latency runs of windows) starting its Python ``foreachBatch`` callback, as ours pay
    for loading kernels."""
    from sparkcep.bench import spark as sb
    for w, latency in dict.fromkeys(plans):
        if not suite.has_spark_peer(w):
            continue
        windowed = suite.windows_us(w, latency) is not None
        wd = sb.workdir()
        try:
            sb.run_query(spark, w, suite.spark_df(w, latency, args.instances), suite.warm_up_source(w, args.ips),
                         suite.WARM_UP_EVENTS, None, wd, _gap_us(w, latency), windowed, record=latency and windowed)
        finally:
            sb.cleanup(wd)


def _gap_us(workload: str, latency: bool) -> int:
    """How far past the last event Spark's flush record goes: one window (or the HiBench one)."""
    w = suite.windows_us(workload, latency)
    return w[0] if w else 10_000_000


def run_spark(spark, workload: str, rate, events: int, args, console, latency: bool = False) -> dict:
    """One run of ``workload`` on Spark; its summary."""
    import numpy as np
    from sparkcep.bench import spark as sb
    from sparkcep.bench.metrics import series
    src = suite.source(workload, args.seed, args.ips)
    label = f"spark {workload} {_fmt_rate(rate)}"
    wd = sb.workdir()
    try:
        with _progress(console, label) as bar:
            task = bar.add_task(label, total=events, rate="")
            t0 = time.time_ns()

            def progress(done):
                el = max(time.time_ns() - t0, 1) / 1e9
                bar.update(task, completed=done, rate=f"{done / el:,.0f} ev/s")

            windowed = suite.windows_us(workload, latency) is not None
            srun = sb.run_query(spark, workload, suite.spark_df(workload, latency, args.instances), src, events,
                                rate, wd, _gap_us(workload, latency), windowed, record=latency and windowed,
                                progress=progress)
    finally:
        sb.cleanup(wd)
    lat = sb.latencies(srun)
    res = sb.summarize(srun, lat)
    log = srun.log
    end = int(max([srun.t_start] + list(lat.when))) if len(lat.when) else srun.t_start
    res.update(engine="spark", workload=workload, latency_run=latency, workers=None, instances=args.instances,
               timeline=series(srun.t_start, end, np.array(log.arrival, np.int64), np.array(log.rows, np.int64),
                               lat.rows, lat.when))
    return res


def _fmt_rate(r) -> str:
    return "max" if not r else f"{r:,.0f}/s"


def _print_result(console, r: dict) -> None:
    lat = r["latency_ms"]
    line = (f"{r['engine']:8s} {r['workload']:16s} offered {_fmt_rate(r['offered_rate']):>10s}: "
            f"{r['throughput']:>12,.0f} events/s, latency per row ({r['latency_samples']:,}) "
            f"p50 {lat['p50']:.2f} ms, p99 {lat['p99']:.2f} ms, max {lat['max']:.2f} ms")
    if "closes" in r:
        c = r["close_latency_ms"]
        line += f"; per close ({r['closes']:,}) p50 {c['p50']:.2f} ms, p99 {c['p99']:.2f} ms"
    console.print(line)


def _print_table(results: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table
    t = Table(title="HiBench and NEXMark workloads (latency in ms, per result row)")
    for c in ("engine", "workload", "offered", "events", "events/s", "rows", "p50", "p99", "max", "closes",
              "close p50", "close p99"):
        t.add_column(c, justify="left" if c in ("engine", "workload") else "right")
    for r in results:
        lat, cl = r["latency_ms"], r.get("close_latency_ms")
        t.add_row(r["engine"], r["workload"], _fmt_rate(r["offered_rate"]), f"{r['events']:,}",
                  f"{r['throughput']:,.0f}", f"{r['latency_samples']:,}",
                  *(f"{lat[k]:.2f}" for k in ("p50", "p99", "max")),
                  *((f"{r['closes']:,}", f"{cl['p50']:.2f}", f"{cl['p99']:.2f}") if cl else ("-", "-", "-")))
    Console(width=160).print(t)


FIELDS = ["engine", "workload", "offered_rate", "events", "output_rows", "seconds", "throughput",
          "latency_samples", "p50_ms", "p75_ms", "p95_ms", "p99_ms", "p99.9_ms", "max_ms", "mean_ms", "closes",
          "close_p50_ms", "close_p99_ms", "close_max_ms", "workers", "instances"]


def write_outputs(out: Path, results: list[dict]) -> None:
    """results.csv (one row per run), results.json (with series) and one PNG per workload."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in results:
            row = dict(r)
            row.update({f"{k}_ms": v for k, v in r["latency_ms"].items()})
            row.update({f"close_{k}_ms": v for k, v in (r.get("close_latency_ms") or {}).items()})
            w.writerow(row)
    (out / "results.json").write_text(json.dumps(_finite(results), indent=1, allow_nan=False))
    for wl in dict.fromkeys(r["workload"] for r in results):
        plot(out / f"{wl}.png", [r for r in results if r["workload"] == wl])


def _finite(x):
    """``x`` (results: dicts, lists, numbers) with None for NaN and the infinities, which JSON lacks."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return None if isinstance(x, float) and not math.isfinite(x) else x


def plot(path: Path, runs: list[dict]) -> None:
    """Throughput (input and output rate) and latency (p50, p99) over time, every run of one workload."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=False)
    for r in runs:
        tl = r["timeline"]
        label = f"{r['engine']} {_fmt_rate(r['offered_rate'])}"
        style = "-" if r["engine"] == "sparkcep" else "--"
        ax1.step(tl["t_s"], tl["input_rate"], style, where="post", label=f"{label} in", alpha=0.6)
        ax1.step(tl["t_s"], tl["output_rate"], style, where="post", label=f"{label} out")
        ax2.plot(tl["t_s"], tl["latency_p50_ms"], style, marker=".", label=f"{label} p50")
        ax2.plot(tl["t_s"], tl["latency_p99_ms"], style, marker="x", label=f"{label} p99")
    ax1.set_ylabel("events (rows) / s")
    ax1.set_title(f"{runs[0]['workload']}: throughput over time")
    ax1.legend(fontsize=7)
    ax2.set_ylabel("latency, ms (log)")
    ax2.set_yscale("log")
    ax2.set_xlabel("seconds since the first event")
    ax2.set_title("latency over time (by output time)")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
