"""Spark Structured Streaming runs of the benchmark workloads, on the records sparkcep gets.

Input is a directory of Parquet files per stream, written from the same
driver source (:class:`sparkcep.bench.driver.Source`) sparkcep is fed from:
all at once before the query starts when there is no rate (Spark reads them
as fast as it can), else by :class:`FileFeeder` at the offered rate, one file
per stream per interval (a *chunk*), written under a hidden name and renamed
into place, so its arrival time is the rename. The queries are
:mod:`sparkcep.bench.spark_queries`. Windows still open at the end of input
are closed by a flush record per stream one window past the last event
(the sources' ``flush``), as sparkcep closes them with ``end``.

What left when is read from Spark's own records: the query's progress
events (batch start and duration, rows in and out, the watermark) and the
file source's log in the checkpoint (which files each micro-batch read).
Throughput runs end in the ``noop`` sink. Latency, at Spark's granularity
(a row leaves when its micro-batch ends):

* records and running counts — per input record, from its file's arrival
  to the end of the micro-batch that read it;
* windows (fixwindow, NEXMark) — the latency runs end in a ``foreachBatch``
  sink that counts each batch's rows per ``window_end`` as the batch ends;
  a row's latency runs from the arrival of the chunk that closed its window
  (the first whose last event time is at or past ``window_end``; the flush
  for windows open at the end) to the end of the batch that emitted it, and
  a close's from that arrival to its last row out (:mod:`sparkcep.bench.metrics`).
"""

from __future__ import annotations

import datetime as dt
import gc
import json
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sparkcep.bench import workloads
from sparkcep.bench.metrics import Latency, per_close
from sparkcep.bench.spark_queries import hibench_df

FLUSH_IP = workloads.FLUSH_IP
WINDOW_S = workloads.WINDOW_US // 1_000_000  # HiBench fixwindow's window
SAMPLE_EVENTS = 65_536  # written once to measure what Spark's input takes an event on disk
SPARE_BYTES = 1 << 30  # what a run's input leaves free on its disk
_SPARK_TYPES = {"int64": "bigint", "int32": "int", "float64": "double", "float32": "float", "bool": "boolean",
                "string": "string", "timestamp": "timestamp"}


def session(app: str = "sparkcep-bench"):
    """A local[2] SparkSession tuned for short benchmark runs (created once per process)."""
    from pyspark.sql import SparkSession
    return (SparkSession.builder.master("local[2]").appName(app)
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.sql.streaming.numRecentProgressUpdates", "100000")
            .config("spark.sql.streaming.noDataMicroBatches.enabled", "true")
            .config("spark.driver.memory", "4g")  # 2g ran out in q7's second throughput run
            .config("spark.ui.showConsoleProgress", "false")
            .getOrCreate())


def workload_df(spark, workload: str, source, instances: int = 2):
    """HiBench ``workload`` over ``source`` (key, value), HiBench's 10 s windows: (DataFrame, mode)."""
    return hibench_df(workload, source, instances)


def spark_ddl(ddl: str) -> str:
    """A sparkcep DDL schema in Spark's type names."""
    fields = [f.split() for f in ddl.split(",")]
    return ", ".join(f"{name} {_SPARK_TYPES[t]}" for name, t in fields)


# --- input files ---------------------------------------------------------------------------
@dataclass
class FileLog:
    """Chunks written into the input directories, in order."""

    arrival: list[int] = field(default_factory=list)     # ns, the chunk's first file renamed into place
    rows: list[int] = field(default_factory=list)        # events of the chunk
    first: list[int] = field(default_factory=list)       # first event time (us)
    last: list[int] = field(default_factory=list)        # last event time (us)
    chunk_of: dict[str, int] = field(default_factory=dict)  # file name -> chunk
    flush: int = 0                                       # ns, the flush files renamed into place
    flush_files: set[str] = field(default_factory=set)
    files: int = 0                                       # rows written, flush included


def _write(directory: Path, name: str, batch: pa.RecordBatch) -> int:
    tmp = directory / f".{name}.tmp"
    pq.write_table(pa.Table.from_batches([batch]), tmp, compression="snappy")
    os.replace(tmp, directory / name)
    return time.time_ns()


