"""``sparkcep bench``: run a HiBench streaming workload on sparkcep, optionally beside Spark.

    sparkcep bench fixwindow --rate 100000 --events 2000000
    sparkcep bench wordcount --compare spark --out bench-out
    sparkcep bench all --compare spark --workers 2 --report docs/benchmarks.md

Input is open loop: ``--rate`` records/s on a fixed schedule (latency then
includes any falling behind), or as fast as possible without ``--rate``.
Prints throughput and latency percentiles (p50, p75, p95, p99, p99.9, max —
HiBench's figures); ``--out DIR`` writes ``results.csv``, ``results.json``
(with per-second series) and a PNG per workload (throughput and latency over
time). How latency is measured: :mod:`sparkcep.bench.metrics` and
:mod:`sparkcep.bench.spark`. ``all --report FILE`` runs every workload twice
per engine — as fast as possible (throughput) and at ``--latency-rate``
(latency) — and writes the markdown table of ``docs/benchmarks.md``.
"""

from __future__ import annotations

import csv
import json
import platform
import shlex
import sys
import time
from pathlib import Path

from sparkcep.bench import workloads

DEFAULT_EVENTS = 2_000_000
LATENCY_RATE = 50_000
LATENCY_SECONDS = 25


def add_arguments(parser) -> None:
    parser.add_argument("workload", choices=list(workloads.WORKLOADS) + ["all"])
    parser.add_argument("--rate", type=float, default=None, help="records/s, open loop (default: as fast as possible)")
    parser.add_argument("--events", type=int, default=None,
                        help=f"records to send (default {DEFAULT_EVENTS:,}; with --rate, {LATENCY_SECONDS} s worth)")
    parser.add_argument("--workers", type=int, default=0, help="instance manager processes (0: in this process)")
    parser.add_argument("--instances", type=int, default=2, help="instances of repartition's map (HiBench: cores)")
    parser.add_argument("--ips", type=int, default=100_000, help="distinct source IPs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compare", choices=["spark"], default=None, help="also run Spark Structured Streaming")
    parser.add_argument("--out", type=Path, default=None, help="directory for results.csv/json and PNG plots")
    parser.add_argument("--report", type=Path, default=None,
                        help="with 'all': write the markdown benchmark table to this file")
    parser.add_argument("--latency-rate", type=float, default=LATENCY_RATE,
                        help=f"with --report: the offered rate of the latency runs (default {LATENCY_RATE:,})")


def run(args) -> int:
    import sparkcep as cep
    names = list(workloads.WORKLOADS) if args.workload == "all" else [args.workload]
    if args.report is not None and args.workload != "all":
        print("--report needs the workload 'all'", file=sys.stderr)
        return 2
    try:
        cep.Engine.local(workers=args.workers).close()
    except cep.SparkcepError as e:
        print(f"error: {e} [{e.code}]", file=sys.stderr)
        return 2
    plans = []  # (workload, rate, events)
    for w in names:
        if args.report is not None:
            plans.append((w, None, args.events or DEFAULT_EVENTS))
            plans.append((w, args.latency_rate, int(args.latency_rate * LATENCY_SECONDS)))
        else:
            events = args.events or (int(args.rate * LATENCY_SECONDS) if args.rate else DEFAULT_EVENTS)
            plans.append((w, args.rate, events))
    from rich.console import Console
    console = Console(stderr=True)
    results = []
    for w, rate, events in plans:  # ours first, then Spark's: no idle JVM beside our runs, no engine beside its
        results.append(run_sparkcep(w, rate, events, args, console))
        _print_result(console, results[-1])
    if args.compare == "spark":
        console.print("starting Spark (local[2]) ...")
        from sparkcep.bench import spark as sb
        spark = sb.session()
        spark.sparkContext.setLogLevel("ERROR")
        try:
            warm_spark(spark, names, args.ips)
            theirs = []
            for w, rate, events in plans:
                theirs.append(run_spark(spark, w, rate, events, args, console))
                _print_result(console, theirs[-1])
        finally:
            spark.stop()
        results = [r for pair in zip(results, theirs) for r in pair]
    _print_table(results)
    if args.out is not None:
        write_outputs(args.out, results)
    if args.report is not None:
        write_report(args.report, results, args)
        print(f"wrote {args.report}")
    return 0


def _progress(console, label: str, total: int):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    return Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                    TimeElapsedColumn(), console=console, transient=True)


def run_sparkcep(workload: str, rate, events: int, args, console) -> dict:
    import sparkcep as cep
    from sparkcep.bench.driver import drive
    from sparkcep.bench.generator import UserVisits
    from sparkcep.bench.metrics import latencies, latency_columns, summarize, timeline
    gen = UserVisits(seed=args.seed, distinct_ips=args.ips)
    instances = args.instances if workload == "repartition" else max(1, args.workers)
    label = f"sparkcep {workload} {'max' if not rate else f'{rate:,.0f}/s'}"
    with _progress(console, label, events) as bar, cep.Engine.local(workers=args.workers) as engine:
        task = bar.add_task(label, total=events, rate="")
        workloads.warm_up(engine, workload, instances, args.ips)
        engine.deploy(workloads.query(workload), parallelism=workloads.parallelism(workload, instances),
                      retain=False)  # like Spark's noop sink: results are counted and timed, not kept

        def tick(r, sent):
            el = max(time.time_ns() - r.t_start, 1) / 1e9
            bar.update(task, completed=sent, rate=f"{sent / el:,.0f} rec/s")

        run = drive(engine, workloads.STREAM, workload, gen, events, rate=rate, tick=tick, tick_s=0.25,
                    keep=latency_columns(workload))
    lat = latencies(workload, run)
    res = summarize(run, lat)
    res.update(engine="sparkcep", workload=workload, workers=args.workers, instances=instances,
               timeline=timeline(run, lat))
    return res


