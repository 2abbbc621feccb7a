"""Bin tables: inspectable per route-key operator, changed by a Configure record that every router
applies at the same epoch (the record travels with the data, through upstream sub-queries)."""

import numpy as np
import pyarrow as pa
import pytest

import sparkcep as cep
from sparkcep.core.columns import encode_keys
from sparkcep.core.hashing import key_bins

BINS = 16


def query(name):
    q = cep.Query(name)
    s = q.stream("ev", "k string, ts timestamp, v int64")
    q.output("n", s.filter(cep.col("v") >= 0, name="f")
             .aggregate(cep.TimeWindow("10s"), by="k", name="agg", n=cep.count(), sv=cep.sum("v")))
    return q


def batch(keys, second):
    n = len(keys)
    return pa.table({"k": keys, "ts": pa.array(np.full(n, second * 1_000_000), pa.timestamp("us")),
                     "v": np.arange(n)})


@pytest.mark.parametrize("workers", [0, 2])
def test_a_configure_moves_routing_at_an_epoch_and_results_stay_right(workers, worker_engines):
    keys = [f"key{i}" for i in range(40)]
    engine = worker_engines(2) if workers else cep.Engine.local()
    name = f"bins{workers}"
    try:
        dep = engine.deploy(query(name), parallelism=2, bins=BINS)
        assert dep.bin_owners("agg") == [0] * 8 + [1] * 8
        engine.send("ev", batch(keys, 1))
        engine.send("ev", batch(keys[:1], 25))  # the watermark passes the first window: it fires, state is empty
        engine.collect("n")
        before = {ep: m["rows_in"] for ep, m in dep.instance_metrics().items() if ep[0] == "SQ2"}
        dep.configure("agg", [1] * BINS)  # every bin to instance 1, from the next epoch on
        assert dep.bin_owners("agg") == [1] * BINS
        engine.send("ev", batch(keys, 31))
        engine.end("ev")
        got = engine.collect("n")
        after = {ep: m["rows_in"] for ep, m in dep.instance_metrics().items() if ep[0] == "SQ2"}
        assert after[("SQ2", 0)] == before[("SQ2", 0)]  # nothing reached instance 0 after the record
        assert after[("SQ2", 1)] - before[("SQ2", 1)] == len(keys)
    finally:
        if workers:
            engine.undeploy(name)
        else:
            engine.close()
    per_window = {}
    for row in got.to_pylist():
        per_window[row["window_start"]] = per_window.get(row["window_start"], 0) + row["n"]
    assert sorted(per_window.values()) == [1, 40, 40]


def test_bin_owners_name_the_operator_and_follow_the_one_key_to_bin_function():
    with cep.Engine.local() as engine:
        dep = engine.deploy(query("owners"), parallelism=4, bins=BINS)
        owners = dep.bin_owners("agg")
        assert owners == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
        with pytest.raises(cep.QueryError, match="'agg'"):
            dep.bin_owners("f")
        with pytest.raises(cep.QueryError, match="owners"):
            dep.configure("agg", [5] * BINS)
        keys = pa.record_batch({"k": [f"key{i}" for i in range(50)]})
        bins = key_bins(*encode_keys(keys, ["k"]), BINS)
        engine.send("ev", {"k": keys.column(0), "ts": pa.array(np.zeros(50, np.int64), pa.timestamp("us")),
                           "v": np.arange(50)})
        counts = {ep: m["rows_in"] for ep, m in dep.instance_metrics().items() if ep[0] == "SQ2"}
    for i in range(4):
        assert counts[("SQ2", i)] == int(np.isin(bins, np.flatnonzero(np.array(owners) == i)).sum())