def room_refused(source, events: int) -> str | None:
    """Why ``events`` events of ``source`` would not fit as Spark's Parquet input where :func:`workdir`
    puts it with ``SPARE_BYTES`` left free, or None: measured on ``SAMPLE_EVENTS`` of them written
    there (a mistyped ``--events`` filled the disk before Spark read a row)."""
    d = workdir()
    try:
        n = min(events, SAMPLE_EVENTS)
        source.prepare(n)
        for stream, batch in source.batches(0, n, np.arange(n, dtype=np.int64)):
            if batch.num_rows:
                _write(d, f"{stream}.parquet", batch)
        need = sum(f.stat().st_size for f in d.iterdir()) * events / n
        free = shutil.disk_usage(d).free
    finally:
        shutil.rmtree(d, ignore_errors=True)
    if need + SPARE_BYTES <= free:
        return None
    return (f"{events:,} events would take about {need / 1e9:,.1f} GB of Parquet for Spark in {d.parent}, "
            f"which has {free / 1e9:,.1f} GB free: use fewer events, or --no-spark")


def write_chunk(dirs: dict[str, Path], log: FileLog, name: str, parts, keys: np.ndarray) -> None:
    """Write one chunk (``parts``: (stream, batch) pairs) as file ``name`` of each stream."""
    arrival = None
    for stream, batch in parts:
        if batch.num_rows:
            t = _write(dirs[stream], name, batch)
            arrival = arrival or t
            log.chunk_of[f"{stream}/{name}"] = len(log.arrival)
            log.files += batch.num_rows
    log.arrival.append(arrival or time.time_ns())
    log.rows.append(len(keys))
    log.first.append(int(keys[0]))
    log.last.append(int(keys[-1]))


def write_flush(dirs: dict[str, Path], log: FileLog, source, gap_us: int) -> None:
    """The records that close every open window: one per stream, ``gap_us`` past the last event."""
    name = f"part-{len(log.arrival):06d}.parquet"
    for stream, batch in source.flush(log.last[-1] + gap_us):
        arrival = _write(dirs[stream], name, batch)
        log.flush = log.flush or arrival
        log.flush_files.add(f"{stream}/{name}")
        log.files += batch.num_rows


def write_input(dirs: dict[str, Path], source, events: int, start_us: int, rate: float, gap_us: int,
                rows_per_file: int = 262_144) -> FileLog:
    """All ``events`` of ``source`` at once (event times spaced for ``rate``), then the flush."""
    log = FileLog()
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    source.prepare(events)
    for i, start in enumerate(range(0, events, rows_per_file)):
        n = min(rows_per_file, events - start)
        keys = start_us + (np.arange(start, start + n, dtype=np.float64) * (1e6 / rate)).astype(np.int64)
        write_chunk(dirs, log, f"part-{i:06d}.parquet", source.batches(start, n, keys), keys)
    write_flush(dirs, log, source, gap_us)
    _in_write_order(dirs)
    return log


def _in_write_order(dirs: dict[str, Path]) -> None:
    """Give the files of each of ``dirs`` modification times 1 ms apart, in name (= write) order.

    Spark's file source takes the files by modification time, which it reads in ms: files written
    within one ms tied, and then came in the directory's order (a run read the second file first).
    """
    for d in dirs.values():
        files = sorted(d.glob("part-*.parquet"))
        first = time.time_ns() - len(files) * 1_000_000
        for i, f in enumerate(files):
            os.utime(f, ns=(first + i * 1_000_000,) * 2)


class FileFeeder(threading.Thread):
    """Writes the events due in each ``interval_s`` as one chunk, open loop at ``rate``, then the flush."""

    def __init__(self, dirs: dict[str, Path], source, events: int, rate: float, gap_us: int,
                 interval_s: float = 0.2):
        super().__init__(daemon=True)
        self.dirs, self.source, self.events, self.rate, self.gap_us = dirs, source, events, rate, gap_us
        self.interval_s = interval_s
        self.log = FileLog()
        self.error: BaseException | None = None
        self.start_ns = 0

    def run(self) -> None:
        try:
            rows = max(1, int(round(self.rate * self.interval_s)))
            dt_us = int(round(rows * 1e6 / self.rate))
            self.start_ns = time.time_ns()
            t0 = self.start_ns // 1000
            sent, j = 0, 0
            while sent < self.events:
                n = min(rows, self.events - sent)
                base = t0 + j * dt_us
                keys = base + (np.arange(n, dtype=np.int64) * dt_us) // rows
                parts = self.source.batches(sent, n, keys)
                wait = (base + dt_us) * 1000 - time.time_ns()
                if wait > 0:
                    time.sleep(wait / 1e9)
                write_chunk(self.dirs, self.log, f"part-{j:06d}.parquet", parts, keys)
                sent += n
                j += 1
            write_flush(self.dirs, self.log, self.source, self.gap_us)
        except BaseException as e:  # reported by the caller
            self.error = e


