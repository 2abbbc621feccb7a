"""Bad input is rejected whole, with a stable code and a message naming stream, field and row."""

import datetime as dt

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import reference as ref
import sparkcep as cep
from cases import T0, cep_funcs
from harness import plain, table
from reference import S, assert_same_rows

EV = {"k": "string", "ts": "timestamp", "v": "int64", "x": "float64"}


def rows(*secs, k="a"):
    return [{"k": k, "ts": T0 + int(s * S), "v": i, "x": i / 2} for i, s in enumerate(secs)]


def query():
    q = cep.Query("q")
    s = q.stream("ev", EV)
    q.output("out", s.aggregate(cep.TimeWindow("10s"), by="k", **cep_funcs([("n", "count", None), ("sv", "sum", "v")])))
    q.output("raw", s.filter(cep.col("v") >= 0))
    return q


def good_columns(n=2):
    return {"k": ["a"] * n, "ts": [dt.datetime(2024, 1, 1, 0, 0, i) for i in range(n)], "v": list(range(n)),
            "x": [0.5] * n}


@pytest.mark.parametrize("data,code,words", [
    ({**good_columns(), "extra": [1, 2]}, "UNKNOWN_FIELD", ["'ev'", "'extra'"]),
    ({k: v for k, v in good_columns().items() if k != "v"}, "MISSING_FIELD", ["'ev'", "'v'"]),
    ({**good_columns(), "v": [1, "two"]}, "TYPE", ["'ev'", "'v'", "row 1"]),
    ({**good_columns(), "v": ["1", "2"]}, "TYPE", ["'ev'", "'v'", "int64", "row 0"]),
    ({**good_columns(), "v": [1.5, 2.0]}, "TYPE", ["'ev'", "'v'", "int64"]),
    ({**good_columns(), "k": [1, 2]}, "TYPE", ["'ev'", "'k'", "string"]),
    ({**good_columns(), "x": [True, False]}, "TYPE", ["'ev'", "'x'"]),
    ({**good_columns(), "ts": [1, 2]}, "TYPE", ["'ev'", "'ts'", "timestamp"]),
    ({**good_columns(3), "ts": [dt.datetime(2024, 1, 1), None, dt.datetime(2024, 1, 1)]}, "NULL_TIME",
     ["'ev'", "'ts'", "row 1"]),
    ({**good_columns(), "v": [1, 2, 3]}, "LENGTH", ["'ev'"]),
    ({**good_columns(), "v": [1, 2 ** 70]}, "TYPE", ["'ev'", "'v'", "int64", "row 1"]),
    ({**good_columns(), "x": [0.5, 10 ** 400]}, "TYPE", ["'ev'", "'x'", "row 1"]),
    ({**good_columns(), "ts": [dt.datetime(2024, 1, 1), dt.datetime(4124, 1, 1)]}, "TIME_AHEAD",
     ["'ev'", "'ts'", "row 1", "4124"]),
    ([1, 2, 3], "BAD_DATA", ["'ev'"]),
    ({**{n: v[:1] for n, v in good_columns().items()}, "tss": [1]}, "UNKNOWN_FIELD", ["(did you mean 'ts'?)"]),
    ({**{n: v[:1] for n, v in good_columns().items() if n != "k"}, "K": ["a"]}, "UNKNOWN_FIELD",
     ["(did you mean 'k'?)"]),
    # one value where a column goes: a TypeError, or a string taken as a column of its letters
    ({**{n: v[0] for n, v in good_columns().items()}}, "BAD_DATA", ["'ev'", "'k' is one str, not a column"]),
    ({**good_columns(3), "k": "abc"}, "BAD_DATA", ["'ev'", "'k' is one str, not a column"]),
    ({**good_columns(1), "v": np.int64(7)}, "BAD_DATA", ["'v' is one int64, not a column", "{'v': [value], ...}"]),
])
def test_bad_batches_are_rejected_with_a_code(data, code, words):
    with cep.Engine.local() as e:
        e.deploy(query())
        with pytest.raises(cep.InputError) as err:
            e.send("ev", data)
        assert err.value.code == code
        for w in words:
            assert w in str(err.value), (w, str(err.value))
        assert e.metrics()["sequence"] == 0


