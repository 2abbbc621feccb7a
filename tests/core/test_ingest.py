"""Columns as Python users hold them: pandas and numpy buffers reused after a send, fields given twice,
narrower numeric types, integers pandas made floats, floats past float32's range."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import sparkcep as cep

T = np.array([1_000_000, 2_000_000], "datetime64[us]")


def passthrough(schema: str) -> cep.Query:
    q = cep.Query("q")
    q.output("o", q.stream("ev", schema))
    return q


def test_a_buffer_reused_after_the_send_changes_no_row_the_engine_keeps():
    """In process, Arrow wrapped the caller's numpy and pandas buffers: a producer refilling its buffer
    rewrote rows already in an output and in a join's state (outputs [-100, -200], pairs of -100/-200)."""
    q = cep.Query("q")
    left, right = q.stream("l", "ts timestamp, k int64, v int64"), q.stream("r", "ts timestamp, k int64, w int64")
    q.output("kept", left.filter(cep.col("v") > 0))
    q.output("pairs", left.join(right, cep.TimeWindow("10s"), on="k"))
    buf = np.array([1, 2], np.int64)
    frame = pd.DataFrame({"ts": T, "k": [7, 7], "v": [3, 4]})
    with cep.Engine.local(workers=0) as e:
        e.deploy(q)
        e.send("l", {"ts": T, "k": np.array([7, 7]), "v": buf})
        e.send("l", frame)
        buf[:] = [-100, -200]
        frame.loc[:, "v"] = [-300, -400]
        frame["v"].to_numpy()[:] = [-300, -400]
        e.send("r", {"ts": T, "k": np.array([7, 7]), "w": np.array([0, 0])})
        e.end("l")
        e.end("r")
        assert e.collect("kept").column("v").to_pylist() == [1, 2, 3, 4]
        assert sorted(e.collect("pairs").column("v").to_pylist()) == [1, 1, 2, 2, 3, 3, 4, 4]


@pytest.mark.parametrize("data", [
    pd.concat([pd.DataFrame({"ts": T, "v": [1, 2]}), pd.DataFrame({"v": [10, 20]})], axis=1),
    pa.table([pa.array(T), pa.array([1, 2]), pa.array([10, 20])], names=["ts", "v", "v"]),
    pa.record_batch([pa.array(T), pa.array([1, 2]), pa.array([10, 20])], names=["ts", "v", "v"]),
], ids=["pandas", "table", "batch"])
def test_a_field_given_twice_is_refused_naming_it(data):
    """pandas raised a bare KeyError(0); a pyarrow Table kept the last of the two columns without a word."""
    with cep.Engine.local(workers=0) as e:
        e.deploy(passthrough("ts timestamp, v int64"))
        with pytest.raises(cep.InputError) as err:
            e.send("ev", data)
        assert err.value.code == "DUPLICATE_FIELD"
        assert str(err.value) == "stream 'ev': field 'v' is given twice; send each field once"
        assert e.metrics()["sequence"] == 0


@pytest.mark.parametrize("dtype,field", [
    ("int8", "int64"), ("int16", "int64"), ("uint8", "int64"), ("uint16", "int32"), ("uint32", "int64"),
    ("int8", "float64"), ("float16", "float64"), ("float16", "float32"), ("uint64", "int64"),
])
def test_narrower_numbers_are_widened_exactly(dtype, field):
    """int8 .. uint32 into int64, float16 into float64 were refused while int64 into int32 was taken."""
    values = np.array([0, 1, 100, 127], dtype)
    with cep.Engine.local(workers=0) as e:
        e.deploy(passthrough(f"ts timestamp, v {field}"))
        e.send("ev", pd.DataFrame({"ts": np.repeat(T[:1], 4), "v": values}))
        got = e.collect("o").column("v")
        assert str(got.type) == {"float64": "double", "float32": "float"}.get(field, field)
        assert got.to_pylist() == values.astype(np.float64).tolist()


def test_an_unsigned_value_past_int64_is_refused_naming_its_row():
    with cep.Engine.local(workers=0) as e:
        e.deploy(passthrough("ts timestamp, v int64"))
        with pytest.raises(cep.InputError) as err:
            e.send("ev", {"ts": T, "v": np.array([1, 2 ** 63], np.uint64)})
        assert err.value.code == "TYPE" and "'v'" in str(err.value) and "row 1" in str(err.value)


def test_a_float_past_float32s_range_is_refused_naming_its_row():
    """1e300 into a float32 field became inf without a word, where int64 past int32 is refused."""
    with cep.Engine.local(workers=0) as e:
        e.deploy(passthrough("ts timestamp, g float32"))
        with pytest.raises(cep.InputError) as err:
            e.send("ev", pd.DataFrame({"ts": T, "g": [1.5, -1e300]}))
        assert err.value.code == "TYPE"
        assert str(err.value) == ("stream 'ev': field 'g': row 1 is -1e+300, out of float32's range "
                                  "(+-3.40282e+38); declare the field float64")
        e.send("ev", {"ts": np.repeat(T[:1], 4), "g": [3.4e38, np.inf, np.nan, None]})  # in range, or not finite
        assert e.collect("o").column("g").to_pylist()[:2] == [pytest.approx(3.4e38, rel=1e-6), np.inf]


@pytest.mark.parametrize("values,words", [
    ([10, 20, None, 40], "(row 2 is missing: pandas holds integers with missing values as floats; send a nullable "
                         "integer column, e.g. df['v'].astype(\"Int64\"))"),
    ([10, 20, 30.5, 40], "(row 2: 30.5)"),
    ([10.0, 20.0, 30.0, 40.0], "(whole numbers: cast the column, e.g. df['v'].astype(\"int64\"))"),
])
def test_floats_sent_to_an_integer_field_name_the_row_in_the_way(values, words):
    """pandas makes an integer column with a missing value float64: the error said only "expects int64,
    got float64", naming no row."""
    frame = pd.DataFrame({"ts": np.repeat(T[:1], 4), "v": values}, index=[5, 6, 7, 8])
    with cep.Engine.local(workers=0) as e:
        e.deploy(passthrough("ts timestamp, v int64"))
        with pytest.raises(cep.InputError) as err:
            e.send("ev", frame)
        assert str(err.value) == f"stream 'ev': field 'v' expects int64, got float64 {words}"
        e.send("ev", frame.astype({"v": "Int64"}) if None in values else frame.iloc[:2].astype({"v": "int64"}))
        assert e.collect("o").column("v").to_pylist() == ([10, 20, None, 40] if None in values else [10, 20])


@pytest.mark.parametrize("field, values, words", [
    ("string", [5, "b", "c"], "expects string, got int at row 0: 5"),
    ("int64", [1, "x", 3], "expects int64, got str at row 1: 'x'"),
])
def test_an_object_column_of_mixed_types_names_the_value_in_the_way(field, values, words):
    """[5, "b", "c"] into a string field said "Could not convert 'b' with type str: tried to convert to
    int64": Arrow's guess from the first value, blaming a value that was right."""
    frame = pd.DataFrame({"ts": np.repeat(T[:1], 3), "v": np.array(values, dtype=object)}, index=[7, 8, 9])
    with cep.Engine.local(workers=0) as e:
        e.deploy(passthrough(f"ts timestamp, v {field}"))
        with pytest.raises(cep.InputError) as err:
            e.send("ev", frame)
        assert err.value.code == "TYPE" and str(err.value) == f"stream 'ev': field 'v' {words}"
