"""HiBench fixwindow from Parquet files: Spark alone, beside Spark -> engine -> Spark through ``format("upmcep")``.

Both read the same directory of Parquet files (HiBench records, keys spread
over a span of event time, written by :func:`write_input`) as a stream in
one Spark session and end in Spark's ``noop`` sink:

* **native** -- Spark Structured Streaming computes fixwindow itself
  (:func:`sparkcep.bench.spark.workload_df`: 10 s tumbling windows per IP,
  count and first key, watermark 0 s, append mode);
* **routed** -- a Spark query writes the records into the engine
  (``writeStream.format("upmcep")``, default options: every file in one
  micro-batch, several partitions), the engine runs fixwindow
  (:func:`sparkcep.bench.workloads.query`, deployed afresh for each run on
  one engine that serves them all, as a running engine serves its queries;
  by default in this process, ``workers=0``), and a second Spark query,
  running all along, reads every window back (``readStream.format("upmcep")``).

Time: wall clock from the ``start()`` of the query that reads the Parquet
files to the moment the last result is out (native: the query ended; routed:
the reader has read every window the engine produced; its stages: ``sink``
until the writing query ended, ``source`` the rest). Throughput:
input records over that time. Each path starts one query on the clock, the
one that takes the files: the routed reader is the pipeline's standing
consumer, started before the clock and idle until windows come (as a deployed
pipeline's reader is); the time it took to start is reported beside the run
(``reader_start``), not in it. Both paths are warmed first by two untimed runs
over the same files (:func:`compare`): Spark's JIT-compiled code and the
engine's memory are then as a pipeline that has been running has them (after
one, the first measured run of each path was still 10-25% slower than the
next ones; an engine started afresh for each run spent a second of each
commit faulting in memory the last run had used).

CPU: seconds of CPU the run took (:func:`cpu_seconds`) in Spark (its JVM and
every Python process it started) and in the engine (this process: the
endpoint, the engine and Spark's idle Python driver; with ``workers``, the
instance managers too). On a shared machine CPU seconds vary far less than
wall time.

Completeness: the windows must equal a batch Spark computation of fixwindow
over the same files (rows, sum of counts, sum of first keys): the engine's
output log (retained) for the routed path, the sink's row count for the
native one. The input ends with one record of a reserved IP one window past
the last key: in both paths its event time closes every window before it,
and its own window stays open (nothing ends the input), so both emit the
same windows.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import sparkcep as cep
from sparkcep.bench import workloads
from sparkcep.bench.generator import UserVisits
from sparkcep.bench.spark import FLUSH_IP, WINDOW_S, workload_df

T0_US = 1_704_067_200_000_000  # 2024-01-01 00:00:00 UTC
SPARK_DDL = "key TIMESTAMP, value STRING"


@dataclass
class Totals:
    """What a fixwindow result holds, flush window left out: rows, sum of counts, sum of first keys (us after T0)."""

    rows: int
    count: int
    first: int


@dataclass
class PipelineRun:
    """One measured run of one path."""

    path: str  # "native" or "routed"
    events: int
    seconds: float
    totals: Totals
    stages: dict[str, float] = field(default_factory=dict)  # routed: sink, source
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds per group of processes
    reader_start: float = 0.0  # routed: seconds its reading query took to start, before the clock

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0


def cpu_seconds() -> dict[str, float]:
    """CPU seconds used so far by this process and its descendants: ``spark`` (the JVM and its children), ``engine``.

    A process counts its own time plus that of its children that exited, so
    Python workers Spark started and reaped still count. This process's own
    count leaves out the JVM it started (its child, counted under ``spark``).
    """
    me = psutil.Process()
    out = {"spark": 0.0, "engine": 0.0}
    for p in [me, *me.children(recursive=True)]:
        try:
            t, spark = p.cpu_times(), p.name() == "java" or any(q.name() == "java" for q in p.parents())
        except psutil.Error:
            continue
        out["spark" if spark else "engine"] += t.user + t.system + t.children_user + t.children_system
    return out


def _cpu_since(before: dict[str, float]) -> dict[str, float]:
    now = cpu_seconds()
    return {k: round(now[k] - before[k], 2) for k in now}


def write_input(directory: Path, events: int = 2_000_000, files: int = 10, span_s: float = 600.0,
                ips: int = 100_000, seed: int = 0) -> Path:
    """``events`` HiBench records over ``span_s`` s of event time in ``files`` Parquet files, then the flush file."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    gen, per = UserVisits(seed=seed, distinct_ips=ips), -(-events // files)
    for k, start in enumerate(range(0, events, per)):
        batch = gen.records(start, min(per, events - start), start_us=T0_US, rate=events / span_s)
        pq.write_table(pa.Table.from_batches([batch]), directory / f"part-{k:04d}.parquet")
    last = int(batch.column("key").cast(pa.int64())[-1].as_py())
    flush = pa.table({"key": pa.array([last + WINDOW_S * 1_000_000], pa.timestamp("us")),
                      "value": [f"{FLUSH_IP},flush"]})
    pq.write_table(flush, directory / f"part-{k + 1:04d}.parquet")
    return directory


