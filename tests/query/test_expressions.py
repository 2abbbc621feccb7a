"""Expression typing: result types, and errors that name the expression."""

import datetime as dt

import numpy as np
import pandas as pd
import pytest

import sparkcep as cep
from sparkcep import col, lit
from sparkcep.schema import Schema

S = Schema("k string, ts timestamp, i int32, v int64, x float64, f float32, b bool")


@pytest.mark.parametrize("expr,want", [
    (col("v") + 1, "int64"), (col("i") * col("v"), "int64"), (col("v") - col("x"), "float64"),
    (col("v") / 2, "float64"), (col("i") / col("i"), "float64"), (col("v") % 3, "int64"),
    (col("f") + 1, "float64"), (col("x") % 2.5, "float64"), (-col("v"), "int64"),
    (col("ts") + 1, "int64"), (col("ts") - col("v"), "int64"), (col("ts") - col("ts"), "int64"),
    (col("v") > 1, "bool"), (col("k") == "a", "bool"), (col("k") < col("k"), "bool"),
    (col("ts") >= lit(dt.datetime(2024, 1, 1)), "bool"), (col("ts") > col("v"), "bool"),
    ((col("v") > 1) & col("b"), "bool"), (col("b") | ~col("b"), "bool"), (~(col("x") < 0), "bool"),
    (col("k").is_null(), "bool"), (col("k").startswith("10."), "bool"), (col("x").is_null(), "bool"),
    (col("v") + lit(None), "int64"), (col("x") * lit(None), "float64"), (col("v") == lit(None), "bool"),
    (col("b") & lit(None), "bool"), (col("v") / lit(None), "float64"),
    (1 + col("v"), "int64"), (10 - col("x"), "float64"), (2 * col("v"), "int64"), (1 / col("v"), "float64"),
])
def test_result_types(expr, want):
    assert expr.type(S) == want


@pytest.mark.parametrize("make", [
    lambda: col("k") + 1, lambda: col("k") * col("k"), lambda: col("b") + 1, lambda: col("ts") * 2,
    lambda: col("k") == 1, lambda: col("k") < col("v"),
    lambda: col("b") == col("v"), lambda: col("v") & col("b"), lambda: col("b") | col("k"),
    lambda: ~col("v"), lambda: col("v").startswith("1"), lambda: col("ts") + 1.5,
    lambda: col("nope") > 1,
])
def test_type_errors_are_schema_errors(make):
    with pytest.raises(cep.SchemaError):
        make().type(S)


def test_type_error_message_shows_types_and_expression():
    with pytest.raises(cep.SchemaError, match=r"cannot apply '\+' to string and int64 in \(col\('k'\) \+ 1\)"):
        (col("k") + 1).type(S)
    with pytest.raises(cep.SchemaError, match="cannot compare string with int64"):
        (col("k") == 1).type(S)
    with pytest.raises(cep.SchemaError, match="unknown field 'nope'"):
        (col("nope") + 1).type(S)


def test_expressions_have_no_truth_value():
    with pytest.raises(cep.QueryError, match="& | ~"):
        bool(col("v") > 1)
    with pytest.raises(cep.QueryError):
        (col("v") > 1) and (col("v") < 3)  # noqa: B015


def test_bad_literals_and_arguments():
    with pytest.raises(cep.QueryError):
        lit([1, 2])
    with pytest.raises(cep.QueryError):
        col(3)
    with pytest.raises(cep.QueryError):
        col("k").startswith(1)


@pytest.mark.parametrize("make,says", [
    (lambda: col("v") > 10**20, "integer literal 100000000000000000000 does not fit in int64"),
    (lambda: col("v") == 2**63, "integer literal 9223372036854775808 does not fit in int64"),
    (lambda: col("v") * np.uint64(2**64 - 1), "integer literal 18446744073709551615 does not fit in int64"),
    (lambda: col("k").split_part(",", 2**40), "must be <= 2147483647, got 1099511627776"),
])
def test_a_number_past_the_engine_s_integers_is_refused_where_the_query_is_written(make, says):
    """They failed the deployment at its first row: numba's TypingError, or Python's OverflowError."""
    with pytest.raises(cep.QueryError) as e:
        make()
    assert says in str(e.value)


def test_the_largest_int64_literals_are_taken():
    assert lit(2**63 - 1).value == 2**63 - 1 and lit(np.int64(-2**63)).value == -2**63


