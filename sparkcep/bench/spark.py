"""The four HiBench workloads on Spark Structured Streaming, on the same records.

Input is a directory of Parquet files ``(key timestamp, value string)``
written by :func:`write_files` (or, while a run is live, by
:class:`FileFeeder` at the offered rate: a file per interval, written under a
hidden name and renamed into place, so its arrival time is the rename).
Each query ends in the ``noop`` sink; what left when is read from Spark's own
records: the query's progress events (batch start and duration, event-time
watermark, rows in and out) and the file source's log in the checkpoint
(which files each micro-batch read).

* identity — ``select(key, value)``, append mode;
* repartition — ``repartition(N)``, append mode;
* wordcount — ``groupBy(ip).count()``, update mode (HiBench's
  ``StructuredWordCount`` uses complete mode, which re-emits every IP every
  batch; update mode is the running count sparkcep emits);
* fixwindow — ``withWatermark(key, 0 s).groupBy(window(key, 10 s), ip)
  .agg(count, min(key))``, append mode: a window leaves once, when the
  watermark passes its end, as in sparkcep.

Latency, as in :mod:`sparkcep.bench.metrics` but at Spark's granularity: a
row leaves when its micro-batch ends (progress ``timestamp`` +
``triggerExecution``); stateless rows and running counts are measured per
input record from its file's arrival; a window from the arrival of the file
holding its closing record (the first with key >= window end) to the end of
the first batch whose watermark has reached the window end. Open windows at
the end of input are closed by a final file holding one record of a
reserved IP (``0.0.0.0``) 10 s past the last key, as sparkcep closes them
with ``end``.
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

from sparkcep.bench.generator import RECORD_SCHEMA, UserVisits

FLUSH_IP = "0.0.0.0"
WINDOW_S = 10


def session(app: str = "sparkcep-bench"):
    """A local[2] SparkSession tuned for short benchmark runs (created once per process)."""
    from pyspark.sql import SparkSession
    return (SparkSession.builder.master("local[2]").appName(app)
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.sql.streaming.numRecentProgressUpdates", "100000")
            .config("spark.sql.streaming.noDataMicroBatches.enabled", "true")
            .config("spark.driver.memory", "2g")
            .config("spark.ui.showConsoleProgress", "false")
            .getOrCreate())


def workload_df(spark, workload: str, source, instances: int = 2):
    """The streaming DataFrame of ``workload`` over ``source`` (a DataFrame of key, value)."""
    from pyspark.sql import functions as F
    if workload == "identity":
        return source.select("key", "value"), "append"
    if workload == "repartition":
        return source.repartition(instances), "append"
    ip = F.substring_index(F.col("value"), ",", 1).alias("ip")
    if workload == "wordcount":
        return source.select(ip).groupBy("ip").count(), "update"
    if workload == "fixwindow":
        rows = source.select(ip, F.col("key")).withWatermark("key", "0 seconds")
        agg = rows.groupBy(F.window("key", f"{WINDOW_S} seconds"), "ip").agg(
            F.count(F.lit(1)).alias("count"), F.min("key").alias("first"))
        return agg.select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"),
                          "ip", "count", "first"), "append"
    raise ValueError(f"unknown workload {workload!r}")


def to_dataframe(spark, batch: pa.RecordBatch):
    """A (static) Spark DataFrame of generated records."""
    return spark.createDataFrame(pa.Table.from_batches([batch]).to_pandas())


@dataclass
class FileLog:
    """Files written into the input directory: name -> (arrival ns, rows, first key, last key)."""

    files: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)
    flush: str | None = None
    keys: list[np.ndarray] = field(default_factory=list)  # every data row's key, in row order


def _write(directory: Path, name: str, batch: pa.RecordBatch) -> int:
    tmp = directory / f".{name}.tmp"
    pq.write_table(pa.Table.from_batches([batch]), tmp, compression="snappy")
    os.replace(tmp, directory / name)
    return time.time_ns()


def flush_batch(last_key_us: int, gen: UserVisits) -> pa.RecordBatch:
    """One record of the reserved IP, one window past ``last_key_us``: closes every open window."""
    value = FLUSH_IP + gen.values(0, 1)[0].as_py()[len(gen.source_ips(0, 1)[0].as_py()):]
    return pa.RecordBatch.from_arrays([pa.array([last_key_us + WINDOW_S * 1_000_000], pa.timestamp("us")),
                                       pa.array([value])], schema=RECORD_SCHEMA)


def write_files(directory: Path, gen: UserVisits, events: int, start_us: int, rate: float,
                rows_per_file: int = 262_144, log: FileLog | None = None) -> FileLog:
    """All ``events`` records at once (keys spaced for ``rate``), plus the closing flush file."""
    log = log or FileLog()
    directory.mkdir(parents=True, exist_ok=True)
    last = start_us
    for i, start in enumerate(range(0, events, rows_per_file)):
        n = min(rows_per_file, events - start)
        b = gen.records(start, n, start_us=start_us, rate=rate)
        keys = b.column("key").cast(pa.int64()).to_numpy()
        name = f"part-{i:06d}.parquet"
        log.files[name] = (_write(directory, name, b), n, int(keys[0]), int(keys[-1]))
        log.keys.append(keys)
        last = int(keys[-1])
    log.flush = f"part-{len(log.files):06d}.parquet"
    log.files[log.flush] = (_write(directory, log.flush, flush_batch(last, gen)), 1, last + WINDOW_S * 10**6,
                            last + WINDOW_S * 10**6)
    return log


class FileFeeder(threading.Thread):
    """Writes the records due in each ``interval_s`` as one file, open loop at ``rate``."""

    def __init__(self, directory: Path, gen: UserVisits, events: int, rate: float, interval_s: float = 0.2):
        super().__init__(daemon=True)
        self.directory, self.gen, self.events, self.rate = directory, gen, events, rate
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
            sent, j, last = 0, 0, t0
            while sent < self.events:
                n = min(rows, self.events - sent)
                base = t0 + j * dt_us
                keys = base + (np.arange(n, dtype=np.int64) * dt_us) // rows
                wait = (base + dt_us) * 1000 - time.time_ns()
                if wait > 0:
                    time.sleep(wait / 1e9)
                b = pa.RecordBatch.from_arrays([pa.array(keys, pa.timestamp("us")), self.gen.values(sent, n)],
                                               schema=RECORD_SCHEMA)
                name = f"part-{j:06d}.parquet"
                self.log.files[name] = (_write(self.directory, name, b), n, int(keys[0]), int(keys[-1]))
                self.log.keys.append(keys)
                last = int(keys[-1])
                sent += n
                j += 1
            self.log.flush = f"part-{j:06d}.parquet"
            fb = flush_batch(last, self.gen)
            self.log.files[self.log.flush] = (_write(self.directory, self.log.flush, fb), 1,
                                              last + WINDOW_S * 10**6, last + WINDOW_S * 10**6)
        except BaseException as e:  # reported by the caller
            self.error = e


def batch_files(checkpoint: Path) -> dict[str, int]:
    """File name -> micro-batch id, from the file source's log in the checkpoint."""
    out: dict[str, int] = {}
    d = checkpoint / "sources" / "0"
    if not d.exists():
        return out
    for f in sorted(d.iterdir()):
        if f.name.startswith("."):
            continue
        for line in f.read_text().splitlines()[1:]:
            if line.strip():
                e = json.loads(line)
                out[Path(e["path"]).name] = int(e["batchId"])
    return out


