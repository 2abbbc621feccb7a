"""The upmcep source: clear errors at load(), options, batch reads, $metrics."""

from __future__ import annotations

import pytest
from chispa import assert_df_equality
from spark_harness import connections, demo_query, spark_df, wait_for
from pyspark.errors import AnalysisException
from pyspark.sql import types as T

import sparkcep as cep

COLS = ["ip", "ts", "bytes"]


def _load(spark, **options):
    r = spark.read.format("upmcep")
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def test_unknown_stream_fails_at_load_with_code(spark, engine):
    engine.deploy(demo_query())
    with pytest.raises(AnalysisException, match=r"\[UPMCEP_UNKNOWN_STREAM\].*'nope'.*outputs: \['all'"):
        spark.readStream.format("upmcep").option("engine", engine.endpoint.address).option("stream", "nope").load()


def test_batch_read_of_unknown_output_fails_at_load_as_streaming(spark, engine):
    engine.deploy(demo_query())
    with pytest.raises(AnalysisException, match=r"\[UPMCEP_UNKNOWN_STREAM\].*'nope'.*outputs: \['all', 'big', "
                                                r"'per_ip', '\$metrics'\]"):
        spark.read.format("upmcep").option("engine", engine.endpoint.address).load("nope")


def test_batch_read_of_output_without_rows_is_empty_with_its_schema(spark, engine):
    """Spark plans a batch read of no range as one partition of no rows (it failed: AttributeError)."""
    engine.deploy(demo_query())
    df = spark.read.format("upmcep").option("engine", engine.endpoint.address).load("per_ip")
    assert df.count() == 0 and df.collect() == []
    ts, long_ = T.TimestampType(), T.LongType()
    assert [(f.name, f.dataType) for f in df.schema.fields] == [
        ("window_start", ts), ("window_end", ts), ("ip", T.StringType()), ("n", long_), ("total", long_),
        ("first", ts)]
    assert spark.read.format("upmcep").option("engine", engine.endpoint.address) \
        .option("includeMetadata", "true").load("per_ip").columns[-3:] == ["_partition", "_offset", "_seq"]


def test_metadata_columns_only_when_asked(spark, engine):
    engine.deploy(demo_query())
    engine.send("connections", connections(20))
    a = engine.endpoint.address
    assert spark.read.format("upmcep").option("engine", a).load("all").columns == COLS
    assert spark.readStream.format("upmcep").option("engine", a).load("all").columns == COLS
    meta = spark.read.format("upmcep").option("engine", a).option("includeMetadata", "true").load("all")
    assert meta.columns == COLS + ["_partition", "_offset", "_seq"]
    assert sorted(r["_offset"] for r in meta.collect()) == list(range(20))


def test_unreachable_engine_fails_at_load(spark, engine):
    engine.deploy(demo_query())
    host, port = engine.endpoint.address.split(":")
    dead = f"{host}:{int(port) + 1 if int(port) < 65535 else 1024}"
    with pytest.raises(AnalysisException, match=r"\[UPMCEP_ENGINE_NOT_FOUND\]"):
        _load(spark, engine=dead, stream="all")
    with pytest.raises(AnalysisException, match=r"\[UPMCEP_TOKEN_NOT_FOUND\] engine zk://127.0.0.1:2181/sparkcep: "
                                                r"option tokenFile is required"):
        _load(spark, engine="zk://127.0.0.1:2181/sparkcep", stream="all")  # a cluster's: its token, explicitly


def test_option_errors(spark, engine):
    engine.deploy(demo_query())
    a = engine.endpoint.address
    with pytest.raises(AnalysisException, match=r"\[UPMCEP_OPTION\] option 'stream' is required"):
        spark.read.format("upmcep").option("engine", a).load()
    with pytest.raises(AnalysisException, match=r"\[UPMCEP_OPTION\] option maxRecordsPerTrigger='-3'"):
        _load(spark, engine=a, stream="all", maxRecordsPerTrigger="-3")
    with pytest.raises(AnalysisException, match=r"\[UPMCEP_OPTION\] option startingOffsets='middle'"):
        _load(spark, engine=a, stream="all", startingOffsets="middle")
    # a misspelled option is refused at load() with the closest name (issue 16: it was ignored)
    with pytest.raises(AnalysisException, match=r"\[UPMCEP_OPTION\] unknown option 'maxrecordspertriger' "
                                                r"\(did you mean maxRecordsPerTrigger\?\)"):
        spark.readStream.format("upmcep").option("engine", a).option("stream", "all") \
            .option("maxRecordsPerTriger", 10).load()
    # a batch read takes every row the output holds: the options of streaming reads were ignored there
    with pytest.raises(Exception, match=r"\[UPMCEP_OPTION\] option startingOffsets applies to streaming reads"):
        _load(spark, engine=a, stream="all", startingOffsets="latest").count()
    # options Spark passes itself are accepted
    spark.read.format("upmcep").option("engine", a).option("checkpointLocation", "/x").option("queryName", "q") \
        .load("all")