def warm_spark(spark, names, ips: int) -> None:
    """Run each workload of ``names`` once, untimed, on the records sparkcep warms up on
    (:func:`~sparkcep.bench.workloads.warm_up_input`): Spark's first queries pay for planning,
    code generation and a cold JIT, as ours pay for loading kernels."""
    from sparkcep.bench import spark as sb
    records = workloads.WARM_UP_BATCHES * workloads.WARM_UP_ROWS
    wd = sb.workdir()
    try:
        for w in dict.fromkeys(names):
            sb.run_query(spark, w, workloads.warm_up_input(ips), records, None, wd)
    finally:
        sb.cleanup(wd)


def run_spark(spark, workload: str, rate, events: int, args, console) -> dict:
    from sparkcep.bench import spark as sb
    from sparkcep.bench.generator import UserVisits
    from sparkcep.bench.metrics import series
    import numpy as np
    gen = UserVisits(seed=args.seed, distinct_ips=args.ips)
    label = f"spark {workload} {'max' if not rate else f'{rate:,.0f}/s'}"
    wd = sb.workdir()
    try:
        with _progress(console, label, events) as bar:
            task = bar.add_task(label, total=events, rate="")
            t0 = time.time_ns()

            def progress(done):
                el = max(time.time_ns() - t0, 1) / 1e9
                bar.update(task, completed=done, rate=f"{done / el:,.0f} rec/s")

            srun = sb.run_query(spark, workload, gen, events, rate, wd, instances=args.instances, progress=progress)
    finally:
        sb.cleanup(wd)
    lat = sb.latencies(srun)
    res = sb.summarize(srun, lat)
    files = [v for k, v in srun.log.files.items() if k != srun.log.flush]
    in_t = np.array([f[0] for f in files], np.int64)
    in_rows = np.array([f[1] for f in files], np.int64)
    end = int(max([srun.t_start] + list(lat[1]))) if len(lat[1]) else srun.t_start
    res.update(engine="spark", workload=workload, workers=None, instances=args.instances,
               timeline=series(srun.t_start, end, in_t, in_rows, lat[0], lat[1]))
    return res


def _fmt_rate(r) -> str:
    return "max" if not r else f"{r:,.0f}/s"


def _print_result(console, r: dict) -> None:
    lat = r["latency_ms"]
    console.print(f"{r['engine']:8s} {r['workload']:11s} offered {_fmt_rate(r['offered_rate']):>10s}: "
                  f"{r['throughput']:>12,.0f} records/s, latency p50 {lat['p50']:.2f} ms, "
                  f"p99 {lat['p99']:.2f} ms, max {lat['max']:.2f} ms")


