"""The Spark peers of the benchmark workloads (:mod:`sparkcep.bench.spark_queries`) compute what the
sparkcep queries compute: on the same small input, written as the benchmark writes it (Parquet files,
a flush record per stream), Spark's rows equal the pandas reference and sparkcep's.

Spark reads one file per micro-batch and sparkcep gets one ``send`` per file, so even the running
count's updates (one row per IP per batch) are the same rows.
"""

import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import sparkcep as cep
from sparkcep.bench import nexmark_queries as nq
from sparkcep.bench import spark as sb
from sparkcep.bench import suite, workloads
from sparkcep.bench.generator import UserVisits
from sparkcep.bench.nexmark import Nexmark, NexmarkSource
from sparkcep.bench.spark_queries import hibench_df, nexmark_df

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import nexmark_reference as ref  # noqa: E402

T0 = 1_700_000_003_000_000


def spark_rows(spark, tmp_path, df_of, source, events, rate, rows_per_file, gap_us):
    """Every row the Spark query emits over ``events`` of ``source`` (one file per micro-batch), with its batch."""
    dirs = {s: tmp_path / "in" / s for s in source.streams}
    log = sb.write_input(dirs, source, events, T0, rate, gap_us, rows_per_file)
    streams = {s: spark.readStream.schema(sb.spark_ddl(source.ddl[s])).option("maxFilesPerTrigger", 1)
               .parquet(str(d)) for s, d in dirs.items()}
    df, mode = df_of(streams)
    got = []
    q = (df.writeStream.outputMode(mode).option("checkpointLocation", str(tmp_path / "ck"))
         .foreachBatch(lambda b, i: got.append(b.toPandas().assign(batch=i))).start())
    try:
        for _ in range(3):  # the last windows leave in a batch of their own once the watermark moved
            q.processAllAvailable()
            time.sleep(0.3)
    finally:
        q.stop()
    out = pd.concat(got, ignore_index=True) if got else pd.DataFrame()
    for c in out.columns:
        if pd.api.types.is_datetime64_any_dtype(out[c]):
            out[c] = out[c].dt.tz_localize(None).astype("datetime64[us]").astype(np.int64)
    return out, log


def sparkcep_rows(query, source, events, rate, rows_per_file, output) -> pd.DataFrame:
    """What sparkcep emits for the same events, one ``send`` per stream per file."""
    source.prepare(events)
    with cep.Engine.local() as e:
        e.deploy(query, parallelism=2)
        for start in range(0, events, rows_per_file):
            n = min(rows_per_file, events - start)
            keys = T0 + (np.arange(start, start + n, dtype=np.float64) * (1e6 / rate)).astype(np.int64)
            for stream, batch in source.batches(start, n, keys):
                e.send(stream, batch)
        for s in source.streams:
            e.end(s)
        return ref.as_frame(e.collect(output))


def test_wordcount_updates_equal_sparkcep_and_the_running_count(spark, tmp_path):
    src = workloads.Records(UserVisits(seed=5, distinct_ips=40, cycle=1 << 16))
    got, _ = spark_rows(spark, tmp_path, lambda s: hibench_df("wordcount", s[workloads.STREAM]), src, 6000,
                        300.0, 1500, workloads.WINDOW_US)
    got = got[got.ip != workloads.FLUSH_IP]
    ours = sparkcep_rows(workloads.query("wordcount"), src, 6000, 300.0, 1500, "wordcount")
    assert ref.tidy(got[["ip", "count"]]).equals(ref.tidy(ours[["ip", "count"]]))
    ips = pd.Series(src.gen.source_ips(0, 6000).to_pylist())
    assert got.groupby("ip")["count"].max().sort_index().equals(ips.value_counts().sort_index().rename("count"))
    assert got.batch.nunique() == 4  # one update per file


@pytest.mark.parametrize("window_us", [workloads.WINDOW_US, 100_000])
def test_fixwindow_equals_sparkcep(spark, tmp_path, window_us):
    src = workloads.Records(UserVisits(seed=5, distinct_ips=40, cycle=1 << 16))
    got, _ = spark_rows(spark, tmp_path, lambda s: hibench_df("fixwindow", s[workloads.STREAM], window_us=window_us),
                        src, 9000, 300.0, 1500, window_us)
    ours = sparkcep_rows(workloads.query("fixwindow", window_us=window_us), src, 9000, 300.0, 1500, "fixwindow")
    cols = ["window_start", "window_end", "ip", "count", "first"]
    assert len(ours) > 100 and ref.tidy(got[cols]).equals(ref.tidy(ours[cols]))


@pytest.mark.parametrize("name", nq.QUERIES)
def test_nexmark_equals_sparkcep_and_the_reference(spark, tmp_path, name):
    scale, rate, events, per_file = 10, 1000.0, 20_000, 4000  # five micro-batches a stream
    src = NexmarkSource(Nexmark(seed=3), nq.STREAMS[name], rate)
    size, advance = nq.windows_us(name, scale)
    got, _ = spark_rows(spark, tmp_path, lambda s: nexmark_df(name, s, scale), src, events, rate, per_file, size)
    ours = sparkcep_rows(nq.query(name, scale), src, events, rate, per_file, name)
    cols = ref.tidy(ours).columns.tolist()
    assert len(ours) > 5
    assert ref.tidy(got[cols]).equals(ref.tidy(ours)), f"{name}:\n{ref.tidy(got[cols]).head()}\n{ref.tidy(ours).head()}"
    src.prepare(events)
    frames = {k: ref.as_frame(b) for k, b in src.gen.events(0, events, T0 + (np.arange(events) * 1000)).items()}
    want = {"q5": lambda: ref.q5(frames["bid"], size, advance), "q7": lambda: ref.q7(frames["bid"], size),
            "q8": lambda: ref.q8(frames["person"], frames["auction"], size)}[name]()
    assert ref.tidy(ours).equals(want)


def test_every_windowed_workload_has_a_spark_peer():
    assert [w for w in suite.ALL if not suite.has_spark_peer(w)] == ["wordcount_tuples"]
    assert sb.spark_ddl("id int64, t timestamp, s string, f float64") == "id bigint, t timestamp, s string, f double"