def test_a_spark_dataframe_sent_to_the_engine_is_refused_naming_the_way_in(spark, engine):
    """It raised PySparkAttributeError ("Attribute `iloc` is not supported"): it was taken for pandas'."""
    engine.deploy(demo_query())
    df = spark.createDataFrame([("1.1.1.1", 1)], "ip STRING, bytes BIGINT")
    with pytest.raises(cep.InputError, match=r"'connections'.*cannot send a Spark DataFrame.*writeStream\.format"):
        engine.send("connections", df)


def test_token_file_option(spark, engine, tmp_path):
    """An explicit token file wins over the one the engine wrote under $SPARKCEP_HOME."""
    from sparkcep import auth
    from sparkcep.gateway import discovery

    engine.deploy(demo_query())
    engine.send("connections", connections(5))
    a = engine.endpoint.address
    copied = auth.write(tmp_path / "engine.token", auth.read(discovery.token_file(a)))
    assert _load(spark, engine=a, stream="all", tokenFile=str(copied)).count() == 5
    with pytest.raises(AnalysisException, match=r"\[UPMCEP_TOKEN_FILE\] cannot read the engine token file"):
        _load(spark, engine=a, stream="all", tokenFile=str(tmp_path / "missing.token"))
    wrong = auth.write(tmp_path / "wrong.token", auth.generate())
    with pytest.raises(AnalysisException, match=r"\[UPMCEP_UNAUTHENTICATED\]"):
        _load(spark, engine=a, stream="all", tokenFile=str(wrong))


def test_input_stream_is_not_readable_and_output_not_writable(spark, engine, tmp_path):
    engine.deploy(demo_query())
    a = engine.endpoint.address
    with pytest.raises(AnalysisException, match=r"\[UPMCEP_NOT_READABLE\]"):
        _load(spark, engine=a, stream="connections")  # at load()
    df = spark.createDataFrame(connections(3).to_pandas())
    with pytest.raises(Exception, match=r"\[UPMCEP_NOT_WRITABLE\]"):
        df.write.format("upmcep").option("engine", a).option("stream", "all").mode("append").save()
    with pytest.raises(Exception, match=r"\[UPMCEP_SCHEMA\] column 'extra' is not a field"):
        df.withColumn("extra", df.bytes).write.format("upmcep").option("engine", a) \
            .option("stream", "connections").mode("append").save()


def test_local_engine_is_found_without_engine_option(spark, engine):
    """The engine publishes its endpoint in $SPARKCEP_HOME; Spark's processes find it there."""
    engine.deploy(demo_query())
    engine.send("connections", connections(50))
    df = spark.read.format("upmcep").load("all")
    assert_df_equality(df.select(*COLS), spark_df(spark, engine.collect("all"), COLS), ignore_row_order=True,
                       ignore_nullable=True)


def test_batch_write_and_starting_offsets_latest(spark, engine, tmp_path):
    engine.deploy(demo_query())
    a = engine.endpoint.address
    engine.send("connections", connections(100))
    stream = (spark.readStream.format("upmcep").option("engine", a).option("stream", "all")
              .option("startingOffsets", "latest").option("includeMetadata", "true").load())
    q = stream.writeStream.format("memory").queryName("latest_rows") \
        .option("checkpointLocation", str(tmp_path / "ck")).start()
    try:
        q.processAllAvailable()
        later = connections(40, start=100)
        spark.createDataFrame(later.to_pandas()).write.format("upmcep").option("engine", a) \
            .option("stream", "connections").mode("append").save()  # batch write: 40 rows in
        q.processAllAvailable()
    finally:
        q.stop()
    got = spark.table("latest_rows")
    assert_df_equality(got.select(*COLS), spark_df(spark, later, COLS), ignore_row_order=True, ignore_nullable=True)
    assert sorted(r[0] for r in got.select("_offset").collect()) == list(range(100, 140))