def _print_table(results: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table
    t = Table(title="HiBench streaming workloads (latency in ms)")
    for c in ("engine", "workload", "offered", "events", "records/s", "p50", "p75", "p95", "p99", "p99.9", "max"):
        t.add_column(c, justify="left" if c in ("engine", "workload") else "right")
    for r in results:
        lat = r["latency_ms"]
        t.add_row(r["engine"], r["workload"], _fmt_rate(r["offered_rate"]), f"{r['events']:,}",
                  f"{r['throughput']:,.0f}", *(f"{lat[k]:.2f}" for k in ("p50", "p75", "p95", "p99", "p99.9", "max")))
    Console(width=150).print(t)


FIELDS = ["engine", "workload", "offered_rate", "events", "output_rows", "seconds", "throughput",
          "p50_ms", "p75_ms", "p95_ms", "p99_ms", "p99.9_ms", "max_ms", "mean_ms", "workers", "instances"]


def write_outputs(out: Path, results: list[dict]) -> None:
    """results.csv (one row per run), results.json (with series) and one PNG per workload."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in results:
            row = dict(r)
            row.update({f"{k}_ms": v for k, v in r["latency_ms"].items()})
            w.writerow(row)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=_nan_none))
    for wl in dict.fromkeys(r["workload"] for r in results):
        plot(out / f"{wl}.png", [r for r in results if r["workload"] == wl])


def _nan_none(x):
    return None


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
    ax1.set_ylabel("records (rows) / s")
    ax1.set_title(f"{runs[0]['workload']}: throughput over time")
    ax1.legend(fontsize=7)
    ax2.set_ylabel("latency, ms (log)")
    ax2.set_yscale("log")
    ax2.set_xlabel("seconds since the first record")
    ax2.set_title("latency over time (by output time)")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(path: Path, results: list[dict], args) -> None:
    """The markdown table of all workloads, sparkcep beside Spark, from this run's results."""
    cmd = "sparkcep bench all --compare spark --report " + shlex.quote(str(path))
    if args.workers:
        cmd += f" --workers {args.workers}"
    if args.events:
        cmd += f" --events {args.events}"
    if args.latency_rate != LATENCY_RATE:
        cmd += f" --latency-rate {args.latency_rate:g}"
    by = {(r["engine"], r["workload"], bool(r["offered_rate"])): r for r in results}
    lines = [
        "# Benchmarks: HiBench streaming workloads, sparkcep beside Spark",
        "",
        "Generated by one command; every number below comes from its last run:",
        "",
        "```",
        cmd,
        "```",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on a machine with "
        f"{_machine()}, Python {platform.python_version()}. sparkcep: `Engine.local(workers={args.workers})` "
        f"({_deployment(args.workers)}); Spark: PySpark local[2], Parquet file source, noop sink.",
        f"Input: HiBench records (key: send time, value: a 200-byte `uservisits` row), "
        f"{args.ips:,} distinct IPs, seed {args.seed}.",
        "",
        "## Throughput (input as fast as possible)",
        "",
        "| workload | events | sparkcep records/s | Spark records/s | sparkcep / Spark |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for wl in workloads.WORKLOADS:
        ours, theirs = by.get(("sparkcep", wl, False)), by.get(("spark", wl, False))
        if ours is None:
            continue
        t = theirs["throughput"] if theirs else float("nan")
        lines.append(f"| {wl} | {ours['events']:,} | {ours['throughput']:,.0f} | "
                     f"{t:,.0f} | {ours['throughput'] / t:.2f}x |" if theirs else
                     f"| {wl} | {ours['events']:,} | {ours['throughput']:,.0f} | - | - |")
    lines += [
        "",
        f"## Latency at {args.latency_rate:,.0f} records/s offered (ms)",
        "",
        "| workload | engine | records/s | p50 | p75 | p95 | p99 | p99.9 | max |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for wl in workloads.WORKLOADS:
        for eng in ("sparkcep", "spark"):
            r = by.get((eng, wl, True))
            if r is None:
                continue
            lat = r["latency_ms"]
            lines.append(f"| {wl} | {eng} | {r['throughput']:,.0f} | "
                         + " | ".join(f"{lat[k]:.2f}" for k in ("p50", "p75", "p95", "p99", "p99.9", "max")) + " |")
    lines += [
        "",
        "## How it is measured",
        "",
        "* Open loop: records are created on a fixed schedule at the offered rate (sparkcep: a batch per 10 ms; "
        "Spark: a Parquet file per 200 ms) and sent when due, whether or not the engine keeps up.",
        "* Throughput: input records over the time from the first record sent to the last result out.",
        "* Latency, one sample per result row: the time the row left the engine minus the arrival of the input "
        "it answers. sparkcep: arrival = the `send` call carrying the record, leaving = the `subscribe` "
        "callback. Spark: arrival = the input file's rename into the watched directory, leaving = the end of "
        "the micro-batch that emitted the row (from the query's progress events).",
        "* identity and repartition answer their own record; wordcount (running count per IP: sparkcep's "
        "keyed stateful operator, Spark's `groupBy(ip).count()` in update mode) answers the newest record of "
        "the IP (Spark: counted per input record); fixwindow (count and min time per IP, 10 s tumbling "
        "windows) answers the record that closed the window — the first at or past its end. HiBench measures "
        "fixwindow from the window's first record, which adds the window length.",
        "* Windows still open at the end of input: sparkcep closes them with `Engine.end`; Spark with one "
        "extra record 10 s past the last (reserved IP 0.0.0.0, not counted).",
        "* With `workers=0` sparkcep runs in the process that sends, on one core, and batches pass by reference: "
        "identity and repartition touch no record bytes, so their throughput is per-batch overhead. With "
        "`workers=N` every record is copied into a shared-memory ring to an instance manager and its result "
        "back to the sending process, which shares the 2 cores with them. Spark reads and decodes every "
        "Parquet byte with 2 cores.",
        "* Order: every sparkcep run first (each in a fresh engine, outputs deployed with `retain=False` as "
        "Spark's noop sink keeps nothing), then every Spark run in one session, so neither engine's idle "
        "processes share the machine with the other's measurements. Warm-up, untimed: each engine first runs "
        f"each workload on the same {workloads.WARM_UP_BATCHES * workloads.WARM_UP_ROWS:,} records, drawn from the "
        f"run's {args.ips:,} IPs. Both drivers freeze Python's garbage collector before their clock starts.",
        "* The machine is shared and noisy: compare the ratio, not the absolute figures, and rerun for medians.",
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))


def _deployment(workers: int) -> str:
    if not workers:
        return "every instance in the driving process"
    return (f"{workers} instance-manager processes pinned to cores, every sub-query deployed as {workers} "
            "instances, shared-memory channels")


def _machine() -> str:
    import os
    return f"{os.cpu_count()} cores ({platform.machine()})"
