"""Rows/s through ``format("upmcep")`` into Spark's noop sink, beside Spark's own rate source.

    python benchmarks/spark_source.py                 # 16M rows in 2M-row micro-batches, local[2]
    python benchmarks/spark_source.py --rows 4000000 --batch 1000000

Both sides run in the same Spark session, the same way: a streaming query
into the ``noop`` sink, fixed rows per micro-batch (``maxRecordsPerTrigger``
for upmcep, ``rate-micro-batch``'s ``rowsPerBatch`` for Spark), two columns
(a timestamp and a long). The engine's output log is filled before the timed
run (an identity query), so the figure is the Spark source path: Spark's
planning, the Python workers reading Arrow from the engine's loopback
endpoint, and the hand-over to the JVM. Throughput = rows / time of the
micro-batches after the first (warm-up) one, from Spark's progress reports.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

try:
    import sparkcep as cep
except ModuleNotFoundError:  # a source checkout without install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import sparkcep as cep

from sparkcep.arguments import bounded

MAX_ROWS = 10 ** 8  # sent to the engine before the timed run, a million at a time
MAX_BATCH = 10 ** 7  # rows of a micro-batch, in Spark's Python workers and JVM at once


def measure(query, batches: int) -> dict:
    """Rows/s of micro-batches 2..n of a started streaming query (stops it after ``batches`` batches)."""
    deadline = time.monotonic() + 600
    while len([p for p in query.recentProgress if p["numInputRows"] > 0]) < batches and query.isActive:
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if query.isActive:
        query.stop()
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0][:batches]
    timed = progress[1:] or progress
    rows = sum(p["numInputRows"] for p in timed)
    secs = sum(p["durationMs"]["triggerExecution"] for p in timed) / 1e3
    return {"batches": len(timed), "rows": rows, "seconds": secs, "rows_per_s": rows / secs if secs else 0.0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=bounded(int, 1, MAX_ROWS), default=16_000_000, help="rows the engine output holds")
    ap.add_argument("--batch", type=bounded(int, 1, MAX_BATCH), default=2_000_000, help="rows per micro-batch")
    ap.add_argument("--master", default="local[2]")
    a = ap.parse_args(argv)
    batches = max(a.rows // a.batch, 2)

    os.environ.setdefault("SPARKCEP_HOME", tempfile.mkdtemp(prefix="sparkcep-bench-"))
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(a.master).appName("sparkcep-spark-source-bench")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("OFF")  # stopping the endless rate query mid-batch logs aborts

    with cep.Engine.local() as engine:
        q = cep.Query("bench")
        s = q.stream("events", "timestamp timestamp, value int64")
        q.output("rows", s.map(timestamp="timestamp", value="value", name="copy"))
        engine.deploy(q)
        t = time.perf_counter()
        chunk = 1_000_000
        for start in range(0, batches * a.batch, chunk):
            n = min(chunk, batches * a.batch - start)
            v = np.arange(start, start + n, dtype=np.int64)
            engine.send("events", pa.table({"timestamp": pa.array(v * 1000, pa.timestamp("us")), "value": v}))
        fill = time.perf_counter() - t
        total = engine.outputs["rows"].retained
        print(f"engine output filled: {total:,} rows in {fill:.1f} s ({total / fill:,.0f} rows/s, in-process)")

        with tempfile.TemporaryDirectory() as ck:
            ours = (spark.readStream.format("upmcep").option("engine", engine.endpoint.address)
                    .option("stream", "rows").option("maxRecordsPerTrigger", a.batch).load()
                    .writeStream.format("noop").option("checkpointLocation", os.path.join(ck, "ours"))
                    .trigger(processingTime="0 seconds").start())
            upm = measure(ours, batches)
            rate = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", a.batch)
                    .option("numPartitions", 2).load()
                    .writeStream.format("noop").option("checkpointLocation", os.path.join(ck, "rate"))
                    .trigger(processingTime="0 seconds").start())
            spark_rate = measure(rate, batches)
    spark.stop()

    print(f"\n{a.master}, {a.batch:,} rows per micro-batch, noop sink, first batch not timed")
    print(f"{'source':<28}{'batches':>8}{'rows':>14}{'seconds':>10}{'rows/s':>14}")
    for name, r in (("upmcep (engine output log)", upm), ("rate-micro-batch (Spark)", spark_rate)):
        print(f"{name:<28}{r['batches']:>8}{r['rows']:>14,}{r['seconds']:>10.2f}{r['rows_per_s']:>14,.0f}")
    ratio = upm["rows_per_s"] / spark_rate["rows_per_s"] if spark_rate["rows_per_s"] else float("nan")
    print(f"upmcep / rate = {ratio:.2f}   (target: upmcep >= 1,000,000 rows/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