# --- running a query ----------------------------------------------------------------------------
class WindowRecorder:
    """A ``foreachBatch`` sink: per micro-batch, when it ended and its rows per ``window_end`` (us)."""

    def __init__(self):
        self.log: list[tuple[int, dict[int, int]]] = []

    def __call__(self, df, batch_id) -> None:
        from pyspark.sql import functions as F
        counts = df.groupBy(F.unix_micros("window_end").alias("e")).count().collect()
        self.log.append((time.time_ns(), {int(r["e"]): int(r["count"]) for r in counts}))


@dataclass
class SparkRun:
    workload: str
    events: int
    t_start: int
    batches: list[dict]          # progress events, in order
    files: dict[str, int]        # "stream/file" -> batch id
    log: FileLog
    rate: float | None = None
    windowed: bool = False
    windows: list[tuple[int, dict[int, int]]] | None = None  # latency runs of windowed workloads


def run_query(spark, workload: str, df_of, source, events: int, rate: float | None, workdir: Path,
              gap_us: int, windowed: bool, record: bool = False, timeout_s: float = 900.0,
              progress=None) -> SparkRun:
    """Run one query on Spark over ``events`` events of ``source``: pre-written files when ``rate`` is
    None (as fast as Spark reads them), else fed at ``rate`` while the query runs.

    ``df_of(streams)`` builds (DataFrame, output mode) from {stream: streaming DataFrame};
    ``gap_us``: how far past the last event the flush goes (a window); ``windowed``: the
    query emits windows (it is done once the watermark passes the last event); ``record``:
    end in a :class:`WindowRecorder` instead of ``noop`` (latency runs of windowed queries).
    """
    inp, ckpt = workdir / "input", workdir / "checkpoint"
    for d in (inp, ckpt):
        shutil.rmtree(d, ignore_errors=True)
    dirs = {s: inp / s for s in source.streams}
    for d in dirs.values():
        d.mkdir(parents=True)
    source.prepare(events)
    feeder = None
    if rate is None:
        log = write_input(dirs, source, events, time.time_ns() // 1000, source.nominal_rate or 1e6, gap_us)
    streams = {s: spark.readStream.schema(spark_ddl(source.ddl[s])).parquet(str(d)) for s, d in dirs.items()}
    df, mode = df_of(streams)
    recorder = WindowRecorder() if windowed and record else None
    writer = df.writeStream.outputMode(mode).option("checkpointLocation", str(ckpt))
    writer = writer.foreachBatch(recorder) if recorder is not None else writer.format("noop")
    gc.freeze()  # as the sparkcep driver does (:mod:`sparkcep.bench.driver`): no full collection pauses the feeder
    t_start = time.time_ns()
    q = writer.queryName(f"bench_{workload}_{os.getpid()}_{t_start}").start()
    if rate is not None:
        feeder = FileFeeder(dirs, source, events, rate, gap_us)
        feeder.start()
        log = feeder.log
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if feeder is not None and feeder.error is not None:
                raise feeder.error
            ex = q.exception()
            if ex is not None:
                raise RuntimeError(f"Spark query {workload} failed: {ex}")
            done = [_as_dict(p) for p in q.recentProgress]
            done_rows = sum(p["numInputRows"] for p in done)
            if progress is not None:
                progress(min(done_rows, events))
            if (feeder is None or not feeder.is_alive()) and log.flush and done_rows >= log.files:
                if not windowed or _watermark_passed(done, max(log.last)):
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"Spark {workload}: {done_rows} of {log.files} rows after {timeout_s:.0f} s")
            time.sleep(0.05)
    finally:
        q.stop()
    if feeder is not None:
        feeder.join()
        t_start = feeder.start_ns
    return SparkRun(workload, events, t_start, [_as_dict(p) for p in q.recentProgress], batch_files(ckpt), log,
                    rate, windowed, recorder.log if recorder is not None else None)