def test_an_empty_frame_is_taken_whatever_its_columns_dtypes():
    """pandas gives the columns of ``DataFrame({"k": []})`` float64: with no row, no value is of a wrong
    type, so an empty send is 0 rows taken (as an empty dict of lists is), not a TYPE error."""
    with cep.Engine.local() as e:
        e.deploy(query())
        assert e.send("ev", pd.DataFrame({f: [] for f in EV})) == 0
        assert e.send("ev", pd.DataFrame({f: [] for f in EV}).astype({"k": object, "v": "int8"})) == 0
        assert e.send("ev", {f: [] for f in EV}) == 0
        assert e.metrics()["sequence"] == 0
        with pytest.raises(cep.InputError) as err:
            e.send("ev", pd.DataFrame({**good_columns(1), "k": [1.5]}))
        assert err.value.code == "TYPE" and "'k'" in str(err.value)


def test_int64_overflowing_an_int32_field_is_a_type_error():
    q = cep.Query("q32")
    q.output("o", q.stream("s", "k string, n int32"))
    with cep.Engine.local() as e:
        e.deploy(q)
        e.send("s", {"k": ["a"], "n": [5]})  # a small int64 fits
        with pytest.raises(cep.InputError) as err:
            e.send("s", {"k": ["a"], "n": [2 ** 40]})
        assert err.value.code == "TYPE"


def test_a_time_finer_than_a_microsecond_is_refused_naming_row_and_value():
    """The engine keeps microseconds: pandas' nanoseconds are refused, not truncated. It said "cannot convert
    timestamp to timestamp: Casting from timestamp[ns] to timestamp[us] would lose data", naming no row."""
    ts = pd.to_datetime(["2024-01-01"] * 3) + pd.to_timedelta([0, 1000, 1], "ns")  # 1 us is fine, 1 ns is not
    frame = pd.DataFrame({"k": ["a"] * 3, "ts": ts, "v": [0, 1, 2], "x": [0.5] * 3})
    whole = pa.RecordBatch.from_pandas(frame[:2], preserve_index=False)
    table = pa.Table.from_batches([whole, pa.RecordBatch.from_pandas(frame, preserve_index=False)])
    with cep.Engine.local() as e:
        e.deploy(query())
        as_list = {"k": ["a"] * 3, "ts": list(ts), "v": [0, 1, 2], "x": [0.5] * 3}  # pyarrow truncated these
        for data, row in [(frame, 2), (frame.set_axis([7, 8, 9]), 2), (table, 4), (as_list, 2)]:  # rows from 0
            with pytest.raises(cep.InputError) as err:
                e.send("ev", data)
            assert err.value.code == "TYPE"
            assert str(err.value) == (f"stream 'ev': field 'ts': row {row} is 2024-01-01T00:00:00.000000001, finer "
                                      "than the microseconds the engine keeps; round the times first, e.g. "
                                      "df['ts'].dt.floor(\"us\") in pandas")
        assert e.metrics()["sequence"] == 0
        assert e.send("ev", frame.assign(ts=frame["ts"].dt.floor("us"))) == 3


def test_unknown_stream_and_output():
    with cep.Engine.local() as e:
        e.deploy(query())
        with pytest.raises(cep.UnknownStreamError) as err:
            e.send("nope", good_columns())
        assert err.value.code == "UNKNOWN_STREAM" and "'nope'" in str(err.value) and "ev" in str(err.value)
        with pytest.raises(cep.UnknownStreamError):
            e.collect("nope")
        with pytest.raises(cep.UnknownStreamError):
            e.end("nope")
        assert isinstance(err.value, cep.SparkcepError)


def test_sending_after_end_is_refused():
    with cep.Engine.local() as e:
        e.deploy(query())
        e.end("ev")
        with pytest.raises(cep.InputError) as err:
            e.send("ev", good_columns())
        assert err.value.code == "ENDED"


BAD = [
    {"k": ["a"], "ts": [dt.datetime(2030, 1, 1)], "v": ["not a number"], "x": [0.0]},  # a huge time, bad v
    {"k": ["a", "b"], "ts": [dt.datetime(2030, 1, 1), None], "v": [1, 2], "x": [0.0, 0.0]},  # null time
    {"k": ["a"], "ts": [dt.datetime(2030, 1, 1)], "v": [1], "x": [0.0], "zzz": [1]},  # unknown field
]


