"""Spark -> engine -> Spark: rows written through the sink come back through the query and
the source exactly as the in-process engine computes them (acceptance 1)."""

from __future__ import annotations

import pyarrow as pa
from chispa import assert_df_equality
from spark_harness import SPARK_DDL, connections, demo_query, reference, spark_df, write_files

PER_IP = ["window_start", "window_end", "ip", "n", "total", "first"]


def test_sink_query_source_equals_in_process_engine(spark, engine, tmp_path):
    chunks = [connections(400, start=k * 400) for k in range(5)]  # 200 s of events, in order
    write_files(tmp_path / "in", chunks)
    engine.deploy(demo_query(), parallelism=2)  # per_ip and all: 2 output partitions
    address = engine.endpoint.address

    # Spark source -> engine input stream, one file per micro-batch (so the engine sees them in order)
    events = spark.readStream.schema(SPARK_DDL).option("maxFilesPerTrigger", 1).parquet(str(tmp_path / "in"))
    sink = (events.writeStream.format("upmcep").option("engine", address).option("stream", "connections")
            .option("checkpointLocation", str(tmp_path / "ck-in")).trigger(availableNow=True).start())
    sink.awaitTermination(120)
    assert sink.exception() is None
    engine.end("connections")

    # engine output -> Spark, streaming, into a memory table
    per_ip = spark.readStream.format("upmcep").option("engine", address).option("stream", "per_ip") \
        .option("includeMetadata", "true").load()
    q = (per_ip.writeStream.format("memory").queryName("roundtrip_per_ip")
         .option("checkpointLocation", str(tmp_path / "ck-out")).trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None
    got = spark.table("roundtrip_per_ip")

    want = reference(chunks, parallelism=2)
    assert want["per_ip"].num_rows > 0
    assert_df_equality(got.select(*PER_IP), spark_df(spark, want["per_ip"], PER_IP),
                       ignore_row_order=True, ignore_nullable=True)
    # the engine's own result is the same as well: nothing lost or added on the way in
    assert_df_equality(spark_df(spark, engine.collect("per_ip"), PER_IP), spark_df(spark, want["per_ip"], PER_IP),
                       ignore_row_order=True, ignore_nullable=True)

    # metadata columns: partitions of the deployed window operator, positions 0.. in each
    meta = got.groupBy("_partition").agg({"_offset": "max", "*": "count"}).collect()
    assert {r["_partition"] for r in meta} <= {0, 1}
    assert all(r["max(_offset)"] == r["count(1)"] - 1 for r in meta)

    # batch read of another output: every retained row
    big = spark.read.format("upmcep").option("engine", address).load("big")
    assert_df_equality(big.select("ip", "ts", "bytes"), spark_df(spark, want["big"], ["ip", "ts", "bytes"]),
                       ignore_row_order=True, ignore_nullable=True)
    every = pa.concat_tables(chunks)
    assert spark.read.format("upmcep").option("engine", address).load("all").count() == every.num_rows
