"""Watermarks, allowed lateness and late tuples.

Reading of the contract used here (and by the reference): a tuple's
watermark is the largest event time its *own source* had seen before the
tuple's send() batch; a tuple is merged into each of its windows whose end
is still above ``watermark - lateness``; it counts once in
``metrics()["late"]`` when it missed at least one of its windows.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference as ref
import sparkcep as cep
from cases import T0, cep_funcs, cep_window
from harness import run, stamped
from reference import S, assert_same_rows

from sparkcep.core.aggregate import WindowAggregate

EV = {"k": "string", "ts": "timestamp", "v": "int64"}
FUNCS = [("n", "count", None), ("sv", "sum", "v")]


def r(sec, v=1, k="a"):
    return {"k": k, "ts": T0 + int(sec * S), "v": v}


def agg(window, sends, by=("k",), parallelism=1):
    q = cep.Query("late")
    q.output("out", q.stream("ev", EV).aggregate(cep_window(window), by=list(by), **cep_funcs(FUNCS)))
    got = run(q, sends, parallelism=parallelism)
    want, late = ref.aggregate(stamped(q, sends)["ev"], window, list(by), FUNCS)
    assert_same_rows(got.outputs["out"], want)
    assert got.late == late
    return got


def counts(got):
    return sorted((int(s - T0) // S, n) for s, n in zip(got.outputs["out"]["window_start"], got.outputs["out"]["n"]))


def test_a_tuple_after_its_window_fired_is_counted_and_dropped():
    got = agg(ref.Time(10 * S), [("ev", [r(1)]), ("ev", [r(12)]), ("ev", [r(3)])])
    assert got.late == 1
    assert counts(got) == [(0, 1), (10, 1)]
    assert got.metrics["late"] == {"late": {"aggregate1": 1}}


def test_nothing_is_late_within_one_batch():
    got = agg(ref.Time(10 * S), [("ev", [r(25), r(1), r(12), r(3)])])
    assert got.late == 0
    assert counts(got) == [(0, 2), (10, 1), (20, 1)]


def test_the_watermark_is_from_earlier_batches_only():
    got = agg(ref.Time(10 * S), [("ev", [r(9)]), ("ev", [r(15), r(2)]), ("ev", [r(3)])])
    assert got.late == 1  # 2 s: watermark 9 s, window open; 3 s: watermark 15 s, window [0,10) fired
    assert counts(got) == [(0, 2), (10, 1)]


@pytest.mark.parametrize("late_sec,merged", [(4.9, True), (5, False)])
def test_allowed_lateness_boundary(late_sec, merged):
    # watermark 14.9 s / 15 s; [0, 10) fires once watermark - 5 s >= 10 s
    got = agg(ref.Time(10 * S, lateness=5 * S), [("ev", [r(1)]), ("ev", [r(10 + late_sec)]), ("ev", [r(2)])])
    assert got.late == (0 if merged else 1)
    assert counts(got)[0] == (0, 2 if merged else 1)


def test_out_of_order_within_lateness_is_never_late():
    import random
    rng = random.Random(3)
    rows = [r(i * 0.5 - rng.random() * 2.9, v=i) for i in range(200)]
    sends = [("ev", rows[i:i + 3]) for i in range(0, 200, 3)]
    got = agg(ref.Time(4 * S, 2 * S, lateness=3 * S), sends, parallelism=2)
    assert got.late == 0
    whole = agg(ref.Time(4 * S, 2 * S, lateness=3 * S), [("ev", rows)])
    assert_same_rows(got.outputs["out"], whole.outputs["out"])  # chunking does not matter


def test_sliding_window_merges_into_open_windows_only():
    # windows of 10 s every 5 s: 7 s is in [0,10) and [5,15); watermark 12 s closed [0,10) only
    got = agg(ref.Time(10 * S, 5 * S), [("ev", [r(1)]), ("ev", [r(12)]), ("ev", [r(7)])])
    assert got.late == 1
    assert counts(got) == [(-5, 1), (0, 1), (5, 2), (10, 1)]


def test_watermark_is_per_source_stream():
    q = cep.Query("two")
    a, b = q.stream("a", EV), q.stream("b", EV)
    window = ref.Time(10 * S)
    q.output("out", a.union(b).aggregate(cep_window(window), by="k", **cep_funcs(FUNCS)))
    sends = [("a", [r(1)]), ("a", [r(30)]), ("b", [r(2, k="b")]), ("b", [r(5, k="b")]), ("a", [r(4)])]
    got = run(q, sends)
    st = stamped(q, sends)
    want, late = ref.aggregate(st["a"] + st["b"], window, ["k"], FUNCS)
    assert_same_rows(got.outputs["out"], want)
    assert got.late == late == 1  # only a's 4 s tuple: b's own watermark was 2 s
    assert got.metrics["late"] == {"two": {"aggregate2": 1}}


def test_join_late_tuples_are_counted_once_per_tuple():
    q = cep.Query("j")
    schema = {"k": "string", "ts": "timestamp", "v": "int64"}
    l, rr = q.stream("l", schema), q.stream("r", schema)
    window = ref.Time(10 * S, 5 * S)
    q.output("out", l.join(rr, cep_window(window), where=cep.col("v_left") <= cep.col("v_right")))
    sends = [("l", [r(1, 1)]), ("r", [r(2, 2)]), ("l", [r(20, 3)]), ("r", [r(21, 4)]), ("l", [r(3, 5)]),
             ("r", [r(4, 6), r(18, 7)]), ("l", [r(17, 8)])]
    st = stamped(q, sends)
    want, late = ref.join(st["l"], st["r"], schema, schema, window, (), ref.Bin("<=", ref.Col("v_left"), ref.Col("v_right")))
    assert late == 4  # l: 3 s and 17 s (watermark 20 s), r: 4 s and 18 s (watermark 21 s)
    for p in (1, 2, 3):
        got = run(q, sends, parallelism=p)
        assert_same_rows(got.outputs["out"], want, f"parallelism {p}")
        assert got.late == late, f"parallelism {p}"


@settings(max_examples=300, deadline=None)
@given(size=st.integers(1, 10**7), advance=st.integers(1, 10**7), lateness=st.integers(0, 10**7),
       ts=st.lists(st.integers(-10**9, 10**9), min_size=1, max_size=20), watermark=st.integers(-10**9, 10**9))
def test_rows_staying_out_of_a_fire_are_those_whose_every_window_stays_open(size, advance, lateness, ts, watermark):
    """open_after_fire against the windows enumerated: a row stays pending through fire(watermark) exactly
    when each window holding it starts after watermark - lateness - size."""
    advance = max(min(advance, size), -(-size // 1000))  # at most 1,000 windows a row
    q = cep.Query("o")
    s = q.stream("s", "ts timestamp", time="ts")
    op = s.aggregate(cep.TimeWindow(f"{size}us", f"{advance}us", lateness=f"{lateness}us"), n=cep.count()).op
    agg = WindowAggregate(op.window, op.by, op.funcs, op.inputs[0].schema, op.schema, 8)
    limit = watermark - lateness - size

    def stays_open(t):
        k = (t - size) // advance - 2
        starts = [j * advance for j in range(k, k + size // advance + 5) if j * advance <= t < j * advance + size]
        return all(start > limit for start in starts)

    got = agg.open_after_fire(np.array(ts, np.int64), watermark)
    assert got.tolist() == [stays_open(t) for t in ts]


@pytest.mark.parametrize("kind", ["aggregate", "join"])
@pytest.mark.parametrize("change", ["rescale down", "migrate half"])
def test_late_counts_move_with_their_bins(kind, change):
    """An instance that hands all its bins on and leaves (a rescale down) took its late count with it
    (80,000 tuples by hand: metrics()["late"] 8,598 after a rescale from 2 to 1, 10,771 without, the same
    windows). The counts move with the bins: a reconfiguration leaves the totals as without one."""
    import pandas as pd
    rng = np.random.default_rng(3)
    n = 6000
    late = rng.random(n) < 0.2
    base = np.arange(n) * 2000 - late * rng.integers(1, 3, n) * 1_500_000
    df = pd.DataFrame({"k": [f"k{i}" for i in rng.integers(0, 50, n)],
                       "ts": pd.Timestamp("2024-01-01") + pd.to_timedelta(base, "us"), "v": rng.integers(0, 9, n)})

    def run_with(reconfigure: bool):
        q = cep.Query("moves")
        s = q.stream("ev", "k string, ts timestamp, v int64")
        if kind == "aggregate":
            out = s.aggregate(cep.TimeWindow("1s"), by="k", name="op", n=cep.count())
        else:
            t = q.stream("ev2", "k string, ts timestamp, v int64")
            out = s.join(t, cep.TimeWindow("1s"), on="k", name="op")
        q.output("out", out)
        with cep.Engine.local() as e:
            dep = e.deploy(q, parallelism=2, bins=16)
            for j in range(0, n, 200):
                if reconfigure and j == n // 2:
                    dep.rescale("op", 1) if change == "rescale down" else dep.migrate("op", {b: 1 for b in range(8)})
                for stream in q.sources:
                    e.send(stream, df.iloc[j:j + 200])
            for stream in q.sources:
                e.end(stream)
            return e.collect("out").num_rows, e.metrics()["late"]["moves"]["op"]

    rows, late_count = run_with(False)
    assert late_count > 500
    assert run_with(True) == (rows, late_count)