@pytest.mark.parametrize("parallelism", [1, 2])
def test_a_rejected_batch_leaves_no_trace(parallelism):
    sends = [rows(1, 2, 3), rows(11, 5, k="b"), rows(4, 25, 12)]
    with cep.Engine.local() as clean:
        clean.deploy(query(), parallelism=parallelism)
        for s in sends:
            clean.send("ev", table(s, EV))
        clean.end("ev")
        want = {o: plain(clean.collect(o)) for o in ("out", "raw")}
        want_metrics = clean.metrics()
    with cep.Engine.local() as e:
        e.deploy(query(), parallelism=parallelism)
        for i, s in enumerate(sends):
            for bad in BAD:
                with pytest.raises(cep.InputError):
                    e.send("ev", bad)
            e.send("ev", table(s, EV))
        e.end("ev")
        for o in ("out", "raw"):
            got = plain(e.collect(o))
            assert_same_rows(got, want[o], o)
            # same sequence numbers too: identical row order per partition
            assert got.values.tolist() == want[o].values.tolist()
        got_metrics = e.metrics()
        for key in ("sequence", "outputs", "late"):  # the deterministic counters (rates and latencies vary)
            assert got_metrics[key] == want_metrics[key], key


def test_input_formats_and_widening():
    q = cep.Query("fmt")
    q.output("o", q.stream("ev", "k string, ts timestamp, v int64, x float64, n int32"))
    ts = [T0, T0 + S]
    expected = [("a", T0, 1, 1.0, 3), ("b", T0 + S, None, None, None)]
    variants = {
        "arrow": pa.table({"k": ["a", "b"], "ts": pa.array(ts, pa.timestamp("us")), "v": pa.array([1, None], pa.int32()),
                           "x": pa.array([1, None], pa.int64()), "n": pa.array([3, None], pa.int64())}),
        "batch": pa.record_batch({"k": ["a", "b"], "ts": pa.array([t // 1000 for t in ts], pa.timestamp("ms")),
                                  "v": [1, None], "x": pa.array([1.0, None], pa.float32()), "n": [3, None]}),
        "pandas": pd.DataFrame({"k": ["a", "b"], "ts": pd.to_datetime(ts, unit="us"), "v": pd.array([1, None], "Int64"),
                                "x": [1.0, np.nan], "n": pd.array([3, None], "Int32")}),
        "pandas subclass": type("Frame", (pd.DataFrame,), {})(
            {"k": ["a", "b"], "ts": pd.to_datetime(ts, unit="us"), "v": pd.array([1, None], "Int64"),
             "x": [1.0, np.nan], "n": pd.array([3, None], "Int32")}),
        "pandas categories": pd.DataFrame({"k": pd.Categorical(["a", "b"]), "ts": pd.to_datetime(ts, unit="us"),
                                           "v": pd.array([1, None], "Int64"), "x": [1.0, np.nan],
                                           "n": pd.array([3, None], "Int32")}),
        "arrow dictionary": pa.table({"k": pa.array(["a", "b"]).dictionary_encode(), "ts": pa.array(ts, pa.timestamp("us")),
                                      "v": [1, None], "x": [1.0, None], "n": pa.array([3, None], pa.int32())}),
        "arrow string views": pa.table({"k": pa.array(["a", "b"], pa.string_view()),
                                        "ts": pa.array(ts, pa.timestamp("us")), "v": [1, None], "x": [1.0, None],
                                        "n": pa.array([3, None], pa.int32())}),
        "dict": {"k": np.array(["a", "b"]), "ts": [dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=t) for t in ts],
                 "v": [1, None], "x": [1.0, None], "n": [3, None]},
    }
    for name, data in variants.items():
        with cep.Engine.local() as e:
            e.deploy(q)
            assert e.send("ev", data) == 2, name
            got = plain(e.collect("o"))
        assert [tuple(r) for r in got.values.tolist()] == expected, name


def test_empty_batch_is_accepted_and_does_nothing():
    with cep.Engine.local() as e:
        e.deploy(query())
        assert e.send("ev", table([], EV)) == 0
        assert e.metrics()["sequence"] == 0


def test_reference_agrees_on_the_clean_run():
    sends = [("ev", rows(1, 2, 3)), ("ev", rows(11, 5, k="b"))]
    st = ref.stamp(sends, {"ev": "ts"})
    want, late = ref.aggregate(st["ev"], ref.Time(10 * S), ["k"], [("n", "count", None), ("sv", "sum", "v")])
    with cep.Engine.local() as e:
        e.deploy(query())
        for _, s in sends:
            with pytest.raises(cep.InputError):
                e.send("ev", BAD[0])
            e.send("ev", table(s, EV))
        e.end("ev")
        assert_same_rows(plain(e.collect("out")), want)
        assert sum(e.metrics()["late"]["q"].values()) == late == 0


def test_an_event_far_ahead_of_the_watermark_is_refused_and_the_bound_is_the_users():
    with cep.Engine.local() as e:
        e.deploy(query())
        e.send("ev", good_columns())
        far = {**good_columns(3), "ts": [dt.datetime(2024, 1, 1), dt.datetime(2024, 1, 1), dt.datetime(4124, 1, 1)]}
        with pytest.raises(cep.InputError) as err:
            e.send("ev", far)
        assert err.value.code == "TIME_AHEAD" and "row 2" in str(err.value) and "'ts'" in str(err.value)
        assert e.metrics()["sequence"] == 2  # nothing of it was taken
        e.send("ev", {**good_columns(), "ts": [dt.datetime(2024, 1, 6)] * 2})  # 5 days ahead: within 7 days
        e.end("ev")
        assert sum(e.collect("out").column("n").to_pylist()) == 4
    q = cep.Query("tight")
    s = q.stream("ev", EV, max_ahead="1h")
    q.output("raw", s.filter(cep.col("v") >= 0))
    with cep.Engine.local() as e:
        e.deploy(q)
        e.send("ev", good_columns())
        with pytest.raises(cep.InputError, match="TIME_AHEAD|ahead"):
            e.send("ev", {**good_columns(1), "ts": [dt.datetime(2024, 1, 1, 2)]})
    q = cep.Query("unbounded")
    q.output("raw", q.stream("ev", EV, max_ahead=None).filter(cep.col("v") >= 0))
    with cep.Engine.local() as e:
        e.deploy(q)
        e.send("ev", {**good_columns(), "ts": [dt.datetime(2024, 1, 1), dt.datetime(4124, 1, 1)]})
        assert e.collect("raw").num_rows == 2


def test_a_table_of_many_batches_is_one_send_whose_errors_count_rows_from_its_start():
    """A Spark micro-batch reaches send() as a table of thousands of record batches: they are one
    epoch (a later batch's earlier events are not late), and an error names the row in the table."""
    first = pa.RecordBatch.from_pydict(good_columns(3))
    later = {**good_columns(2), "ts": [dt.datetime(2023, 12, 31, 23, 59, 50)] * 2}  # before every row of `first`
    table = pa.Table.from_batches([first, pa.RecordBatch.from_pydict(later, schema=first.schema)])
    assert table.num_rows == 5 and len(table.to_batches()) == 2
    with cep.Engine.local() as e:
        e.deploy(query())
        bad = pa.Table.from_batches([first, pa.RecordBatch.from_pydict({**good_columns(2), "ts": [
            dt.datetime(2024, 1, 1), None]}, schema=first.schema)])
        with pytest.raises(cep.InputError) as err:
            e.send("ev", bad)
        assert err.value.code == "NULL_TIME" and "row 4" in str(err.value)
        assert e.metrics()["sequence"] == 0
        assert e.send("ev", table) == 5
        e.end("ev")
        assert sorted(e.collect("out").column("n").to_pylist()) == [2, 3]
        assert sum(e.metrics()["late"]["q"].values()) == 0


def test_a_tables_small_batches_are_joined_and_its_large_ones_kept_as_they_are():
    from sparkcep.core.ingest import PIECE_BYTES, to_batches
    from sparkcep.schema import Schema

    n = 100_000
    big = pa.RecordBatch.from_pydict({"k": [f"k{i % 1000}" for i in range(n)],
                                      "ts": pa.array(np.arange(n, dtype=np.int64), pa.timestamp("us")),
                                      "v": np.arange(n), "x": np.zeros(n)})
    assert big.nbytes >= PIECE_BYTES
    tiny = pa.Table.from_batches([big.slice(i, 10) for i in range(0, n, 10)])
    out = to_batches("ev", Schema(EV), tiny, "ts")
    assert len(out) <= big.nbytes // PIECE_BYTES + 1 and pa.Table.from_batches(out).equals(pa.Table.from_batches([big]))
    out = to_batches("ev", Schema(EV), pa.Table.from_batches([big, big]), "ts")
    assert len(out) == 2 and all(o.column(0).buffers()[2].address == big.column(0).buffers()[2].address for o in out)