def _ts_ns(text: str) -> int:
    t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return int(t.timestamp() * 1e9)


def _watermark_us(p: dict) -> int | None:
    w = (p.get("eventTime") or {}).get("watermark")
    return None if w is None else _ts_ns(w) // 1000


@dataclass
class SparkRun:
    workload: str
    events: int
    t_start: int
    batches: list[dict]          # progress events, in order
    files: dict[str, int]        # file -> batch id
    log: FileLog
    rate: float | None = None
    window_rows: dict[int, int] = field(default_factory=dict)  # fixwindow: window end (us) -> result rows


def run_query(spark, workload: str, gen: UserVisits, events: int, rate: float | None, workdir: Path,
              instances: int = 2, timeout_s: float = 600.0, progress=None) -> SparkRun:
    """Run ``workload`` on Spark over ``events`` records: pre-written files when ``rate`` is None
    (as fast as Spark reads them), else fed at ``rate`` while the query runs."""
    inp, ckpt = workdir / "input", workdir / "checkpoint"
    for d in (inp, ckpt):
        shutil.rmtree(d, ignore_errors=True)
    inp.mkdir(parents=True)
    gen.values(0, min(events, gen.cycle))  # render the cached cycle before the clock starts
    feeder = None
    if rate is None:
        log = write_files(inp, gen, events, start_us=time.time_ns() // 1000, rate=1e6)
    else:
        log = FileLog()
    source = spark.readStream.schema(_spark_schema()).parquet(str(inp))
    df, mode = workload_df(spark, workload, source, instances)
    gc.freeze()  # as the sparkcep driver does (:mod:`sparkcep.bench.driver`): no full collection pauses the feeder
    t_start = time.time_ns()
    q = (df.writeStream.format("noop").outputMode(mode).option("checkpointLocation", str(ckpt))
         .queryName(f"bench_{workload}_{os.getpid()}_{t_start}").start())
    if rate is not None:
        feeder = FileFeeder(inp, gen, events, rate)
        feeder.start()
        log = feeder.log
    expected = events + 1
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if feeder is not None and feeder.error is not None:
                raise feeder.error
            ex = q.exception()
            if ex is not None:
                raise RuntimeError(f"Spark query {workload} failed: {ex}")
            done_rows = sum(_as_dict(p)["numInputRows"] for p in q.recentProgress)
            if progress is not None:
                progress(min(done_rows, events))
            if done_rows >= expected and (feeder is None or not feeder.is_alive()):
                if workload != "fixwindow" or _windows_flushed([_as_dict(p) for p in q.recentProgress], log):
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"Spark {workload}: {done_rows} of {expected} rows after {timeout_s:.0f} s")
            time.sleep(0.05)
    finally:
        q.stop()
    if feeder is not None:
        feeder.join()
        t_start = feeder.start_ns
    batches = [_as_dict(p) for p in q.recentProgress]
    run = SparkRun(workload, events, t_start, batches, batch_files(ckpt), log, rate)
    if workload == "fixwindow":
        run.window_rows = window_rows(np.concatenate(log.keys), gen.ip_index(0, events))
    return run


