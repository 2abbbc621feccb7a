"""The numpy views kernels get of Arrow columns."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import sparkcep as cep
from sparkcep.core import columns

T = pd.Timestamp("2024-01-01")


def test_string_views_are_read_only_whoever_owns_the_buffers():
    """Buffers read from a channel are mutable, those pyarrow builds are not; kernels must see one
    array type for both, or numba compiles a second version mid-run (seconds without output)."""
    built = pa.array(["10.0.0.1", "10.0.0.22"])
    _, off, data = built.buffers()
    mutable = pa.Array.from_buffers(pa.string(), 2, [None, pa.py_buffer(np.frombuffer(off, np.uint8).copy()),
                                                     pa.py_buffer(np.frombuffer(data, np.uint8).copy())])
    for arr in (built, mutable):
        o, d, valid = columns.strings(arr)
        assert not o.flags.writeable and not d.flags.writeable
        assert [bytes(d[o[i]:o[i + 1]]) for i in range(2)] == [b"10.0.0.1", b"10.0.0.22"]
        assert valid.all()


NANS = np.array([0x7FF8_0000_0000_0000, 0xFFF8_0000_0000_0000, 0x7FF8_0000_0000_0001, 0xFFF0_0000_0000_0001],
                np.uint64).view(np.float64)  # np.nan, numpy's 0/0 (sign bit set), and NaNs with payloads


def test_every_nan_and_both_zeros_encode_as_one_key():
    """NaN keys were encoded by their bits: numpy's 0/0 and np.nan were two groups, as -0.0 and 0.0 are not."""
    for typ in (pa.float64(), pa.float32()):
        keys = pa.array(np.concatenate([NANS, [0.0, -0.0, 1.5]])).cast(typ)
        offsets, data = columns.encode_keys(pa.record_batch([keys], names=["r"]), ["r"])
        encoded = [bytes(data[offsets[i]:offsets[i + 1]]) for i in range(len(keys))]
        assert len(set(encoded[:4])) == 1 and encoded[4] == encoded[5] and len(set(encoded)) == 3, typ


@pytest.mark.parametrize("workers, parallelism", [(0, 1), (0, 2), (2, 2)])
def test_nan_keys_group_and_join_as_pandas_does(workers, parallelism):
    """Every NaN is one key, in an aggregate's groups, a join's matches and the instance a key is routed to."""
    r = np.random.default_rng(7).choice(np.concatenate([NANS, [0.0, -0.0], np.arange(8.0)]), 200)
    left = pd.DataFrame({"r": r, "ts": T + pd.to_timedelta(np.arange(200), "ms"), "v": np.arange(200)})
    right = pd.DataFrame({"r": NANS[::-1], "ts": T + pd.to_timedelta(np.arange(4), "ms"), "w": np.arange(4)})
    q = cep.Query("nan_keys")
    a, b = q.stream("a", "r float64, ts timestamp, v int64"), q.stream("b", "r float64, ts timestamp, w int64")
    q.output("agg", a.aggregate(cep.TimeWindow("1h"), by="r", n=cep.count(), sv=cep.sum("v")))
    q.output("j", a.join(b, cep.TimeWindow("1h"), on="r"))
    with cep.Engine.local(workers=workers) as e:
        e.deploy(q, parallelism=parallelism)
        for stream, df in (("a", left), ("b", right)):  # Arrow keeps NaN a value (pandas' NaN is sent as null)
            e.send(stream, pa.table({c: pa.array(df[c].to_numpy()) for c in df}))
            e.end(stream)
        agg, joined = e.collect("agg").to_pandas(), e.collect("j").to_pandas()
    want = left.groupby("r", dropna=False).v.agg(["size", "sum"]).reset_index()
    got = agg.sort_values("r", na_position="last").reset_index(drop=True)
    assert got.r.isna().sum() == 1 and got.r.equals(want.r)
    assert got.n.tolist() == want["size"].tolist() and got.sv.tolist() == want["sum"].tolist()
    pairs = left.merge(right, on="r")  # pandas matches NaN keys to each other, as Spark's joins do
    assert len(pairs) == 4 * int(np.isnan(r).sum())
    assert sorted(zip(joined.v, joined.w)) == sorted(zip(pairs.v, pairs.w))