def batch_files(checkpoint: Path) -> dict[str, int]:
    """"stream/file" -> micro-batch id, from the file sources' logs in the checkpoint."""
    out: dict[str, int] = {}
    root = checkpoint / "sources"
    for d in sorted(root.iterdir()) if root.exists() else []:
        for f in sorted(d.iterdir()):
            if f.name.startswith("."):
                continue
            for line in f.read_text().splitlines()[1:]:
                if line.strip():
                    e = json.loads(line)
                    path = Path(e["path"])
                    out[f"{path.parent.name}/{path.name}"] = int(e["batchId"])
    return out


def _ts_ns(text: str) -> int:
    t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return int(t.timestamp() * 1e9)


def _watermark_us(p: dict) -> int | None:
    w = (p.get("eventTime") or {}).get("watermark")
    return None if w is None else _ts_ns(w) // 1000


def _watermark_passed(progress: list[dict], last_us: int) -> bool:
    return any((w := _watermark_us(p)) is not None and w > last_us for p in progress)


def _as_dict(p) -> dict:
    """A progress event as plain JSON data (PySpark 4 gives objects that are also dict-like)."""
    j = getattr(p, "json", None)
    if isinstance(j, str):
        return json.loads(j)
    return json.loads(json.dumps(dict(p), default=str))


def _batch_end(p: dict) -> int:
    return _ts_ns(p["timestamp"]) + int(p["durationMs"].get("triggerExecution", 0)) * 1_000_000


# --- latency and throughput -------------------------------------------------------------------
def latencies(run: SparkRun) -> Latency:
    """Per input record (records, running counts) or per result row and window close (windows; none
    when they were not recorded)."""
    log = run.log
    if run.windowed:
        lasts, arrivals = np.array(log.last, np.int64), np.array(log.arrival, np.int64)
        rows, when, ends = [], [], []
        for t_out, counts in run.windows or []:
            for end, n in counts.items():
                k = int(np.searchsorted(lasts, end, side="left"))
                arrival = arrivals[k] if k < len(lasts) else log.flush
                rows.append(np.full(n, t_out - arrival, np.int64))
                when.append(np.full(n, t_out, np.int64))
                ends.append(np.full(n, end, np.int64))
        if not rows:
            return Latency(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
        lat = np.concatenate(rows)
        return Latency(lat, np.concatenate(when), per_close(np.concatenate(ends), lat))
    ends = {int(p["batchId"]): _batch_end(p) for p in run.batches}
    lat, when = [], []
    for name, batch in run.files.items():
        chunk = log.chunk_of.get(name)
        if chunk is None or batch not in ends:  # the flush, or a file read after the run
            continue
        lat.append(np.full(log.rows[chunk], ends[batch] - log.arrival[chunk], np.int64))
        when.append(np.full(log.rows[chunk], ends[batch], np.int64))
    if not lat:
        return Latency(np.zeros(0, np.int64), np.zeros(0, np.int64))
    return Latency(np.concatenate(lat), np.concatenate(when))


def summarize(run: SparkRun, lat: Latency) -> dict:
    """Throughput (events over first file to last result out), latency percentiles and counts."""
    from sparkcep.bench.metrics import latency_summary
    out_rows = sum(sum(c.values()) for _, c in run.windows) if run.windows is not None else \
        int(sum((p.get("sink") or {}).get("numOutputRows", 0) or 0 for p in run.batches))
    busy = [p for p in run.batches if p["numInputRows"] > 0 or ((p.get("sink") or {}).get("numOutputRows") or 0) > 0]
    last_end = max([_batch_end(p) for p in busy] + [t for t, _ in run.windows or []], default=run.t_start)
    elapsed = (last_end - run.t_start) / 1e9
    return {"events": run.events, "output_rows": out_rows, "seconds": elapsed,
            "throughput": run.events / elapsed if elapsed > 0 else float("nan"),
            "offered_rate": run.rate, "batches": len(run.batches), **latency_summary(lat)}


def cleanup(workdir: Path) -> None:
    shutil.rmtree(workdir, ignore_errors=True)


def workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="sparkcep-bench-spark-"))
