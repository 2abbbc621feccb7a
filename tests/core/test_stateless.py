"""Map, Filter, Demux, Union, Apply and expression evaluation, against the reference."""

import datetime as dt
import itertools
import operator
import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import reference as ref
import sparkcep as cep
from cases import T0, cep_expr
from harness import run, stamped
from reference import S, assert_same_rows
from sparkcep.core import columns

SCHEMA = {"k": "string", "ts": "timestamp", "v": "int64", "w": "int64", "x": "float64", "b": "bool", "c": "bool"}
TRI = [True, False, None]


def rows_3vl():
    """Every combination of true/false/null for b and c, with numbers and strings beside."""
    ks = ["10.0.0.1", "10.0.0.10", "10.0.0.100", "10.0.0.2", "", "é", "Z", None, "10.", "a"]
    vs = [7, -7, 0, None, 3, -3, 10, 1, 2, -1]
    out = []
    for i, (b, c) in enumerate(itertools.product(TRI, TRI)):
        out.append({"k": ks[i % len(ks)], "ts": T0 + i * S, "v": vs[i % len(vs)], "w": vs[(i + 3) % len(vs)],
                    "x": [1.5, -2.25, 0.0, None, 10.0][i % 5], "b": b, "c": c})
    for i in range(30):
        out.append({"k": ks[i % len(ks)], "ts": T0 + i * S, "v": vs[i % len(vs)], "w": vs[(i * 7) % len(vs)],
                    "x": [1.5, -2.25, 0.0, None, 10.0, -0.5][i % 6], "b": TRI[i % 3], "c": TRI[(i // 3) % 3]})
    return out


def run_map(fields: dict, rows=None, parallelism=1):
    rows = rows or rows_3vl()
    q = cep.Query("m")
    s = q.stream("ev", SCHEMA)
    q.output("out", s.map(**{k: cep_expr(e) for k, e in fields.items()}))
    got = run(q, [("ev", rows)], parallelism=parallelism).outputs["out"]
    want = ref.frame(ref.map_rows(stamped(q, [("ev", rows)])["ev"], fields), fields)
    return got, want


C, L, B = ref.Col, ref.Lit, ref.Bin


@pytest.mark.parametrize("name,expr", [
    ("and", B("&", C("b"), C("c"))), ("or", B("|", C("b"), C("c"))), ("not", ref.Not(C("b"))),
    ("and_lit_null", B("&", C("b"), L(None))), ("or_lit_null", B("|", L(None), C("c"))),
    ("isnull", ref.IsNull(C("b"))), ("not_isnull", ref.Not(ref.IsNull(C("k")))),
    ("nested", ref.Not(B("|", B("&", C("b"), ref.Not(C("c"))), B(">", C("v"), L(0))))),
    ("not_null", ref.Not(L(None))), ("null_and_false", B("&", L(None), L(False))),
])
def test_three_valued_logic(name, expr):
    got, want = run_map({"r": expr})
    assert_same_rows(got, want, name)


@pytest.mark.parametrize("op", ["+", "-", "*", "/", "%"])
@pytest.mark.parametrize("right", [C("w"), L(0), L(3), L(-2), C("x"), L(0.5), L(None)])
def test_arithmetic_nulls_and_division_by_zero(op, right):
    got, want = run_map({"r": B(op, C("v"), right), "f": B(op, C("x"), right)})
    assert_same_rows(got, want, f"v {op} {right!r}")


def test_division_by_zero_is_null_not_inf():
    rows = [{"k": "a", "ts": T0, "v": 1, "w": 0, "x": 0.0, "b": True, "c": True}]
    got, _ = run_map({"d": B("/", C("v"), C("w")), "m": B("%", C("v"), C("w")), "fd": B("/", C("x"), C("x")),
                      "fm": B("%", C("v"), C("x"))}, rows)
    assert got.iloc[0].tolist() == [None, None, None, None]


def test_modulo_takes_the_sign_of_the_divisor():
    rows = [{"k": "a", "ts": T0, "v": -7, "w": 3, "x": -7.5, "b": True, "c": True}]
    got, _ = run_map({"m": B("%", C("v"), C("w")), "n": B("%", C("w"), L(-2)), "f": B("%", C("x"), L(2))}, rows)
    assert got.iloc[0].tolist() == [2, -1, 0.5]


@pytest.mark.parametrize("op", ["==", "!=", "<", "<=", ">", ">="])
def test_comparisons(op):
    fields = {"s": B(op, C("k"), L("10.0.0.1")), "ss": B(op, C("k"), C("k")), "ls": B(op, L("10.0.0.10"), C("k")),
              "n": B(op, C("v"), C("w")), "f": B(op, C("x"), C("v")), "bb": B(op, C("b"), C("c")),
              "t": B(op, C("ts"), L(T0 + 3 * S)), "lits": B(op, L("10.0.0.1"), L("10.0.0.10")),
              "nums": B(op, L(2), L(2.5))}
    got, want = run_map(fields)
    assert_same_rows(got, want, op)


@pytest.mark.parametrize("expr", [
    B("==", C("k"), L(None)), B("<", L(None), C("k")), B("!=", C("v"), L(None)), B("+", C("x"), L(None)),
    ref.StartsWith(C("k"), "1"),
])
def test_null_literal_makes_null(expr):
    got, want = run_map({"r": expr})
    assert_same_rows(got, want, repr(expr))


@pytest.mark.parametrize("cond", [B("&", C("b"), L(None)), ref.Not(L(None)), B("|", C("c"), L(None)),
                                  B("==", C("k"), L(None))])
def test_filter_on_null_literal_logic(cond):
    rows = rows_3vl()
    q = filter_query(cond)
    got = run(q, [("ev", rows)]).outputs["out"]
    assert_same_rows(got, ref.frame(ref.filter_rows(stamped(q, [("ev", rows)])["ev"], cond), SCHEMA))


def test_string_order_is_bytewise_and_prefixes_are_not_equal():
    rows = [{"k": k, "ts": T0, "v": 0, "w": 0, "x": 0.0, "b": True, "c": True}
            for k in ["10.0.0.1", "10.0.0.10", "10.0.0.2", "é", "z", "Z", "", None]]
    got, _ = run_map({"k": C("k"), "lt": B("<", C("k"), L("10.0.0.10")), "eq": B("==", C("k"), L("10.0.0.1")),
                      "sw": ref.StartsWith(C("k"), "10.0.0.1"), "after_z": B(">", C("k"), L("z"))}, rows)
    table = {r[0]: r[1:] for r in got.itertuples(index=False, name=None)}
    assert table["10.0.0.1"] == (True, True, True, False)
    assert table["10.0.0.10"] == (False, False, True, False)
    assert table["10.0.0.2"] == (False, False, False, False)
    assert table["é"] == (False, False, False, True)  # UTF-8 0xC3 sorts after 'z'
    assert table["Z"] == (False, False, False, False)
    assert table[""] == (True, False, False, False)
    assert table[None] == (None, None, None, None)


@pytest.mark.parametrize("prefix", ["10.0.0.1", "10.", "", "é", "10.0.0.100", "x"])
def test_startswith(prefix):
    got, want = run_map({"r": ref.StartsWith(C("k"), prefix), "lit": ref.StartsWith(L("10.0.0.10"), prefix)})
    assert_same_rows(got, want, prefix)


def test_map_projects_exactly_and_keeps_types():
    got, want = run_map({"k": C("k"), "kb": B("/", C("v"), L(1024)), "big": B(">", C("x"), L(1.0)),
                         "t": C("ts"), "tplus": B("+", C("ts"), L(1))})
    assert_same_rows(got, want)
    q = cep.Query("m")
    s = q.stream("ev", SCHEMA)
    q.output("out", s.map(k="k", t="ts", n=cep.col("v") + 1))
    table = run(q, [("ev", rows_3vl())]).arrow["out"]
    assert table.schema == pa.schema([("k", pa.string()), ("t", pa.timestamp("us")), ("n", pa.int64())])


NARROW = {"ts": "timestamp", "i": "int32", "j": "int32", "f": "float32", "g": "float32"}
OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv, "%": operator.mod}


@pytest.mark.parametrize("op", list(OPS))
def test_narrow_operands_compute_in_the_declared_type(op):
    """int32 and float32 operands compute in int64 / float64, the type the map declares, as numpy does in
    those types: an int32 sum or product does not wrap around, a float32 one is not rounded first."""
    data = {"i": np.array([2**31 - 1, -2**31, 100000, -7, 46341, 5], np.int32),
            "j": np.array([1, -1, 100000, 2, -46341, 0], np.int32),
            "f": np.array([3e38, 0.1, -1.5, 16777217, -1e-10, 2.5], np.float32),
            "g": np.array([3e38, 0.2, 1e-7, 1, 7, 0], np.float32)}
    wide = {k: v.astype(np.float64 if v.dtype.kind == "f" else np.int64) for k, v in data.items()}
    pairs = {"ij": ("i", "j"), "ji": ("j", "i"), "if": ("i", "f"), "fg": ("f", "g"), "i7": ("i", 7), "3j": (3, "j"),
             "fhalf": ("f", 0.5)}
    q = cep.Query("m")
    s = q.stream("ev", NARROW)
    q.output("out", s.map(**{name: OPS[op](*(cep.col(x) if x in data else cep.lit(x) for x in pair))
                             for name, pair in pairs.items()}))
    rows = [{"ts": T0 + n * S, **{k: v[n].item() for k, v in data.items()}} for n in range(6)]
    got = run(q, [("ev", rows)]).outputs["out"]
    for name, pair in pairs.items():
        a, b = (wide[x] if x in data else np.full(6, x) for x in pair)
        zero = (b == 0) & (op in "/%")  # null
        with np.errstate(all="ignore"):
            want = OPS[op](a, np.where(zero, 1, b))
        assert want.dtype == q.outputs["out"].schema.fields[name]
        assert got[name].tolist() == [None if z else w.item() for w, z in zip(want, zero)], f"{pair} {op}"


def test_string_literal_in_map():
    got, _ = run_map({"tag": L("hello"), "k": C("k")})
    assert set(got["tag"]) == {"hello"}


def test_numpy_scalars_are_the_literals_they_hold():
    """np.int64(2) in an expression is the literal 2 (numpy scalars are what pandas and numpy code holds)."""
    def query(two, half, when):
        q = cep.Query("m")
        s = q.stream("ev", SCHEMA)
        q.output("out", s.filter((cep.col("x") > half) | (cep.col("ts") >= when))
                 .map(k="k", r=cep.col("v") * two - cep.lit(two), f=cep.col("x") + half, b=cep.lit(np.bool_(True))))
        return q
    rows = rows_3vl()
    when = dt.datetime(2024, 1, 1) + dt.timedelta(seconds=20)
    got = run(query(np.int64(2), np.float32(0.5), np.datetime64(when, "ns")), [("ev", rows)]).outputs["out"]
    want = run(query(2, 0.5, when), [("ev", rows)]).outputs["out"]
    assert len(want) and 0 < len(want) < len(rows)
    assert_same_rows(got, want)


@pytest.mark.parametrize("nat", [pd.NaT, np.datetime64("NaT"), np.datetime64("NaT", "ns")], ids=repr)
def test_nat_is_the_null_literal(nat):
    """pandas' NaT, as numpy's, is the null literal: a comparison with it is null, a filter on it keeps no row."""
    q = cep.Query("f")
    s = q.stream("ev", SCHEMA)
    q.output("kept", s.filter(cep.col("ts") > nat))
    q.output("compared", s.map(r=cep.col("ts") > nat))
    rows = rows_3vl()
    got = run(q, [("ev", rows)]).outputs
    assert got["kept"].empty
    assert got["compared"]["r"].tolist() == [None] * len(rows)


def filter_query(cond):
    q = cep.Query("f")
    s = q.stream("ev", SCHEMA)
    q.output("out", s.filter(cep_expr(cond)))
    return q


@pytest.mark.parametrize("cond", [
    C("b"), ref.Not(C("b")), B("&", C("b"), C("c")), B("|", C("b"), C("c")), ref.IsNull(C("x")),
    B(">", B("/", C("v"), C("w")), L(0)), B("==", B("%", C("v"), L(2)), L(0)),
    ref.StartsWith(C("k"), "10.0.0.1"), B("<", C("k"), L("10.0.0.2")),
])
@pytest.mark.parametrize("parallelism", [1, 3])
def test_filter_keeps_only_true(cond, parallelism):
    rows = rows_3vl()
    q = filter_query(cond)
    got = run(q, [("ev", rows[:17]), ("ev", rows[17:])], parallelism=parallelism).outputs["out"]
    want = ref.frame(ref.filter_rows(stamped(q, [("ev", rows)])["ev"], cond), SCHEMA)
    assert_same_rows(got, want, repr(cond))


def test_demux_sends_a_tuple_to_every_matching_branch_and_union_merges():
    rows = rows_3vl()
    conds = [C("b"), C("c"), ref.IsNull(C("v"))]
    q = cep.Query("d")
    s = q.stream("ev", SCHEMA)
    b1, b2, b3 = s.demux(*[cep_expr(c) for c in conds])
    q.output("one", b1)
    q.output("two", b2)
    q.output("all", b1.union(b2, b3))
    got = run(q, [("ev", rows)], parallelism=2).outputs
    st = stamped(q, [("ev", rows)])["ev"]
    r1, r2, r3 = ref.demux_rows(st, *conds)
    assert_same_rows(got["one"], ref.frame(r1, SCHEMA), "one")
    assert_same_rows(got["two"], ref.frame(r2, SCHEMA), "two")
    assert_same_rows(got["all"], ref.frame(r1 + r2 + r3, SCHEMA), "all")


def test_union_of_two_source_streams():
    a_rows = rows_3vl()[:20]
    b_rows = rows_3vl()[20:]
    q = cep.Query("u")
    a, b = q.stream("a", SCHEMA), q.stream("b", SCHEMA)
    q.output("out", a.union(b).filter(cep.col("v") > -5))
    sends = [("a", a_rows[:5]), ("b", b_rows[:9]), ("a", a_rows[5:]), ("b", b_rows[9:])]
    got = run(q, sends, parallelism=2).outputs["out"]
    st = stamped(q, sends)
    want = ref.frame(ref.filter_rows(st["a"] + st["b"], B(">", C("v"), L(-5))), SCHEMA)
    assert_same_rows(got, want)


def test_apply_runs_a_user_function_over_batches():
    import pyarrow.compute as pc

    def double(batch):
        return batch.set_column(batch.schema.get_field_index("v"), "v", pc.multiply(batch.column("v"), 2))

    q = cep.Query("a")
    s = q.stream("ev", SCHEMA)
    q.output("out", s.apply(double))
    rows = rows_3vl()
    got = run(q, [("ev", rows[:10]), ("ev", rows[10:])]).outputs["out"]
    want = ref.frame([{**r, "v": None if r["v"] is None else 2 * r["v"]} for r in rows], SCHEMA)
    assert_same_rows(got, want)


class Pairs(cep.StatefulOperator):
    """Emits what ``returns(batch)`` gives: the case under test."""
    schema = "k string, n int64"

    def __init__(self, returns):
        self.returns = returns

    def process(self, batch, bins, state):
        return self.returns(batch)


def _returned(batch, **fields):
    return pa.RecordBatch.from_pydict({"k": ["a"] * batch.num_rows, **fields})


def _with_hidden(out, batch):
    """``out`` with ``batch``'s hidden columns, as an apply() function keeps them."""
    if not isinstance(out, pa.RecordBatch):
        return out
    for name in columns.HIDDEN:
        out = out.append_column(name, batch[name])
    return out


@pytest.mark.parametrize("returns, error", [
    (lambda b: b.to_pandas(), r"the function returned DataFrame, expected a pyarrow.RecordBatch \(or Table, or None\)"),
    (lambda b: _returned(b), r"the returned batch lacks \['n'\] of its schema \['k', 'n'\]"),
    (lambda b: _returned(b, n=["x"] * b.num_rows), r"the returned field 'n' is string, not the int64 its schema"),
], ids=["pandas", "missing", "type"])
def test_what_a_user_operator_returns_is_checked_naming_the_operator(returns, error):
    """A stateful operator returning a DataFrame, a batch without a declared field or of another type raised
    AttributeError, KeyError or ArrowInvalid from the engine's code; apply() said only some of it."""
    for kind, use in [("stateful(Pairs)", lambda s: s.stateful(Pairs(returns), by="k")),
                      ("apply(apply1)", lambda s: s.apply(lambda b: _with_hidden(returns(b), b),
                                                          schema="k string, n int64"))]:
        q = cep.Query("u")
        q.output("out", use(q.stream("ev", SCHEMA)))
        with pytest.raises(cep.EngineError, match=re.escape(kind) + ": " + error):
            run(q, [("ev", rows_3vl())])


def test_apply_without_a_schema_refuses_fields_beyond_the_input():
    """Its output is the input's schema: a field the function added was dropped without a word."""
    import pyarrow.compute as pc
    q = cep.Query("a")
    q.output("out", q.stream("ev", SCHEMA).apply(lambda b: b.append_column("z", pc.multiply(b["v"], 10))))
    with pytest.raises(cep.EngineError, match=r"returned fields \['z'\] beyond its schema .*; declare what it "
                                                 r"returns: apply\(fn, schema=...\)"):
        run(q, [("ev", rows_3vl())])


def test_outputs_carry_no_hidden_columns():
    q = filter_query(C("b"))
    table = run(q, [("ev", rows_3vl())]).arrow["out"]
    assert table.schema.names == list(SCHEMA)
