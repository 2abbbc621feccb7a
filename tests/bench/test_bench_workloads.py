"""Each workload's sparkcep output against a pandas reference on a small input."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import sparkcep as cep
from sparkcep.bench import workloads
from sparkcep.bench.generator import UserVisits

T0 = 1_700_000_003_000_000  # not window-aligned
BATCHES, ROWS, RATE = 6, 1500, 300.0  # 9000 records over 30 s: 4 windows of 10 s


def run(workload, parallelism=1):
    gen = UserVisits(seed=5, distinct_ips=40, cycle=1 << 16)
    sent = []
    with cep.Engine.local() as engine:
        engine.deploy(workloads.query(workload), parallelism=workloads.parallelism(workload, parallelism))
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


@pytest.mark.parametrize("workload,par", [("identity", 1), ("repartition", 3)])
def test_stateless_workloads_pass_every_record_unchanged(workload, par):
    out, df = run(workload, par)
    got = pd.DataFrame({"key": as_int(out.column("key")), "value": out.column("value").to_pylist()})
    want = df[["key", "value"]]
    assert len(got) == len(want)
    pd.testing.assert_frame_equal(got.sort_values(["key", "value"]).reset_index(drop=True),
                                  want.sort_values(["key", "value"]).reset_index(drop=True))


def test_wordcount_is_the_running_count_per_ip_after_each_batch():
    out, df = run("wordcount", 2)
    df["count"] = df.groupby("ip").cumcount() + 1
    want = df.groupby(["batch", "ip"], as_index=False).last()[["ip", "count", "key"]]
    got = pd.DataFrame({"ip": out.column("ip").to_pylist(), "count": as_int(out.column("count")),
                        "key": as_int(out.column("key"))})
    cols = ["key", "ip", "count"]
    pd.testing.assert_frame_equal(got.sort_values(cols)[cols].reset_index(drop=True),
                                  want.sort_values(cols)[cols].reset_index(drop=True))
    # the last row of each IP is its total, as HiBench's mapWithState ends
    final = got.sort_values("key").groupby("ip")["count"].last()
    assert (final == df.groupby("ip").size()).all()


def test_fixwindow_counts_and_first_time_per_ip_and_10s_window():
    out, df = run("fixwindow", 2)
    w = 10_000_000
    df["window_start"] = df.key // w * w
    want = df.groupby(["window_start", "ip"], as_index=False).agg(count=("key", "size"), first=("key", "min"))
    want["window_end"] = want.window_start + w
    got = pd.DataFrame({c: (out.column(c).to_pylist() if c == "ip" else as_int(out.column(c)))
                        for c in ("window_start", "window_end", "ip", "count", "first")})
    cols = ["window_start", "window_end", "ip", "count", "first"]
    assert want.window_start.nunique() == 4
    pd.testing.assert_frame_equal(got.sort_values(cols)[cols].reset_index(drop=True),
                                  want.sort_values(cols)[cols].reset_index(drop=True))


def test_unknown_workload():
    with pytest.raises(ValueError, match="unknown workload"):
        workloads.query("terasort")
