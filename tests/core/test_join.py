"""Windowed Join: naming, null keys, window instances, where, firing, parallelism."""

import random

import pyarrow as pa
import pytest

import reference as ref
import sparkcep as cep
from cases import LEFT, RIGHT, T0, cep_expr, cep_window, sides
from harness import run, stamped, table
from reference import S, assert_same_rows
from sparkcep.core import columns
from sparkcep.core.join import WindowJoin

C, B = ref.Col, ref.Bin


def lrow(k, sec, a=None, s=None):
    return {"k": k, "ts": T0 + int(sec * S), "a": a, "s": s}


def rrow(k, sec, b=None, s=None):
    return {"k": k, "ts": T0 + int(sec * S), "b": b, "s": s}


def join_query(window, on=(), where=None, left=LEFT, right=RIGHT):
    q = cep.Query("j")
    l, r = q.stream("l", left), q.stream("r", right)
    q.output("out", l.join(r, cep_window(window), on=list(on) or None,
                           where=None if where is None else cep_expr(where)))
    return q


def check(window, sends, on=(), where=None, parallelism=(1,), left=LEFT, right=RIGHT):
    q = join_query(window, on, where, left, right)
    st = stamped(q, sends)
    want, late = ref.join(st["l"], st["r"], left, right, window, on, where)
    first = None
    for p in parallelism:
        got = run(q, sends, parallelism=p)
        assert_same_rows(got.outputs["out"], want, f"parallelism {p}")
        assert got.late == late, f"late {got.late}, expected {late} (parallelism {p})"
        first = got.outputs["out"] if first is None else first
    return first


def test_output_names_types_and_order():
    q = join_query(ref.Time(10 * S), on=["k"])
    t = run(q, [("l", [lrow("x", 1, 1, "p")]), ("r", [rrow("x", 2, 2, "q")])]).arrow["out"]
    assert t.schema == pa.schema([("window_start", pa.timestamp("us")), ("window_end", pa.timestamp("us")),
                                  ("k", pa.string()), ("ts_left", pa.timestamp("us")), ("a", pa.int64()),
                                  ("s_left", pa.string()), ("ts_right", pa.timestamp("us")), ("b", pa.int64()),
                                  ("s_right", pa.string())])
    assert t.to_pylist()[0]["k"] == "x" and t.num_rows == 1


def test_keys_with_different_names_both_appear():
    right = {"id": "string", "ts": "timestamp", "b": "int64"}
    sends = [("l", [lrow("x", 1, 1), lrow("y", 2, 2)]), ("r", [{"id": "x", "ts": T0 + 3 * S, "b": 9}])]
    got = check(ref.Time(10 * S), sends, on=[("k", "id")], right=right)
    assert list(got.columns) == ["window_start", "window_end", "k", "ts_left", "a", "s", "id", "ts_right", "b"]
    assert got[["k", "id", "a", "b"]].values.tolist() == [["x", "x", 1, 9]]


def test_a_clash_renamed_onto_another_field_is_suffixed_again():
    """Left v_left and v, right v and v_right: the left v renamed v_left overwrote the left v_left (and the
    right v the right v_right), the join's rows silently lost two columns."""
    left = {"k": "string", "ts": "timestamp", "v_left": "int64", "v": "int64"}
    right = {"k": "string", "ts": "timestamp", "v": "int64", "v_right": "int64"}
    sends = [("l", [{"k": "x", "ts": T0 + S, "v_left": 111, "v": 222}]),
             ("r", [{"k": "x", "ts": T0 + 2 * S, "v": 333, "v_right": 444}])]
    got = check(ref.Time(10 * S), sends, on=["k"], left=left, right=right,
                where=B(">", C("v_right"), C("v_left_left")))
    assert list(got.columns) == ["window_start", "window_end", "k", "ts_left", "v_left", "v_left_left", "ts_right",
                                 "v_right_right", "v_right"]
    assert got[["v_left", "v_left_left", "v_right_right", "v_right"]].values.tolist() == [[111, 222, 333, 444]]


