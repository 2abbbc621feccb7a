"""What the README's Spark guarantees say, through Spark (issue 16).

* a time-ordered Parquet directory written with default options (one
  micro-batch of several partitions) gives exactly the pandas reference,
  no event late;
* a micro-batch with one failing partition leaves no trace;
* a query restarted from its checkpoint against another engine run or
  another deployment of its output fails, naming both;
* a streaming reader registers its consumer when the query starts, and
  each query reads as its own consumer unless told to share one;
* a mistaken sink fails before any row is written.
"""

from __future__ import annotations

import threading

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from chispa import assert_df_equality
from pyspark.errors import StreamingQueryException
from spark_harness import SPARK_DDL, T0, connections, demo_query, spark_df, write_files

import sparkcep as cep
from sparkcep.spark.connection import Target
from sparkcep.spark.options import SourceOptions
from sparkcep.spark.reader import StreamReader

S = 1_000_000
COLS = ["ip", "ts", "bytes"]


def _tumbling() -> cep.Query:
    q = cep.Query("tumbling")
    s = q.stream("connections", "ip string, ts timestamp, bytes int64")
    q.output("per_ip", s.aggregate(cep.TimeWindow("10s"), by=["ip"], name="window", n=cep.count(),
                                   total=cep.sum("bytes")))
    return q


