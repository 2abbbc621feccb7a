"""Spark source -> sparkcep query -> Spark sink to Parquet, as a spark-submit job.

    spark-submit --master "local[2]" examples/spark_submit_job.py --output /tmp/fixwindow-out

1. HiBench ``uservisits`` records (generated, :mod:`sparkcep.bench.generator`)
   land as Parquet files in ``--input`` (made when the directory is empty);
2. Spark reads them as a stream, one file per micro-batch, and writes them
   into the engine's input stream ``uservisits`` through ``format("upmcep")``;
3. the engine (in this driver process) runs HiBench fixwindow: count and
   first time per IP over 10 s tumbling windows;
4. Spark reads the output stream ``fixwindow`` back through ``format("upmcep")``
   and writes it to Parquet in ``--output``, exactly once per row.

``pyspark_upmcep`` registers the source by itself: there is no
``spark.dataSource.register`` call. Both streaming queries use
``availableNow`` triggers, so the job ends when the input is consumed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

import sparkcep as cep
from sparkcep.arguments import bounded
from sparkcep.bench import workloads
from sparkcep.bench.generator import MAX_IPS, UserVisits

T0_US = 1_704_067_200_000_000  # 2024-01-01 00:00:00 UTC
MAX_EVENTS = 50_000_000  # made a file at a time: 200 bytes a record


def make_input(directory: Path, events: int, files: int, rate: float, ips: int, seed: int) -> None:
    """``files`` Parquet files of HiBench records, keys ``rate`` records/s apart, in file-name order."""
    directory.mkdir(parents=True, exist_ok=True)
    gen = UserVisits(seed=seed, distinct_ips=ips)
    per = -(-events // files)
    for k, start in enumerate(range(0, events, per)):
        batch = gen.records(start, min(per, events - start), start_us=T0_US, rate=rate)
        pq.write_table(pa.Table.from_batches([batch]), directory / f"uservisits-{k:04d}.parquet")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Spark -> sparkcep fixwindow -> Parquet")
    ap.add_argument("--output", required=True, help="Parquet directory of the fixwindow results")
    ap.add_argument("--input", default=None, help="Parquet directory of input records (generated if empty)")
    ap.add_argument("--checkpoints", default=None, help="checkpoint directory (default: a temporary one)")
    ap.add_argument("--events", type=bounded(int, 1, MAX_EVENTS), default=200_000)
    ap.add_argument("--files", type=bounded(int, 1, 10_000), default=4)
    ap.add_argument("--rate", type=bounded(float, 1), default=10_000, help="records/s of event time in the input")
    ap.add_argument("--ips", type=bounded(int, 1, MAX_IPS), default=100)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="sparkcep-job-"))
    inp = Path(a.input) if a.input else work / "input"
    if not inp.exists() or not any(inp.glob("*.parquet")):
        make_input(inp, a.events, a.files, a.rate, a.ips, a.seed)
    ck = Path(a.checkpoints) if a.checkpoints else work / "checkpoints"

    spark = SparkSession.builder.appName("sparkcep-fixwindow").config("spark.sql.session.timeZone", "UTC") \
        .getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    with cep.Engine.local() as engine:
        engine.deploy(workloads.query("fixwindow"))

        records = spark.readStream.schema("key TIMESTAMP, value STRING").option("maxFilesPerTrigger", 1) \
            .parquet(str(inp))
        into_engine = (records.writeStream.format("upmcep").option("stream", workloads.STREAM)
                       .option("checkpointLocation", str(ck / "into-engine")).trigger(availableNow=True).start())
        into_engine.awaitTermination()
        engine.end(workloads.STREAM)  # the input is finite: close the last windows

        results = spark.readStream.format("upmcep").option("stream", "fixwindow").load()
        to_parquet = (results.writeStream.format("parquet").option("path", a.output)
                      .option("checkpointLocation", str(ck / "to-parquet")).trigger(availableNow=True).start())
        to_parquet.awaitTermination()
        metrics = engine.metrics()

    out = spark.read.parquet(a.output)
    print(f"engine: {metrics['sequence']:,} records in, {metrics['outputs']['fixwindow']:,} window results out")
    print(f"{out.count():,} rows written to {a.output}")
    out.orderBy("window_start", "ip").select("window_start", "window_end", "ip", "count", "first").show(5, False)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