def test_joining_three_aggregates_keeps_every_window_column():
    """a.join(b).join(c): c's window_start took the name window_start_right, which the first join already
    has: 12 columns where there are 14."""
    q = cep.Query("j3")
    s, w = q.stream("s", "k string, ts timestamp, x int64"), cep.TimeWindow("10s")
    a, b, c = (s.aggregate(w, by="k", **{name: fn}) for name, fn in
               [("n", cep.count()), ("sx", cep.sum("x")), ("mx", cep.max("x"))])
    j = a.join(b, w, on="k").join(c, w, on="k")
    assert len(set(j.schema.names)) == len(j.schema.names) == 14


@pytest.mark.parametrize("on", [[("k", "k", "k")], [("k",)], [["k"]], 5, {"k": "k"}, [5]], ids=repr)
def test_a_malformed_on_is_refused_naming_it(on):
    """These raised Python's ValueError or TypeError from unpacking pairs."""
    q = cep.Query("j")
    l, r = q.stream("l", LEFT), q.stream("r", RIGHT)
    with pytest.raises(cep.QueryError, match=r"join on=.*: expected a field name, or a list of field names and"):
        l.join(r, cep.TimeWindow("10s"), on=on)


def test_null_keys_never_match_and_prefixes_differ():
    left = [lrow(k, i * 0.1, a=i) for i, k in enumerate([None, "10.0.0.1", "10.0.0.10", "", None])]
    right = [rrow(k, i * 0.1, b=i) for i, k in enumerate([None, "10.0.0.10", "10.0.0.1", "", "10.0.0.100"])]
    got = check(ref.Time(10 * S), [("l", left), ("r", right)], on=["k"], parallelism=(1, 3))
    assert sorted(got[["k", "a", "b"]].values.tolist()) == [["", 3, 3], ["10.0.0.1", 1, 2], ["10.0.0.10", 2, 1]]


def test_a_null_in_any_key_field_never_matches():
    sends = [("l", [lrow("x", 1, s=None), lrow("x", 1, s="p"), lrow(None, 1, s="p")]),
             ("r", [rrow("x", 2, s=None), rrow("x", 2, s="p"), rrow(None, 2, s="p")])]
    got = check(ref.Time(10 * S), sends, on=["k", "s"])
    assert len(got) == 1


def test_a_pair_is_emitted_once_per_window_instance():
    sends = [("l", [lrow("x", 6, a=1)]), ("r", [rrow("x", 7, b=2)])]
    got = check(ref.Time(10 * S, 5 * S), sends, on=["k"])
    assert sorted(got["window_start"] - T0) == [0, 5 * S]  # [0,10) and [5,15) hold both
    sends = [("l", [lrow("x", 4, a=1)]), ("r", [rrow("x", 6, b=2)])]
    got = check(ref.Time(10 * S, 5 * S), sends, on=["k"])
    assert sorted(got["window_start"] - T0) == [0]  # 4 s is not in [5, 15)


def test_where_with_nulls_is_false():
    left = [lrow("x", 1, a=a) for a in (1, 5, None)]
    right = [rrow("x", 2, b=b) for b in (3, None)]
    got = check(ref.Time(10 * S), [("l", left), ("r", right)], on=["k"], where=B("<", C("a"), C("b")))
    assert got[["a", "b"]].values.tolist() == [[1, 3]]


def test_non_equi_join_with_where_only():
    left = [lrow(k, i, a=i) for i, k in enumerate(["x", "y", None, "z"])]
    right = [rrow(k, i + 0.5, b=i) for i, k in enumerate(["y", None, "x"])]
    where = B("|", B("<", C("k_left"), C("k_right")), B(">", C("a"), C("b")))
    check(ref.Time(10 * S), [("l", left), ("r", right)], where=where, parallelism=(1, 2, 4))


def test_cartesian_join_without_key_or_condition():
    left = [lrow("x", i) for i in range(3)]
    right = [rrow("y", i) for i in range(4)]
    got = check(ref.Time(2 * S), [("l", left), ("r", right)], parallelism=(1, 3))
    assert len(got) == 2 * 2 + 1 * 2  # windows [0,2): 2x2, [2,4): 1x2


