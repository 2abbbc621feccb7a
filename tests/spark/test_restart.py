"""Exactly once across restarts (acceptance 2).

* a source query stopped mid-stream and restarted from its checkpoint: the
  Parquet sink holds every row of the output once;
* a sink query stopped mid-stream and restarted: the engine ingested every row once;
* a sink micro-batch that fails after one of its tasks staged its rows leaves
  no trace, and is taken exactly once when replayed after a restart.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from spark_harness import SPARK_DDL, connections, demo_query, spark_df, wait_for, write_files
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F
from pyspark.sql.types import LongType

COLS = ["ip", "ts", "bytes"]


def _batches_done(q) -> int:
    return sum(1 for p in q.recentProgress if p["numInputRows"] > 0)


def test_source_restart_from_checkpoint_every_row_once(spark, engine, tmp_path):
    engine.deploy(demo_query(), parallelism=2)
    sent = [connections(500, start=k * 500) for k in range(8)]
    for c in sent:
        engine.send("connections", c)
    address, out, ck = engine.endpoint.address, str(tmp_path / "out"), str(tmp_path / "ck")

    def start(trigger):
        df = (spark.readStream.format("upmcep").option("engine", address).option("stream", "all")
              .option("maxRecordsPerTrigger", 1000).option("includeMetadata", "true").load())
        return df.writeStream.format("parquet").option("path", out).option("checkpointLocation", ck) \
            .trigger(**trigger).start()

    q = start({"processingTime": "0 seconds"})
    wait_for(lambda: _batches_done(q) >= 2, 120, "two micro-batches")
    q.stop()  # mid-stream: 4000 rows at 1000 per batch
    assert 0 < spark.read.parquet(out).count() < 4000
    more = [connections(500, start=4000 + k * 500) for k in range(2)]
    for c in more:
        engine.send("connections", c)
    released = engine.outputs["all"].earliest()

    q = start({"availableNow": True})
    q.awaitTermination(180)
    assert q.exception() is None
    got = spark.read.parquet(out)
    assert max(p["numInputRows"] for p in q.recentProgress) <= 1000
    every = pa.concat_tables(sent + more)
    assert got.count() == every.num_rows
    assert got.select("_partition", "_offset").distinct().count() == every.num_rows
    assert_df_equality(got.select(*COLS), spark_df(spark, every, COLS), ignore_row_order=True, ignore_nullable=True)
    # committed rows were released: the first run's commits freed something, and the restarted run's more
    # (it commits as the consumer its checkpoint names: a new one would leave the first holding the rest)
    assert sum(released.values()) > 0
    assert sum(engine.outputs["all"].earliest().values()) > sum(released.values())


def test_sink_restart_from_checkpoint_every_row_once(spark, engine, tmp_path):
    engine.deploy(demo_query())
    chunks = [connections(300, start=k * 300) for k in range(8)]
    write_files(tmp_path / "in", chunks)
    address, ck = engine.endpoint.address, str(tmp_path / "ck")

    def start(trigger):
        events = spark.readStream.schema(SPARK_DDL).option("maxFilesPerTrigger", 1).parquet(str(tmp_path / "in"))
        return (events.writeStream.format("upmcep").option("engine", address).option("stream", "connections")
                .option("checkpointLocation", ck).trigger(**trigger).start())

    q = start({"processingTime": "0 seconds"})
    wait_for(lambda: _batches_done(q) >= 2, 120, "two micro-batches")
    q.stop()
    assert 0 < engine.collect("all").num_rows < 2400
    q = start({"availableNow": True})
    q.awaitTermination(180)
    assert q.exception() is None
    assert_df_equality(spark_df(spark, engine.collect("all"), COLS), spark_df(spark, pa.concat_tables(chunks), COLS),
                       ignore_row_order=True, ignore_nullable=True)


def test_failed_sink_batch_leaves_no_trace_and_its_replay_is_taken_once(spark, engine, tmp_path):
    """Batch 1 has two tasks; task 1 fails once, after task 0 staged its rows in the engine."""
    engine.deploy(demo_query())
    chunks = [connections(300, start=k * 300) for k in range(3)]
    write_files(tmp_path / "in", chunks)
    armed, go = tmp_path / "armed", tmp_path / "go"
    armed.touch()
    address, ck = engine.endpoint.address, str(tmp_path / "ck")
    armed_s, go_s = str(armed), str(go)

    def fail_once(b):
        import os
        import time
        from pyspark import TaskContext

        tc = TaskContext.get()
        if tc.partitionId() == 1 and tc.getLocalProperty("streaming.sql.batchId") == "1" and os.path.exists(armed_s):
            deadline = time.time() + 60
            while not os.path.exists(go_s) and time.time() < deadline:
                time.sleep(0.05)
            os.remove(armed_s)
            raise RuntimeError("injected failure after task 0 of batch 1 was ingested")
        return b

    def start(trigger):
        events = spark.readStream.schema(SPARK_DDL).option("maxFilesPerTrigger", 1).parquet(str(tmp_path / "in"))
        events = events.repartition(2, "ip").withColumn("bytes", F.udf(fail_once, LongType())("bytes"))
        return (events.writeStream.format("upmcep").option("engine", address).option("stream", "connections")
                .option("checkpointLocation", ck).trigger(**trigger).start())

    q = start({"availableNow": True})
    staging = engine.endpoint.staging
    wait_for(lambda: staging.staged(q.id, 1).get(0), 120, "task 0 of batch 1 staged")
    go.touch()
    with pytest.raises(StreamingQueryException, match="injected failure"):
        q.awaitTermination(120)
    assert engine.collect("all").num_rows == 300  # batch 0 only: nothing of batch 1
    assert staging.staged(q.id, 1) == {}  # aborted

    q = start({"availableNow": True})  # replays batch 1 with the same rows, then batch 2
    q.awaitTermination(120)
    assert q.exception() is None
    assert_df_equality(spark_df(spark, engine.collect("all"), COLS), spark_df(spark, pa.concat_tables(chunks), COLS),
                       ignore_row_order=True, ignore_nullable=True)