def test_metrics_readable_as_stream_and_batch(spark, engine, tmp_path):
    engine.deploy(demo_query())
    a = engine.endpoint.address
    engine.send("connections", connections(123))
    rows = {r["name"]: r["value"] for r in _load(spark, engine=a, stream="$metrics").collect()}
    assert rows["sequence"] == 123
    assert rows["outputs.all"] == 123
    # a metrics stream never runs dry (a new sample every metricsInterval): poll the sink instead
    q = (spark.readStream.format("upmcep").option("engine", a).option("stream", "$metrics")
         .option("metricsInterval", "0.2").load()
         .writeStream.format("memory").queryName("live_metrics").option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(processingTime="0.5 seconds").start())

    def sequences():
        return {r[0] for r in spark.sql("select value from live_metrics where name = 'sequence'").collect()}

    try:
        wait_for(lambda: 123 in sequences(), 90, "a metrics sample with sequence 123")
        engine.send("connections", connections(7, start=123))
        wait_for(lambda: 130 in sequences(), 60, "a metrics sample with sequence 130")
    finally:
        q.stop()
    assert max(sequences()) == 130


def test_metrics_wide_form_one_row_per_sample(spark, engine, tmp_path):
    """A column per metric the engine reports at load(): later metrics are not in it, missing ones are null."""
    engine.deploy(demo_query())
    engine.send("connections", connections(123))
    a = engine.endpoint.address
    long_names = {r["name"] for r in _load(spark, engine=a, stream="$metrics").collect()}
    wide = _load(spark, engine=a, stream="$metrics", form="wide")
    assert wide.columns[0] == "time" and set(wide.columns[1:]) == long_names
    assert {f.dataType for f in wide.schema.fields} == {T.TimestampType(), T.DoubleType()}
    row, outputs = wide.collect()[-1], engine.metrics()["outputs"]
    assert (row["sequence"], row["outputs.all"], row["outputs.big"]) == (123, 123, outputs["big"])

    stream = spark.readStream.format("upmcep").option("engine", a).option("stream", "$metrics") \
        .option("form", "wide").load()
    later = cep.Query("later")
    later.output("copy", later.stream("connections", "ip string, ts timestamp, bytes int64").map(ip="ip"))
    engine.deploy(later)
    engine.undeploy("demo")
    engine.send("connections", connections(7, start=123))
    q = (stream.writeStream.format("memory").queryName("wide_metrics")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())  # samples now
    q.awaitTermination(120)
    assert q.exception() is None
    last = spark.sql("select * from wide_metrics order by time desc limit 1").collect()[0]
    assert last["sequence"] == 130 and last["outputs.all"] is None  # demo undeployed: no such metric
    assert "outputs.copy" not in spark.table("wide_metrics").columns  # deployed after load()


def test_metrics_form_option_errors(spark, engine):
    engine.deploy(demo_query())
    a = engine.endpoint.address
    with pytest.raises(AnalysisException, match=r"\[UPMCEP_OPTION\] option form='wdie': expected long or wide "
                                                r"\(did you mean wide\?\)"):
        _load(spark, engine=a, stream="$metrics", form="wdie")
    with pytest.raises(AnalysisException, match=r"\[UPMCEP_OPTION\] option form applies to stream \$metrics only"):
        _load(spark, engine=a, stream="all", form="wide")


def test_read_batches_are_the_engines_unless_small():
    """Batches of the engine's output log reach Spark uncopied; ranges of tiny batches are joined."""
    import pyarrow as pa

    from sparkcep.spark.reader import MAX_BATCH_ROWS, SMALL_BATCH_ROWS, spark_batches

    big = [pa.record_batch({"v": pa.array(range(k, k + SMALL_BATCH_ROWS * 2))}) for k in (0, 10**6)]
    out = spark_batches(pa.Table.from_batches([big[0], big[0].slice(0, 0), big[1]]))
    assert len(out) == 2 and all(o.column(0).buffers()[1].address == b.column(0).buffers()[1].address
                                 for o, b in zip(out, big))
    tiny = [pa.record_batch({"v": pa.array([k, k + 1])}) for k in range(0, 2 * MAX_BATCH_ROWS, 2)]
    out = spark_batches(pa.Table.from_batches(tiny))
    assert [o.num_rows for o in out] == [MAX_BATCH_ROWS, MAX_BATCH_ROWS]
    assert pa.Table.from_batches(out).column("v").to_pylist() == list(range(2 * MAX_BATCH_ROWS))