def test_datetime_literals_are_utc_microseconds():
    assert lit(dt.datetime(1970, 1, 1, 0, 0, 1)).value == 1_000_000
    aware = dt.datetime(1970, 1, 1, 1, 0, 0, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert lit(aware).value == 0
    assert repr(col("ts") >= dt.datetime(2024, 1, 1, 0, 0, 1, 500)) == "(col('ts') >= timestamp('2024-01-01 00:00:01.000500'))"


T = pd.Timestamp("2024-01-01")


@pytest.mark.parametrize("finer", [T + pd.Timedelta(500, "ns"), (T + pd.Timedelta(1, "ns")).tz_localize("UTC"),
                                   np.datetime64("2024-01-01T00:00:00.000000500"),
                                   np.datetime64("1970-01-01T00:00:00.000000000001", "ps")], ids=repr)
def test_a_time_literal_finer_than_a_microsecond_is_refused(finer):
    """col("ts") == T + 500ns was taken as col("ts") == T: the nanoseconds were truncated, and the row at T
    compared equal where pandas says it does not."""
    with pytest.raises(cep.QueryError, match=r"is finer than the microseconds the engine keeps; round it first") as e:
        col("ts") == finer
    assert repr(finer) in str(e.value)


def test_time_literals_in_whole_microseconds_compare_as_pandas_does():
    df = pd.DataFrame({"ts": [T, T + pd.Timedelta(1, "us"), T + pd.Timedelta(2, "us")], "v": [1, 2, 3]})
    at = {"pd": T + pd.Timedelta(1000, "ns"), "np": np.datetime64("2024-01-01T00:00:00.000001000", "ns")}
    q = cep.Query("q")
    s = q.stream("ev", "ts timestamp, v int64")
    q.output("o", s.map(v="v", **{f"{op}_{k}": f(col("ts"), t) for k, t in at.items()
                                  for op, f in (("eq", lambda c, t: c == t), ("ge", lambda c, t: c >= t))}))
    with cep.Engine.local(workers=0) as e:
        e.deploy(q)
        e.send("ev", df)
        got = e.collect("o").to_pandas().sort_values("v")
    for k, t in at.items():
        assert got[f"eq_{k}"].tolist() == (df.ts == t).tolist() == [False, True, False]
        assert got[f"ge_{k}"].tolist() == (df.ts >= t).tolist()


def test_repr_is_readable():
    e = (col("bytes") / 1024 > 1) & ~col("ip").startswith("10.")
    assert repr(e) == "((col('bytes') / 1024) > 1) & ~col('ip').startswith('10.')"


def _query():
    q = cep.Query("q")
    return q, q.stream("ev", "k string, ts timestamp, v int64, x float64, b bool")


def test_operators_check_their_expressions():
    q, s = _query()
    with pytest.raises(cep.QueryError, match="bool expression"):
        s.filter(col("v") + 1)
    with pytest.raises(cep.SchemaError):
        s.filter(col("k") > 1)
    with pytest.raises(cep.SchemaError, match="bare null"):
        s.map(n=lit(None))
    with pytest.raises(cep.QueryError):
        s.map()
    with pytest.raises(cep.QueryError):
        s.map(v=3)
    with pytest.raises(cep.SchemaError, match="unknown field"):
        s.map(v="nope")
    with pytest.raises(cep.QueryError):
        s.demux()
    m = s.map(k="k", kb=col("v") / 1024, big=col("x") > 1.5, t="ts", t1=col("ts") + 1)
    assert m.schema.fields == {"k": "string", "kb": "float64", "big": "bool", "t": "timestamp", "t1": "int64"}


def test_a_stateful_operator_without_schema_is_refused_naming_what_to_define():
    """It raised a bare AttributeError ("'NoSchema' object has no attribute 'schema'")."""
    class NoSchema(cep.StatefulOperator):
        def process(self, batch, bins, state):
            return None

    class Counts(NoSchema):
        schema = "k string, n int64"

    q, s = _query()
    with pytest.raises(cep.QueryError, match=r"NoSchema defines no `schema`; a StatefulOperator subclass must define"):
        s.stateful(NoSchema(), by="k")
    assert s.stateful(Counts(), by="k").schema.fields == {"k": "string", "n": "int64"}


def test_aggregate_function_types_and_errors():
    q, s = _query()
    a = s.aggregate(cep.TimeWindow("10s"), by=["k"], n=cep.count(), c=cep.count("x"), sv=cep.sum("v"),
                    sx=cep.sum("x"), av=cep.avg("v"), mn=cep.min("k"), mx=cep.max("ts"), f=cep.first("b"),
                    l=cep.last("x"))
    assert a.schema.fields == {"window_start": "timestamp", "window_end": "timestamp", "k": "string",
                               "n": "int64", "c": "int64", "sv": "int64", "sx": "float64", "av": "float64",
                               "mn": "string", "mx": "timestamp", "f": "bool", "l": "float64"}
    t = s.aggregate(cep.TupleWindow(5), n=cep.count())
    assert t.schema.fields == {"window_start": "int64", "window_end": "int64", "n": "int64"}
    with pytest.raises(cep.SchemaError, match="numeric"):
        s.aggregate(cep.TimeWindow("1s"), sk=cep.sum("k"))
    with pytest.raises(cep.SchemaError, match="numeric"):
        s.aggregate(cep.TimeWindow("1s"), a=cep.avg("b"))
    with pytest.raises(cep.SchemaError, match="unknown field"):
        s.aggregate(cep.TimeWindow("1s"), a=cep.max("nope"))
    with pytest.raises(cep.SchemaError, match="unknown field"):
        s.aggregate(cep.TimeWindow("1s"), by=["nope"], n=cep.count())
    with pytest.raises(cep.QueryError, match="clashes"):
        s.aggregate(cep.TimeWindow("1s"), by=["k"], k=cep.count())
    with pytest.raises(cep.QueryError, match="at least one function"):
        s.aggregate(cep.TimeWindow("1s"), by=["k"])
    with pytest.raises(cep.QueryError):
        s.aggregate("10s", n=cep.count())
    with pytest.raises(cep.QueryError):
        s.aggregate(cep.TimeWindow("1s"), n=len)


def test_time_window_needs_event_time():
    q = cep.Query("q")
    s = q.stream("ev", "k string, v int64")
    with pytest.raises(cep.QueryError, match="event-time"):
        s.aggregate(cep.TimeWindow("1s"), n=cep.count())
    s.aggregate(cep.TupleWindow(2), n=cep.count())  # fine without a time field
    other = q.stream("o", "k string, ts timestamp")
    with pytest.raises(cep.QueryError, match="event-time"):
        other.join(s, cep.TimeWindow("1s"), on="k")


def test_join_output_names_and_where_typing():
    q = cep.Query("q")
    l = q.stream("l", "k string, ts timestamp, v int64, a string")
    r = q.stream("r", "k string, ts timestamp, v float64, b bool")
    j = l.join(r, cep.TimeWindow("10s"), on="k", where=col("v_left") < col("v_right"))
    assert j.schema.names == ["window_start", "window_end", "k", "ts_left", "v_left", "a", "ts_right",
                              "v_right", "b"]
    j2 = l.join(r, cep.TimeWindow("10s"))
    assert j2.schema.names == ["window_start", "window_end", "k_left", "ts_left", "v_left", "a", "k_right",
                               "ts_right", "v_right", "b"]
    r2 = q.stream("r2", "id string, ts timestamp, w int64")
    j3 = l.join(r2, cep.TimeWindow("10s"), on=[("k", "id")])
    assert j3.schema.names == ["window_start", "window_end", "k", "ts_left", "v", "a", "id", "ts_right", "w"]
    with pytest.raises(cep.SchemaError, match="unknown field 'v'"):
        l.join(r, cep.TimeWindow("10s"), on="k", where=col("v") > 1)  # 'v' is ambiguous: not an output field
    with pytest.raises(cep.QueryError, match="where="):
        l.join(r, cep.TimeWindow("10s"), on="k", where=col("v_left") + 1)
    with pytest.raises(cep.SchemaError, match="different types"):
        l.join(r, cep.TimeWindow("10s"), on=[("k", "b")])
    with pytest.raises(cep.SchemaError, match="unknown field"):
        l.join(r, cep.TimeWindow("10s"), on="nope")
    with pytest.raises(cep.QueryError, match="TimeWindow"):
        l.join(r, cep.TupleWindow(3), on="k")


def test_union_needs_same_schema_and_same_query():
    q = cep.Query("q")
    a = q.stream("a", "k string, ts timestamp")
    b = q.stream("b", "k string, ts timestamp, v int64")
    with pytest.raises(cep.SchemaError, match="same schema"):
        a.union(b)
    other = cep.Query("other").stream("c", "k string, ts timestamp")
    with pytest.raises(cep.QueryError, match="another query"):
        a.union(other)
