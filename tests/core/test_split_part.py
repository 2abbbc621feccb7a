"""``split_part``: the kernel and the expression in map/filter, against Python's ``str.split``."""

import numba
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

import sparkcep as cep
from harness import run
from sparkcep.core import columns
from sparkcep.core.split import first_field, split_part


def reference(value, delimiter, part):
    """Spark's ``split_part``, written with ``str.split``."""
    if value is None:
        return None
    if delimiter == "":
        return value if part in (1, -1) else ""
    fields = value.split(delimiter)
    i = part - 1 if part > 0 else len(fields) + part
    return fields[i] if 0 <= i < len(fields) else ""


def kernel(values, delimiter, part, skip=0):
    arr = pa.array(values, pa.string()).slice(skip)
    off, data, valid = columns.strings(arr)
    return columns.string_array(*split_part(off, data, delimiter, part), valid).to_pylist(), arr.to_pylist()


@pytest.mark.parametrize("value,delimiter,part,want", [
    ("a,b,c", ",", 1, "a"), ("a,b,c", ",", 3, "c"), ("a,b,c", ",", 4, ""), ("a,b,c", ",", -1, "c"),
    ("a,b,c", ",", -3, "a"), ("a,b,c", ",", -4, ""), ("a,b,c", "", 1, "a,b,c"), ("a,b,c", "", -1, "a,b,c"),
    ("a,b,c", "", 2, ""), ("", ",", 1, ""), ("", ",", 2, ""), ("a,,b", ",", 2, ""), ("a,", ",", 2, ""),
    ("aXYbXYXYc", "XY", 3, ""), ("aXYbXYXYc", "XY", 4, "c"), ("aaa", "aa", 2, "a"), ("aaa", "aa", -1, "a"),
    ("no comma", ",", 1, "no comma"), ("é,ü", ",", 2, "ü"), ("1.2.3.4,x", ",", 1, "1.2.3.4"),
])
def test_spark_examples(value, delimiter, part, want):
    """The values Spark 4.3 returns for these (``SELECT split_part(...)``)."""
    assert reference(value, delimiter, part) == want
    assert kernel([value], delimiter, part)[0] == [want]


@given(st.lists(st.one_of(st.none(), st.text(alphabet="ab,;é", max_size=40)), max_size=30),
       st.sampled_from([",", ";", "ab", ",,", "é", ""]), st.sampled_from([1, 2, 3, 7, -1, -2, -5]),
       st.integers(0, 3))
def test_kernel_equals_str_split(values, delimiter, part, skip):
    """Words searched 8 bytes at a time, and the bytes near the buffer's end one by one, cut where
    ``str.split`` cuts (sliced arrays and nulls included)."""
    skip = min(skip, len(values))
    got, arr = kernel(values, delimiter, part, skip)
    assert got == [reference(v, delimiter, part) for v in arr]


def test_long_values_and_fields():
    values = ["x" * 100 + "," + "y" * 37 + "," + "z" * 9, "," * 50, "q" * 7 + ",", "w" * 8]
    for part in (1, 2, 3, 50, 51, -1, -51):
        assert kernel(values, ",", part)[0] == [reference(v, ",", part) for v in values]


def test_first_field_of_every_length():
    """The first field's own kernel: fields of 0 to 40 bytes, cut or not, the delimiter in either of
    the two words it loads or past them, and the last strings of the buffer (fewer than 16 bytes
    left after their start)."""
    values = ["a" * n + ",rest" for n in range(41)] + ["b" * n for n in range(41)] + ["é,", ",", ""]
    for skip in (0, 5):
        got, arr = kernel(values, ",", 1, skip)
        assert got == [reference(v, ",", 1) for v in arr]


def test_first_field_prefetches_the_strings_ahead():
    """Each row's first bytes are asked for rows before they are read: without the prefetch, a
    HiBench record's first field took twice as long from memory."""
    off, data, _ = columns.strings(pa.array(["10.0.0.1,x"] * 40))
    fresh = numba.njit(first_field.py_func)  # numba shows no machine code of a kernel loaded from its cache
    assert fresh(off, data, data[8])[0][-1] == 40 * 8
    assert any("prefetch" in asm for asm in fresh.inspect_asm().values())

def test_in_map_and_filter_with_nulls_and_literals():
    rows = [{"v": v, "n": i} for i, v in enumerate(["1.2.3.4,a,b", None, "5.6.7.8", "", ",x", "9.9.9.9,c"])]
    q = cep.Query("split")
    s = q.stream("ev", "v string, n int64")
    kept = s.filter(cep.col("v").split_part(",", 2) != "")
    q.output("ip", s.map(n="n", ip=cep.col("v").split_part(",", 1), last=cep.col("v").split_part(",", -1),
                         lit=cep.lit("p;q").split_part(";", 2)))
    q.output("kept", kept.map(n="n"))
    out = run(q, [("ev", rows)])
    got = out.outputs["ip"].sort_values("n")
    assert got["ip"].tolist() == [reference(r["v"], ",", 1) for r in rows]
    assert got["last"].tolist() == [reference(r["v"], ",", -1) for r in rows]
    assert got["lit"].tolist() == ["q"] * len(rows)
    assert out.arrow["ip"].schema.field("ip").type == pa.string()
    assert sorted(out.outputs["kept"]["n"]) == [0, 4, 5]


def test_typing_and_bad_arguments():
    schema = cep.Schema("v string, n int64")
    assert cep.col("v").split_part(",", 1).type(schema) == "string"
    assert repr(cep.col("v").split_part(",", -2)) == "col('v').split_part(',', -2)"
    with pytest.raises(cep.SchemaError, match="split_part needs a string, got int64"):
        cep.col("n").split_part(",", 1).type(schema)
    for part in (0, 1.0, True, "1"):
        with pytest.raises(cep.QueryError, match="part number"):
            cep.col("v").split_part(",", part)
    with pytest.raises(cep.QueryError, match="str delimiter"):
        cep.col("v").split_part(44, 1)