def reference(spark, directory: Path) -> Totals:
    """Fixwindow over ``directory`` as a batch Spark job: what both paths must produce."""
    from pyspark.sql import functions as F

    rows = spark.read.schema(SPARK_DDL).parquet(str(directory)) \
        .select(F.substring_index("value", ",", 1).alias("ip"), "key").where(F.col("ip") != FLUSH_IP)
    agg = rows.groupBy(F.window("key", f"{WINDOW_S} seconds"), "ip").agg(F.count(F.lit(1)).alias("count"),
                                                                        F.min("key").alias("first"))
    r = agg.agg(F.count(F.lit(1)).alias("rows"), F.sum("count").alias("count"),
                F.sum(F.unix_micros("first") - T0_US).alias("first")).collect()[0]
    return Totals(int(r["rows"]), int(r["count"]), int(r["first"]))


def compare(spark, directory: Path, workdir: Path, runs: int, workers: int = 0, on_run=None,
            warm_ups: int = 2) -> dict[str, list]:
    """Both paths over ``directory``: ``warm_ups`` untimed runs of each, then ``runs`` measured ones, alternating.

    The routed runs share one engine (``workers`` instance managers), as the
    runs of native share one Spark session; each run deploys the query
    afresh. Returns ``{path: [(run, complete), ...]}``; ``on_run(k, run,
    complete)`` is called as each measured run ends. A routed run is complete
    when its windows equal :func:`reference`, a native one when it emitted as many.
    """
    with cep.Engine.local(workers=workers) as engine:
        for _ in range(warm_ups):
            native(spark, directory, workdir)
            routed(spark, directory, workdir, engine)
        want = reference(spark, directory)
        out: dict[str, list] = {"native": [], "routed": []}
        for k in range(runs):
            for run in (native(spark, directory, workdir), routed(spark, directory, workdir, engine)):
                complete = run.totals == want if run.path == "routed" else run.totals.rows == want.rows
                out[run.path].append((run, complete))
                if on_run is not None:
                    on_run(k, run, complete)
    return out


def native(spark, directory: Path, workdir: Path) -> PipelineRun:
    """Spark alone: Parquet stream -> fixwindow -> noop."""
    ck = _fresh(workdir / "ck-native")
    df, mode = workload_df(spark, "fixwindow", spark.readStream.schema(SPARK_DDL).parquet(str(directory)))
    cpu, t = cpu_seconds(), time.perf_counter()
    q = df.writeStream.format("noop").outputMode(mode).option("checkpointLocation", str(ck)) \
        .trigger(availableNow=True).start()
    _finish(q)
    seconds = time.perf_counter() - t
    rows = sum(p["sink"].get("numOutputRows", 0) for p in q.recentProgress)
    return PipelineRun("native", _events(directory), seconds, Totals(rows, -1, -1), cpu=_cpu_since(cpu))