def window_rows(keys_us: np.ndarray, ip_index: np.ndarray) -> dict[int, int]:
    """Window end (us) -> distinct IPs in that 10 s window: the rows fixwindow emits for it."""
    w_us = WINDOW_S * 1_000_000
    ends = (keys_us // w_us + 1) * w_us
    pairs = np.unique(np.stack([ends, ip_index]), axis=1)
    e, n = np.unique(pairs[0], return_counts=True)
    return dict(zip(e.tolist(), n.tolist()))


def _as_dict(p) -> dict:
    """A progress event as plain JSON data (PySpark 4 gives objects that are also dict-like)."""
    j = getattr(p, "json", None)
    if isinstance(j, str):
        return json.loads(j)
    return json.loads(json.dumps(dict(p), default=str))


def _windows_flushed(progress: list[dict], log: FileLog) -> bool:
    if log.flush is None:
        return False
    last_data = max(v[3] for k, v in log.files.items() if k != log.flush)
    wm = [_watermark_us(p) for p in progress]
    return any(w is not None and w > last_data for w in wm)


def _spark_schema():
    from pyspark.sql.types import StringType, StructField, StructType, TimestampType
    return StructType([StructField("key", TimestampType()), StructField("value", StringType())])


def latencies(run: SparkRun) -> tuple[np.ndarray, np.ndarray]:
    """(latency ns, time out ns) per output row (stateless, wordcount: per input record)."""
    ends, wms = {}, {}
    for p in run.batches:
        b = int(p["batchId"])
        ends[b] = _ts_ns(p["timestamp"]) + int(p["durationMs"].get("triggerExecution", 0)) * 1_000_000
        wms[b] = _watermark_us(p)
    lat, when = [], []
    if run.workload != "fixwindow":
        for name, batch in run.files.items():
            if name == run.log.flush or name not in run.log.files or batch not in ends:
                continue
            arrival, rows, _, _ = run.log.files[name]
            lat.append(np.full(rows, ends[batch] - arrival, np.int64))
            when.append(np.full(rows, ends[batch], np.int64))
    else:
        # windows, one per (window end, ip): rows per window end from the data's keys
        data = sorted((v[2], v[3], v[0]) for k, v in run.log.files.items() if k != run.log.flush)
        lasts = np.array([d[1] for d in data], np.int64)
        arrivals = np.array([d[2] for d in data], np.int64)
        flush = run.log.files[run.log.flush][0]
        first_key, last_key = data[0][0], data[-1][1]
        w_us = WINDOW_S * 1_000_000
        order = sorted(b for b in ends if wms.get(b) is not None)
        for wend in range((first_key // w_us + 1) * w_us, (last_key // w_us + 2) * w_us, w_us):
            k = int(np.searchsorted(lasts, wend, side="left"))
            arrival = arrivals[k] if k < len(lasts) else flush
            out_b = next((b for b in order if wms[b] >= wend), None)
            if out_b is None:
                continue
            n = run.window_rows.get(wend, 0)
            lat.append(np.full(n, ends[out_b] - arrival, np.int64))
            when.append(np.full(n, ends[out_b], np.int64))
    if not lat:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(lat), np.concatenate(when)


def summarize(run: SparkRun, lat) -> dict:
    from sparkcep.bench.metrics import percentiles_ms
    last_end = max((_ts_ns(p["timestamp"]) + int(p["durationMs"].get("triggerExecution", 0)) * 1_000_000
                    for p in run.batches if p["numInputRows"] > 0), default=run.t_start)
    elapsed = (last_end - run.t_start) / 1e9
    return {"events": run.events, "output_rows": int(sum(p.get("sink", {}).get("numOutputRows", 0) or 0
                                                         for p in run.batches)),
            "seconds": elapsed, "throughput": run.events / elapsed if elapsed > 0 else float("nan"),
            "offered_rate": run.rate, "batches": len(run.batches), "latency_ms": percentiles_ms(lat[0])}


def cleanup(workdir: Path) -> None:
    shutil.rmtree(workdir, ignore_errors=True)


def workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="sparkcep-bench-spark-"))
