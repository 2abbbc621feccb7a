"""Every benchmark workload, HiBench's and NEXMark's, as the CLI and the report run them.

A run is a *throughput* run (input as fast as possible, the suites' own
windows: HiBench fixwindow 10 s, NEXMark Q5 10 s sliding by 2 s, Q7 and Q8
10 s) or a *latency* run (open loop at a rate, windows :data:`LATENCY_SCALE`
times shorter, so that a 25 s run closes hundreds of windows and the
percentiles summarise more than a handful of closes).
"""

from __future__ import annotations

import statistics

import sparkcep as cep
from sparkcep.bench import nexmark_queries, workloads
from sparkcep.bench.generator import UserVisits
from sparkcep.bench.metrics import ANSWERS, Occurrences
from sparkcep.bench.nexmark import Nexmark, NexmarkSource

HIBENCH = workloads.WORKLOADS
NEXMARK = nexmark_queries.QUERIES
ALL = HIBENCH + NEXMARK
LATENCY_SCALE = 100  # latency runs: windows this many times shorter (fixwindow 100 ms, Q7 100 ms, ...)
DEFAULT_EVENTS = 2_000_000  # a throughput run
LATENCY_RATE = 50_000  # a latency run: offered events/s ...
LATENCY_SECONDS = 25  # ... for this long
NEXMARK_RATE = 100_000.0  # NEXMark event times when sent as fast as possible: events/s of event time
WARM_UP_EVENTS = workloads.WARM_UP_BATCHES * workloads.WARM_UP_ROWS


def suite(name: str) -> str:
    """The benchmark suite workload ``name`` belongs to."""
    return "NEXMark" if name in NEXMARK else "HiBench"


def has_spark_peer(name: str) -> bool:
    """Whether Spark Structured Streaming runs workload ``name`` too."""
    return name not in workloads.NO_SPARK_PEER


def scale(latency: bool) -> int:
    """How many times shorter than the suites' own the windows of a run are."""
    return LATENCY_SCALE if latency else 1


def windows_us(name: str, latency: bool) -> tuple[int, int] | None:
    """(size, advance) of the workload's window in a run, or None when it has none."""
    if name in NEXMARK:
        return nexmark_queries.windows_us(name, scale(latency))
    if name == "fixwindow":
        w = workloads.WINDOW_US // scale(latency)
        return w, w
    return None


def query(name: str, latency: bool) -> cep.Query:
    """The sparkcep query of workload ``name`` for a throughput or a latency run."""
    if name in NEXMARK:
        return nexmark_queries.query(name, scale(latency))
    return workloads.query(name, window_us=workloads.WINDOW_US // scale(latency))


def source(name: str, seed: int, ips: int):
    """The driver's input of workload ``name`` (:class:`~sparkcep.bench.driver.Source`)."""
    if name in NEXMARK:
        return NexmarkSource(Nexmark(seed=seed), nexmark_queries.STREAMS[name], NEXMARK_RATE)
    return workloads.Records(UserVisits(seed=seed, distinct_ips=ips))


def occurrences(name: str, src, events: int) -> Occurrences | None:
    """What attributes a running count to the record it answers (see :mod:`sparkcep.bench.metrics`)."""
    if ANSWERS[name] != "occurrence":
        return None
    return Occurrences(src.gen.ips, src.gen.ip_index(0, events))


def warm_up_source(name: str, ips: int):
    """The input both engines run workload ``name`` on, untimed, before it is measured: another seed
    (HiBench: drawn from the measured run's ``ips`` IPs, so a first window close is as large there)."""
    if name in NEXMARK:
        return NexmarkSource(Nexmark(seed=1), nexmark_queries.STREAMS[name], NEXMARK_RATE)
    return workloads.Records(workloads.warm_up_input(ips))


def warm_up(engine: cep.Engine, q: cep.Query, src, instances: int) -> None:
    """Run ``q`` briefly on ``engine``, untimed, over :data:`WARM_UP_EVENTS` events of ``src``, then
    undeploy it: every instance manager has compiled (or loaded from numba's cache) the kernels
    the measured run calls, and grown its tables once."""
    from sparkcep.bench.driver import drive
    engine.deploy(q, parallelism=max(1, instances))
    try:
        drive(engine, src, next(iter(q.outputs)), WARM_UP_EVENTS, batch_rows=workloads.WARM_UP_ROWS)
    finally:
        engine.undeploy(q.name)


def spark_df(name: str, latency: bool, instances: int):
    """``df_of(streams)`` for :func:`sparkcep.bench.spark.run_query`: the Spark query of ``name``."""
    from sparkcep.bench.spark_queries import hibench_df, nexmark_df
    if name in NEXMARK:
        return lambda streams: nexmark_df(name, streams, scale(latency))
    return lambda streams: hibench_df(name, streams[workloads.STREAM], instances,
                                      workloads.WINDOW_US // scale(latency))


def describe_windows(latency: bool) -> dict[str, str]:
    """The window of each windowed workload in a run, as the report prints it."""
    def show(us: int) -> str:
        return f"{us / 1e6:g} s" if us >= 1_000_000 else f"{us / 1e3:g} ms"
    out = {}
    for name in ALL:
        w = windows_us(name, latency)
        if w is not None:
            out[name] = show(w[0]) if w[0] == w[1] else f"{show(w[0])} sliding by {show(w[1])}"
    return out


def median_throughput(results: list[dict], engine: str, workload: str) -> tuple[float, list[float]] | None:
    """(median, every figure) of the throughput runs of ``workload`` on ``engine``, or None."""
    runs = [r["throughput"] for r in results
            if r["engine"] == engine and r["workload"] == workload and not r["latency_run"]]
    return (statistics.median(runs), runs) if runs else None
