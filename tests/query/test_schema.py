"""Schemas: every accepted spelling, type names, and the errors for bad ones."""

import pyarrow as pa
import pytest

import sparkcep as cep
from sparkcep.schema import Schema


def test_ddl_string_keeps_order_and_types():
    s = Schema("ip string, ts timestamp, bytes int64, ratio double, ok boolean, n int")
    assert s.names == ["ip", "ts", "bytes", "ratio", "ok", "n"]
    assert s.fields == {"ip": "string", "ts": "timestamp", "bytes": "int64", "ratio": "float64",
                        "ok": "bool", "n": "int32"}


@pytest.mark.parametrize("alias,canonical", [
    ("str", "string"), ("varchar", "string"), ("long", "int64"), ("bigint", "int64"), ("int", "int32"),
    ("integer", "int32"), ("double", "float64"), ("float", "float32"), ("boolean", "bool"),
    ("timestamp_us", "timestamp"), ("STRING", "string"), ("Int64", "int64"),
])
def test_type_aliases(alias, canonical):
    assert Schema(f"x {alias}").fields["x"] == canonical


def test_ddl_tolerates_whitespace():
    assert Schema("  a  string ,\n b   int64 ").fields == {"a": "string", "b": "int64"}


def test_pyarrow_schema():
    s = Schema(pa.schema([("k", pa.string()), ("t", pa.timestamp("us")), ("v", pa.float32()),
                          ("big", pa.large_string()), ("view", pa.string_view()), ("ms", pa.timestamp("ms"))]))
    assert s.fields == {"k": "string", "t": "timestamp", "v": "float32", "big": "string", "view": "string",
                        "ms": "timestamp"}


def test_dict_of_names_and_arrow_types():
    s = Schema({"k": "string", "v": pa.int64(), "b": "bool"})
    assert s.fields == {"k": "string", "v": "int64", "b": "bool"}


def test_round_trip_to_arrow_and_equality():
    s = Schema("k string, ts timestamp, v int64, x float64, b bool, i int32, f float32")
    arrow = s.to_arrow()
    assert arrow.field("ts").type == pa.timestamp("us")
    assert arrow.field("i").type == pa.int32()
    assert Schema(arrow) == s
    assert Schema(dict(s.fields)) == s
    assert Schema("k string") != Schema("k int64")


def test_time_field_is_first_timestamp():
    assert Schema("k string, a timestamp, b timestamp").time_field() == "a"
    assert Schema("k string").time_field() is None


@pytest.mark.parametrize("bad", [
    "k strin", "k", "k string int64", "k string, k int64", "", "__seq int64", "k string,, v int64",
    "k decimal",
])
def test_bad_ddl_is_a_schema_error(bad):
    with pytest.raises(cep.SchemaError) as e:
        Schema(bad)
    assert e.value.code == "SCHEMA"


def test_errors_name_the_problem():
    with pytest.raises(cep.SchemaError, match="'k' appears twice"):
        Schema("k string, k int64")
    with pytest.raises(cep.SchemaError, match="unknown type 'strin'"):
        Schema("k strin")
    with pytest.raises(cep.SchemaError, match="reserved"):
        Schema({"__ts": "int64"})
    with pytest.raises(cep.SchemaError, match="unsupported type"):
        Schema(pa.schema([("d", pa.decimal128(10, 2))]))
    with pytest.raises(cep.SchemaError):
        Schema(42)
    with pytest.raises(cep.SchemaError):
        Schema({})


@pytest.mark.parametrize("spelling", [
    {"__seq": "int64", "ts": "timestamp"}, "__seq int64, ts timestamp",
    pa.schema([("__seq", pa.int64()), ("ts", pa.timestamp("us"))]),
    "a int64, a int32", pa.schema([("a", pa.int64()), ("a", pa.int32())]),
], ids=["dict reserved", "DDL reserved", "pyarrow reserved", "DDL twice", "pyarrow twice"])
def test_every_spelling_checks_its_names_alike(spelling):
    """A pyarrow schema took a field given twice (the last type won) and the reserved '__seq' (a send then
    raised KeyError), where the dict and DDL spellings refuse them."""
    with pytest.raises(cep.SchemaError, match=r"field 'a' appears twice|invalid field name '__seq' .*reserved"):
        Schema(spelling)


def test_a_type_that_is_no_name_is_a_schema_error():
    """Schema({"a": 5}) raised AttributeError ('int' object has no attribute 'strip')."""
    with pytest.raises(cep.SchemaError, match=r"unknown type 5; supported: string, int64"):
        Schema({"a": 5})


def test_type_of_names_the_field_and_context():
    s = Schema("k string")
    with pytest.raises(cep.SchemaError, match=r"unknown field 'nope' in here; fields are \['k'\]"):
        s.type_of("nope", "here")


def test_query_stream_accepts_every_spelling_and_checks_time_field():
    q = cep.Query("q")
    a = q.stream("a", "k string, ts timestamp")
    b = q.stream("b", {"k": "string", "ts": "timestamp"})
    c = q.stream("c", pa.schema([("k", pa.string()), ("ts", pa.timestamp("us"))]))
    assert a.schema == b.schema == c.schema
    assert q.sources["a"].time_field == "ts"
    d = q.stream("d", "k string, t1 timestamp, t2 timestamp", time="t2")
    assert d.op.time_field == "t2"
    with pytest.raises(cep.SchemaError, match="must be a timestamp"):
        q.stream("e", "k string, n int64", time="n")
    with pytest.raises(cep.SchemaError, match="unknown field"):
        q.stream("f", "k string", time="nope")
    with pytest.raises(cep.QueryError, match="declared twice"):
        q.stream("a", "k string")