def routed(spark, directory: Path, workdir: Path, engine: cep.Engine, poll_s: float = 0.02) -> PipelineRun:
    """Spark -> ``format("upmcep")`` -> fixwindow on ``engine`` -> ``format("upmcep")`` -> Spark (noop).

    The query is deployed for the run and undeployed after it. Both Spark
    queries run at once, as a deployed pipeline would: the reader (a 250 ms
    processing-time trigger; waiting for data, a trigger every 100 ms took 0.8
    CPU s per 10 s, every 500 ms 0.2) is started first and takes windows as
    the engine emits them. The clock starts with the writing query, once the
    reader has run its first trigger, and stops when the reader has read every
    row the engine produced.
    """
    workers = len(engine.instance_managers())
    engine.deploy(workloads.query("fixwindow"), parallelism=workloads.parallelism("fixwindow", max(workers, 1)))
    try:
        engine.outputs["fixwindow"].register("bench")  # keeps every window for the check after the reader's commits
        a = engine.endpoint.address
        records = spark.readStream.schema(SPARK_DDL).parquet(str(directory))
        back = spark.readStream.format("upmcep").option("engine", a).option("stream", "fixwindow") \
            .option("includeMetadata", "false").load()
        t = time.perf_counter()
        reader = back.writeStream.format("noop").option("checkpointLocation", str(_fresh(workdir / "ck-source"))) \
            .trigger(processingTime="250 milliseconds").start()
        _await_first_trigger(reader)
        reader_start = time.perf_counter() - t
        cpu, t = cpu_seconds(), time.perf_counter()
        _finish(records.writeStream.format("upmcep").option("engine", a).option("stream", workloads.STREAM)
                .option("checkpointLocation", str(_fresh(workdir / "ck-sink"))).trigger(availableNow=True).start())
        t_sink = time.perf_counter()
        produced, read = engine.outputs["fixwindow"].rows, _RowsRead(reader)
        deadline = t_sink + 600
        while read() < produced:
            if not reader.isActive or time.perf_counter() > deadline:
                reader.stop()
                raise RuntimeError(f"the Spark reader read {read():,} of the engine's {produced:,} rows "
                                   f"({reader.exception() or 'timed out'})")
            time.sleep(poll_s)
        t_source = time.perf_counter()
        cpu = _cpu_since(cpu)
        reader.stop()
        totals = _engine_totals(engine.collect("fixwindow"))
    finally:
        engine.undeploy("fixwindow")
    return PipelineRun("routed", _events(directory), t_source - t, totals,
                       {"sink": t_sink - t, "source": t_source - t_sink}, cpu, reader_start)


def _await_first_trigger(q, timeout_s: float = 120.0) -> None:
    """Return once streaming query ``q`` has reported its first trigger (it is up, and idle without data)."""
    deadline = time.perf_counter() + timeout_s
    while q.lastProgress is None:
        if not q.isActive or time.perf_counter() > deadline:
            q.stop()
            raise RuntimeError(f"the Spark reader did not start in {timeout_s} s ({q.exception() or 'timed out'})")
        time.sleep(0.01)


class _RowsRead:
    """Rows a streaming query has read so far, from its progress entries; the whole list of them is
    fetched only when its last entry changed (an idle trigger's entry repeats the coming batch's id)."""

    def __init__(self, q):
        self.q, self.last, self.rows = q, None, 0

    def __call__(self) -> int:
        last = self.q.lastProgress
        if last is not None and last["timestamp"] != self.last:
            self.last = last["timestamp"]
            self.rows = sum(p["numInputRows"] for p in self.q.recentProgress)
        return self.rows


def _engine_totals(table: pa.Table) -> Totals:
    t = table.filter(pc.not_equal(table.column("ip"), FLUSH_IP))
    first = pc.sum(pc.subtract(t.column("first").cast(pa.int64()), T0_US)).as_py() or 0
    return Totals(t.num_rows, pc.sum(t.column("count")).as_py() or 0, first)


def _events(directory: Path) -> int:
    return sum(pq.ParquetFile(f).metadata.num_rows for f in sorted(directory.glob("*.parquet"))) - 1


def _finish(q, timeout_s: float = 1200.0) -> None:
    q.awaitTermination(timeout_s)
    if q.isActive:
        q.stop()
        raise RuntimeError(f"query {q.name or q.id} did not finish in {timeout_s} s")
    if q.exception() is not None:
        raise RuntimeError(f"query {q.name or q.id} failed: {q.exception()}")


def _fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    return path
