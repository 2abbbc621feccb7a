"""Each HiBench workload's sparkcep output against a pandas reference on a small input."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import sparkcep as cep
from sparkcep.bench import workloads
from sparkcep.bench.generator import UserVisits

T0 = 1_700_000_003_000_000  # not window-aligned
BATCHES, ROWS, RATE = 6, 1500, 300.0  # 9000 records over 30 s: 4 windows of 10 s


def run(workload, parallelism=1, workers=0, **kw):
    gen = UserVisits(seed=5, distinct_ips=40, cycle=1 << 16)
    sent = []
    with cep.Engine.local(workers=workers) as engine:
        engine.deploy(workloads.query(workload, **kw), parallelism=workloads.parallelism(workload, parallelism))
        for i in range(BATCHES):
            b = gen.records(i * ROWS, ROWS, start_us=T0, rate=RATE)
            sent.append(b)
            engine.send(workloads.STREAM, b)
        engine.end(workloads.STREAM)
        out = engine.collect(workload)
    df = pa.Table.from_batches(sent).to_pandas()
    df["key"] = pa.Table.from_batches(sent).column("key").cast(pa.int64()).to_numpy()
    df["batch"] = np.repeat(np.arange(BATCHES), ROWS)
    df["ip"] = df.value.str.split(",").str[0]  # HiBench's UserVisitParser
    return out, df


def as_int(col):
    return col.cast(pa.int64()).to_numpy() if pa.types.is_timestamp(col.type) else col.to_numpy()


def frame(out, cols):
    return pd.DataFrame({c: (out.column(c).to_pylist() if c == "ip" else as_int(out.column(c))) for c in cols})


def same(got, want, cols):
    pd.testing.assert_frame_equal(got.sort_values(cols)[cols].reset_index(drop=True),
                                  want.sort_values(cols)[cols].reset_index(drop=True), check_dtype=False)


@pytest.mark.parametrize("workload,par", [("identity", 1), ("repartition", 3)])
def test_stateless_workloads_pass_every_record_unchanged(workload, par):
    out, df = run(workload, par)
    got = pd.DataFrame({"key": as_int(out.column("key")), "value": out.column("value").to_pylist()})
    assert len(got) == len(df)
    same(got, df, ["key", "value"])


@pytest.mark.parametrize("par,workers", [(1, 0), (2, 0), (2, 2)])
def test_wordcount_is_the_running_count_per_ip_after_each_batch(par, workers):
    """Spark's groupBy(ip).count() in update mode, with a send for a micro-batch."""
    out, df = run("wordcount", par, workers)
    assert out.schema.names == ["ip", "count"]
    df["count"] = df.groupby("ip").cumcount() + 1
    want = df.groupby(["batch", "ip"], as_index=False).last()
    same(frame(out, ["ip", "count"]), want, ["ip", "count"])
    # the largest count of each IP is its total, as HiBench's mapWithState ends
    assert (frame(out, ["ip", "count"]).groupby("ip")["count"].max() == df.groupby("ip").size()).all()


def test_wordcount_tuples_counts_every_ten_records_of_an_ip():
    """UPM-CEP's wordcount: a tuple window of TUPLE_WINDOW records per IP, in sequence order."""
    out, df = run("wordcount_tuples", 2)
    n = workloads.TUPLE_WINDOW
    df["pos"] = df.groupby("ip").cumcount()
    full = df.groupby("ip").size() // n
    want = pd.DataFrame([{"window_start": k * n, "window_end": (k + 1) * n, "ip": ip, "count": n}
                         for ip, windows in full.items() for k in range(windows)])
    cols = ["window_start", "window_end", "ip", "count"]
    same(frame(out, cols), want, cols)


@pytest.mark.parametrize("window_us", [workloads.WINDOW_US, 100_000])
def test_fixwindow_counts_and_first_time_per_ip_and_window(window_us):
    out, df = run("fixwindow", 2, window_us=window_us)
    df["window_start"] = df.key // window_us * window_us
    want = df.groupby(["window_start", "ip"], as_index=False).agg(count=("key", "size"), first=("key", "min"))
    want["window_end"] = want.window_start + window_us
    cols = ["window_start", "window_end", "ip", "count", "first"]
    assert want.window_start.nunique() == (4 if window_us == workloads.WINDOW_US else 300)
    same(frame(out, cols), want, cols)


def test_the_ip_is_parsed_by_an_engine_expression():
    assert "split_part(',', 1)" in workloads.query("fixwindow").explain()
    flush = workloads.Records(UserVisits(seed=1, distinct_ips=5, cycle=1 << 16)).flush(T0)
    assert flush[0][1].column("value")[0].as_py().split(",")[0] == workloads.FLUSH_IP


def test_unknown_workload():
    with pytest.raises(ValueError, match="unknown workload"):
        workloads.query("terasort")