def test_join_fires_when_both_inputs_pass_the_window_end():
    q = join_query(ref.Time(10 * S), on=["k"])
    with cep.Engine.local() as e:
        e.deploy(q)
        e.send("l", table([lrow("x", 1, a=1)], LEFT))
        e.send("r", table([rrow("x", 2, b=2)], RIGHT))
        e.send("l", table([lrow("x", 30, a=3)], LEFT))
        assert e.collect("out").num_rows == 0  # the right input is still at 2 s
        e.send("r", table([rrow("y", 10, b=4)], RIGHT))
        assert e.collect("out").num_rows == 1
        e.end("l")
        e.end("r")
        assert e.collect("out").num_rows == 1


def test_a_window_the_watermark_left_open_still_fires_for_rows_that_arrive_later():
    """The watermark at 4 s (lateness 1 s) closes the windows ending by 3 s: [0, 4) is still open when
    rows at 3.5 s arrive, and fires at the end. (The join counted every window before the earliest
    one holding rows, [1, 5), as fired.)"""
    sends = [("l", [lrow("x", 4, a=1)]), ("r", [rrow("x", 4, b=1)]),
             ("l", [lrow("x", 3.5, a=2)]), ("r", [rrow("x", 3.5, b=2)])]
    got = check(ref.Time(4 * S, 1 * S, lateness=1 * S), sends, on=["k"], parallelism=(1, 2))
    assert 0 in set(got["window_start"] - T0)


def test_self_join():
    schema = {"k": "string", "ts": "timestamp", "v": "int64"}
    q = cep.Query("self")
    s = q.stream("ev", schema)
    q.output("out", s.join(s, cep.TimeWindow("10s"), on="k", where=cep.col("v_left") < cep.col("v_right")))
    rows = [{"k": k, "ts": T0 + i * S, "v": i} for i, k in enumerate("abaab")]
    st = stamped(q, [("ev", rows)])["ev"]
    want, _ = ref.join(st, st, schema, schema, ref.Time(10 * S), ["k"], B("<", C("v_left"), C("v_right")))
    for p in (1, 2):
        assert_same_rows(run(q, [("ev", rows)], parallelism=p).outputs["out"], want)


@pytest.mark.parametrize("window", [ref.Time(5 * S), ref.Time(6 * S, 2 * S), ref.Time(4 * S, 4 * S, lateness=3 * S)])
@pytest.mark.parametrize("on", [["k"], [], ["k", "s"]])
def test_random_joins(window, on):
    rng = random.Random(hash((window.size, window.advance, len(on))) & 0xFFFF)
    left, right = sides(60, rng, disorder_s=3.0)
    sends = []
    for i in range(0, 60, 9):
        sends += [("l", left[i:i + 9]), ("r", right[i:i + 9])]
    where = None if on else B("!=", C("s_left"), C("s_right"))
    check(window, sends, on=on, where=where, parallelism=(1, 3))


def test_an_advance_that_closes_no_window_leaves_the_buffers_as_they_came():
    """Gathering every buffered row at each advance made a window of many advances cost quadratic
    time: only a fire that closes a window gathers them (and drops the rows no window reads)."""
    q = cep.Query("j")
    l, r = q.stream("l", LEFT), q.stream("r", RIGHT)
    join = WindowJoin(l.join(r, cep.TimeWindow("10s"), on="k").op, 4)
    for i in range(5):
        for port, rows, schema in ((0, [lrow("x", i, a=i)], LEFT), (1, [rrow("x", i, b=i)], RIGHT)):
            batch = table(rows, schema).to_batches()[0]
            join.add(port, columns.stamp(batch, 2 * i + port, columns.as_int64(batch.column("ts")), T0 + i * S))
        assert join.fire(T0 + i * S) == []
    assert [len(b) for b in join.buffers] == [5, 5]
    out = join.fire(T0 + 10 * S)
    assert sum(b.num_rows for b in out) == 25 and join.buffers == [[], []]