def _events(n: int, seconds: int, ips: int = 800, seed: int = 7) -> pa.Table:
    """``n`` events in time order over ``seconds`` of event time."""
    rng = np.random.default_rng(seed)
    i = np.arange(n, dtype=np.int64)
    return pa.table({"ip": pa.array([f"10.1.0.{k}" for k in rng.integers(0, ips, n)]),
                     "ts": pa.array(T0 + i * seconds * S // n, pa.timestamp("us", tz="UTC")),
                     "bytes": pa.array(rng.integers(0, 1000, n), pa.int64())})


def _pandas_windows(events: pa.Table) -> pd.DataFrame:
    """10 s tumbling count and sum per IP: the reference, in pandas."""
    df = events.drop_columns(["ts"]).to_pandas()
    df["window_start"] = events.column("ts").cast(pa.int64()).to_numpy() // (10 * S) * (10 * S)
    out = df.groupby(["window_start", "ip"]).agg(n=("bytes", "size"), total=("bytes", "sum")).reset_index()
    return out.sort_values(["window_start", "ip"]).reset_index(drop=True)


def _run_to_end(q, timeout=180):
    q.awaitTermination(timeout)
    assert q.exception() is None, q.exception()


def test_time_ordered_parquet_default_options_gives_the_reference(spark, engine, tmp_path):
    """50,000 events, 5 files, 60 s of event time into a 10 s tumbling aggregate: 30,000 were late before."""
    events = _events(50_000, 60)
    chunks = [events.slice(k * 10_000, 10_000) for k in range(5)]
    write_files(tmp_path / "in", chunks)
    engine.deploy(_tumbling())
    a = engine.endpoint.address
    src = spark.readStream.schema(SPARK_DDL).parquet(str(tmp_path / "in"))  # default options
    _run_to_end(src.writeStream.format("upmcep").option("engine", a).option("stream", "connections")
                .option("checkpointLocation", str(tmp_path / "ck-in")).trigger(availableNow=True).start())
    engine.end("connections")
    assert engine.metrics()["late"]["tumbling"] == {"window": 0}

    back = spark.readStream.format("upmcep").option("engine", a).option("stream", "per_ip").load()
    _run_to_end(back.writeStream.format("memory").queryName("tumbling_back")
                .option("checkpointLocation", str(tmp_path / "ck-out")).trigger(availableNow=True).start())
    got = spark.table("tumbling_back").select("window_start", "ip", "n", "total").toPandas()
    got["window_start"] = got["window_start"].astype("datetime64[us]").astype("int64")
    got = got.sort_values(["window_start", "ip"]).reset_index(drop=True)
    want = _pandas_windows(events)
    assert len(want) > 4000
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    counters = engine.endpoint.counters
    assert counters["committed_partitions"] > counters["batch_commits"]  # several partitions per micro-batch


def test_micro_batch_with_a_failing_partition_leaves_no_trace(spark, engine, tmp_path):
    """A null event time in one of two partitions: the other partition's rows stayed in before."""
    engine.deploy(demo_query())
    good = connections(200)
    ts = good.column("ts").to_pylist()
    ts[150] = None
    bad = good.set_column(1, "ts", pa.array(ts, pa.timestamp("us", tz="UTC")))
    (tmp_path / "in").mkdir()
    pq.write_table(bad, tmp_path / "in" / "part-0.parquet")
    src = spark.readStream.schema(SPARK_DDL).parquet(str(tmp_path / "in")).repartition(2)
    q = (src.writeStream.format("upmcep").option("engine", engine.endpoint.address).option("stream", "connections")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    with pytest.raises(StreamingQueryException, match=r"\[UPMCEP_NULL_TIME\].*'ts'"):
        q.awaitTermination(180)
    assert engine.metrics()["sequence"] == 0 and engine.collect("all").num_rows == 0
    assert engine.endpoint.staging.rows == 0  # the abort dropped what the tasks staged


def test_restart_against_another_engine_or_deployment_is_refused(spark, sparkcep_home, tmp_path):
    """Engine 1 produced 100 rows, read and checkpointed; engine 2 produced 150: 100 were skipped silently."""
    ck = str(tmp_path / "ck")

    def run(address):
        df = spark.readStream.format("upmcep").option("engine", address).option("stream", "all").load()
        return (df.writeStream.format("parquet").option("path", str(tmp_path / "out"))
                .option("checkpointLocation", ck).trigger(availableNow=True).start())

    with cep.Engine.local() as e1:
        e1.deploy(demo_query())
        e1.send("connections", connections(100))
        _run_to_end(run(e1.endpoint.address))
        first = e1.run_id
    with cep.Engine.local() as e2:
        e2.deploy(demo_query())
        e2.send("connections", connections(150))
        q = run(e2.endpoint.address)
        with pytest.raises(StreamingQueryException, match=rf"\[UPMCEP_OFFSET_ENGINE\].*{first}.*{e2.run_id}"):
            q.awaitTermination(180)
        assert spark.read.parquet(str(tmp_path / "out")).count() == 100

        ck = str(tmp_path / "ck2")
        _run_to_end(run(e2.endpoint.address))
        e2.undeploy("demo")
        e2.deploy(demo_query())
        e2.send("connections", connections(10))
        with pytest.raises(StreamingQueryException, match=r"\[UPMCEP_OFFSET_DEPLOYMENT\].*'demo#1'.*'demo#2'"):
            run(e2.endpoint.address).awaitTermination(180)


def test_stream_reader_registers_its_consumer_when_created(engine):
    """Spark builds the reader when the query starts; from then on no other consumer releases its rows."""
    engine.deploy(demo_query())
    engine.send("connections", connections(30))
    opts = SourceOptions.parse({"stream": "all", "consumer": "dashboard"})
    StreamReader(Target(engine.endpoint.address), opts, None)
    engine.outputs["all"].commit({0: 30}, "other")
    assert engine.collect("all").num_rows == 30


def test_each_stream_reader_is_its_own_consumer_and_keeps_it_across_a_restart(engine):
    """Default options: one reader's commit releases no row another has not read; a reader restarted from its
    checkpointed offset commits as the consumer that offset names."""
    engine.deploy(demo_query())
    engine.send("connections", connections(30))
    target, opts = Target(engine.endpoint.address), SourceOptions.parse({"stream": "all"})
    a, b = StreamReader(target, opts, None), StreamReader(target, opts, None)
    start_a, start_b = a.initialOffset(), b.initialOffset()
    assert start_a["consumer"] != start_b["consumer"]
    a.commit(a.latestOffset(start_a))
    assert engine.collect("all").num_rows == 30  # b has read nothing
    restarted = StreamReader(target, opts, None)  # b, restarted from its checkpoint
    restarted.commit(restarted.latestOffset(start_b))
    assert engine.collect("all").num_rows == 0  # every consumer passed every row: no other consumer was made


def test_two_queries_with_default_options_each_read_every_row(spark, engine, tmp_path):
    """Query B is held in its first micro-batch while query A reads everything and commits; B then reads on
    (with one consumer shared by default, A's commits released B's rows: B failed with OFFSET_RELEASED)."""
    engine.deploy(demo_query(), parallelism=2)
    sent = connections(1000)
    engine.send("connections", sent)
    a = engine.endpoint.address
    held, go = threading.Event(), threading.Event()
    b_out = str(tmp_path / "b")

    def hold_first(batch, batch_id):  # runs in this process, on B's query thread
        batch.write.mode("append").parquet(b_out)
        held.set()
        go.wait(180)

    def source():
        return spark.readStream.format("upmcep").option("engine", a).option("stream", "all") \
            .option("maxRecordsPerTrigger", 200).load()

    qb = source().writeStream.foreachBatch(hold_first).option("checkpointLocation", str(tmp_path / "ck-b")) \
        .trigger(availableNow=True).start()
    try:
        assert held.wait(180), "query B did not run its first micro-batch"
        _run_to_end(source().writeStream.format("memory").queryName("every_row_a")
                    .option("checkpointLocation", str(tmp_path / "ck-a")).trigger(availableNow=True).start())
        assert sum(engine.outputs["all"].earliest().values()) == 0  # B holds every row it has not read
    finally:
        go.set()
    _run_to_end(qb)
    want = spark_df(spark, sent, COLS)
    assert_df_equality(spark.table("every_row_a"), want, ignore_row_order=True, ignore_nullable=True)
    assert_df_equality(spark.read.parquet(b_out).select(*COLS), want, ignore_row_order=True, ignore_nullable=True)


def test_sink_mistakes_fail_the_query_before_any_row_is_written(spark, engine, tmp_path):
    """start() runs no Python of the data source (PySpark 4.3); the first micro-batch's planning does."""
    engine.deploy(demo_query())
    write_files(tmp_path / "in", [connections(50)])
    a = engine.endpoint.address
    events = spark.readStream.schema(SPARK_DDL).parquet(str(tmp_path / "in"))
    cases = [({"stream": "all"}, events, "NOT_WRITABLE"),
             ({}, events, "OPTION"),
             ({"stream": "connections"}, events.withColumn("extra", events.bytes), "SCHEMA"),
             ({"stream": "connections", "startingOffsets": "latest"}, events, "OPTION")]
    for k, (options, df, code) in enumerate(cases):
        w = df.writeStream.format("upmcep").option("engine", a).option("checkpointLocation", str(tmp_path / f"ck{k}"))
        for key, value in options.items():
            w = w.option(key, value)
        q = w.trigger(availableNow=True).start()
        with pytest.raises(StreamingQueryException, match=rf"\[UPMCEP_{code}\]"):
            q.awaitTermination(180)
        assert engine.metrics()["sequence"] == 0
