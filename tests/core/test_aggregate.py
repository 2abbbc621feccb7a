"""Windowed Aggregate: every function, every window kind, firing, key shapes."""

import datetime as dt

import pandas as pd
import pyarrow as pa
import pytest

import reference as ref
import sparkcep as cep
from cases import T0, cep_funcs, cep_window
from harness import run, stamped, table
from reference import S, assert_same_rows

EV = {"k": "string", "ts": "timestamp", "v": "int64", "x": "float64", "s": "string"}


def row(k, sec, v=None, x=None, s=None):
    return {"k": k, "ts": T0 + int(sec * S), "v": v, "x": x, "s": s}


def agg_query(window, by=("k",), funcs=None, schema=EV, name="agg"):
    q = cep.Query(name)
    src = q.stream("ev", schema)
    q.output("out", src.aggregate(cep_window(window), by=list(by), **cep_funcs(funcs)))
    return q


def check(window, sends, by=("k",), funcs=None, schema=EV, parallelism=(1,)):
    """Run against the reference; returns the engine's frame (parallelism 1)."""
    q = agg_query(window, by, funcs, schema)
    want, late = ref.aggregate(stamped(q, sends)["ev"], window, list(by), funcs)
    first = None
    for p in parallelism:
        got = run(q, sends, parallelism=p)
        assert_same_rows(got.outputs["out"], want, f"parallelism {p}")
        assert got.late == late
        first = got.outputs["out"] if first is None else first
    return first


ALL = [("n", "count", None), ("c", "count", "v"), ("sum", "sum", "v"), ("avg", "avg", "v"), ("min", "min", "v"),
       ("max", "max", "v"), ("first", "first", "v"), ("last", "last", "v")]


def test_every_function_by_hand():
    rows = [row("a", 3, v=5), row("a", 1, v=None), row("a", 2, v=-2), row("a", 2, v=7), row("b", 4, v=None),
            row("a", 12, v=1)]
    got = check(ref.Time(10 * S), [("ev", rows)], funcs=ALL)
    by_key = {(r[0] - T0, r[2]): r[3:] for r in got.itertuples(index=False, name=None)}
    # window [0, 10s) of "a": v = 5, null, -2, 7; by event time: null(1s), -2(2s, sent first), 7(2s), 5(3s)
    assert by_key[(0, "a")] == (4, 3, 10, 10 / 3, -2, 7, -2, 5)
    assert by_key[(0, "b")] == (1, 0, None, None, None, None, None, None)  # only nulls: null, count 0
    assert by_key[(10 * S, "a")] == (1, 1, 1, 1.0, 1, 1, 1, 1)
    assert len(by_key) == 3  # window [10s, 20s) of "b" is empty: not emitted


def test_output_columns_order_and_types():
    rows = [row("a", 1, v=1, x=1.5, s="q")]
    funcs = [("l", "last", "s"), ("n", "count", None), ("ax", "avg", "x"), ("sv", "sum", "v"), ("mx", "max", "x"),
             ("f", "first", "v"), ("sx", "sum", "x"), ("mins", "min", "s")]
    t = run(agg_query(ref.Time(10 * S), funcs=funcs), [("ev", rows)]).arrow["out"]
    assert t.schema == pa.schema([("window_start", pa.timestamp("us")), ("window_end", pa.timestamp("us")),
                                  ("k", pa.string()), ("l", pa.string()), ("n", pa.int64()), ("ax", pa.float64()),
                                  ("sv", pa.int64()), ("mx", pa.float64()), ("f", pa.int64()), ("sx", pa.float64()),
                                  ("mins", pa.string())])
    tt = run(agg_query(ref.Tuples(1), funcs=funcs), [("ev", rows)]).arrow["out"]
    assert tt.schema.field("window_start").type == pa.int64()


def test_first_and_last_follow_event_time_then_sequence_not_arrival():
    # sent: 3s "late-sent-early", 1s "x", 1s "y" (tie with x, sent after it), 5s null, 0.5s sent last
    rows = [row("a", 3, s="m"), row("a", 1, s="x"), row("a", 1, s="y"), row("a", 5, s=None), row("a", 0.5, s="e")]
    funcs = [("f", "first", "s"), ("l", "last", "s")]
    got = check(ref.Time(10 * S), [("ev", rows[:3]), ("ev", rows[3:])], funcs=funcs)
    assert got[["f", "l"]].values.tolist() == [["e", "m"]]
    ties = [row("a", 1, s="x"), row("a", 1, s="y"), row("a", 1, s="z")]
    got = check(ref.Time(10 * S), [("ev", ties[:1]), ("ev", ties[1:])], funcs=funcs)
    assert got[["f", "l"]].values.tolist() == [["x", "z"]]


def test_string_min_max_are_bytewise_with_shared_prefixes():
    keys = ["10.0.0.10", "10.0.0.1", "10.0.0.100", "10.0.0.2", "9", "é", "z", "Z", ""]
    rows = [row("a", i * 0.1, s=k) for i, k in enumerate(keys)]
    got = check(ref.Time(10 * S), [("ev", rows)], funcs=[("lo", "min", "s"), ("hi", "max", "s")])
    assert got[["lo", "hi"]].values.tolist() == [["", "é"]]
    rows = [row("a", i * 0.1, s=k) for i, k in enumerate(["10.0.0.10", "10.0.0.1", "10.0.0.100"])]
    got = check(ref.Time(10 * S), [("ev", rows)], funcs=[("lo", "min", "s"), ("hi", "max", "s")])
    assert got[["lo", "hi"]].values.tolist() == [["10.0.0.1", "10.0.0.100"]]


def test_group_keys_with_shared_prefixes_stay_apart():
    keys = ["10.0.0.1", "10.0.0.10", "10.0.0.100", "10.0.0.1", None, "", "10.0.0.10", None]
    rows = [row(k, i * 0.1, v=i) for i, k in enumerate(keys)]
    got = check(ref.Time(10 * S), [("ev", rows)], funcs=[("n", "count", None), ("sv", "sum", "v")],
                parallelism=(1, 3))
    assert sorted(map(tuple, got[["k", "n", "sv"]].values.tolist()), key=str) == sorted(
        [("10.0.0.1", 2, 3), ("10.0.0.10", 2, 7), ("10.0.0.100", 1, 2), (None, 2, 11), ("", 1, 5)], key=str)


def test_sliding_windows_are_aligned_to_multiples_of_advance():
    rows = [row("a", 9, v=1), row("a", 13, v=2)]
    got = check(ref.Time(10 * S, 4 * S), [("ev", rows)], funcs=[("sv", "sum", "v")])
    windows = sorted((r[0] - T0, r[1] - T0, r[3]) for r in got.itertuples(index=False, name=None))
    # T0 is a multiple of 4 s, so starts are T0 + multiples of 4 s
    assert windows == [(0, 10 * S, 1), (4 * S, 14 * S, 3), (8 * S, 18 * S, 3), (12 * S, 22 * S, 2)]


def test_alignment_is_from_epoch_zero_not_first_event():
    q = agg_query(ref.Time(7 * S), funcs=[("n", "count", None)])
    got = run(q, [("ev", [row("a", 0)])]).outputs["out"]
    start = got["window_start"][0]
    assert start % (7 * S) == 0 and start <= T0 < start + 7 * S


@pytest.mark.parametrize("window", [ref.Time(3 * S), ref.Time(5 * S, 2 * S), ref.Time(4 * S, S, lateness=2 * S)])
def test_every_function_on_random_data(window):
    import random
    from cases import ALL_FUNCS, events
    rows = events(150, random.Random(7), disorder_s=2.0)
    check(window, [("ev", rows[:50]), ("ev", rows[50:51]), ("ev", rows[51:])],
          schema={"k": "string", "g": "int64", "ts": "timestamp", "v": "int64", "x": "float64", "s": "string"},
          by=("k", "g"), funcs=ALL_FUNCS, parallelism=(1, 2))


def test_empty_windows_are_not_emitted_after_gaps():
    rows = [row("a", 1, v=1), row("a", 100, v=2), row("b", 1000, v=3)]
    got = check(ref.Time(10 * S, 5 * S), [("ev", rows)], funcs=[("n", "count", None)])
    assert len(got) == 6


# --- tuple windows ----------------------------------------------------------------------
def test_tuple_windows_count_per_group_and_emit_only_full_windows():
    rows = [row(k, i, v=i) for i, k in enumerate("aababbbaab")]  # a: 0,1,3,7,8 b: 2,4,5,6,9
    got = check(ref.Tuples(2), [("ev", rows[:3]), ("ev", rows[3:])], funcs=[("sv", "sum", "v"), ("l", "last", "v")],
                parallelism=(1, 2))
    assert sorted(got.values.tolist(), key=str) == sorted(
        [[0, 2, "a", 1, 1], [2, 4, "a", 10, 7], [0, 2, "b", 6, 4], [2, 4, "b", 11, 6]], key=str)


def test_sliding_tuple_windows_positions():
    rows = [row("a", i, v=i) for i in range(7)]
    got = check(ref.Tuples(3, 2), [("ev", rows)], funcs=[("sv", "sum", "v")])
    assert sorted(got[["window_start", "window_end", "sv"]].values.tolist()) == [[0, 3, 3], [2, 5, 9], [4, 7, 15]]


def test_tuple_window_order_is_send_order_but_first_last_use_event_time():
    rows = [row("a", 5, v=1), row("a", 1, v=2), row("a", 3, v=3), row("a", 0, v=4)]
    got = check(ref.Tuples(3), [("ev", rows)], funcs=[("f", "first", "v"), ("l", "last", "v")])
    assert got[["window_start", "window_end", "f", "l"]].values.tolist() == [[0, 3, 2, 1]]


def test_tuple_window_without_time_field():
    schema = {"k": "string", "v": "int64"}
    q = cep.Query("t")
    q.output("out", q.stream("ev", schema).aggregate(cep.TupleWindow(2), by="k", n=cep.count(),
                                                      f=cep.first("v"), l=cep.last("v")))
    rows = [{"k": "a", "v": i} for i in range(5)]
    got = run(q, [("ev", rows[:1]), ("ev", rows[1:])]).outputs["out"]
    assert sorted(got.values.tolist()) == [[0, 2, "a", 2, 0, 1], [2, 4, "a", 2, 2, 3]]


def test_global_aggregates():
    rows = [row(k, i * 0.7, v=i) for i, k in enumerate("abcabcabca")]
    check(ref.Time(2 * S), [("ev", rows)], by=(), funcs=ALL, parallelism=(1, 4))
    check(ref.Tuples(3, 1), [("ev", rows)], by=(), funcs=ALL, parallelism=(1, 4))


# --- key and value types ----------------------------------------------------------------
TYPED = {"ts": "timestamp", "i": "int32", "f": "float32", "b": "bool", "t2": "timestamp", "d": "float64"}


def typed_rows():
    vals = [(1, 1.5, True, T0 + 5, 0.0), (1, -2.5, False, T0 + 2, -0.0), (2, None, None, None, 1.25),
            (None, 0.25, True, T0 + 9, None), (2, 3.0, False, T0 + 1, -0.0), (None, None, None, T0, 1.25)]
    return [{"i": i, "f": f, "b": b, "t2": t2, "ts": T0 + n * S // 3, "d": d} for n, (i, f, b, t2, d) in enumerate(vals)]


@pytest.mark.parametrize("by", [["i"], ["b"], ["d"], ["i", "b"], ["t2"], ["b", "d", "i"]])
def test_key_types(by):
    funcs = [("n", "count", None), ("mn", "min", "f"), ("mx", "max", "t2"), ("lb", "last", "b"),
             ("fi", "first", "i"), ("si", "sum", "i"), ("mb", "min", "b"), ("md", "max", "d")]
    check(ref.Time(10 * S), [("ev", typed_rows())], by=by, funcs=funcs, schema=TYPED, parallelism=(1, 2))


def test_value_types_are_kept():
    funcs = [("mn", "min", "f"), ("mx", "max", "t2"), ("lb", "last", "b"), ("fi", "first", "i"), ("si", "sum", "i"),
             ("sf", "sum", "f")]
    q = agg_query(ref.Time(10 * S), by=(), funcs=funcs, schema=TYPED)
    t = run(q, [("ev", typed_rows())]).arrow["out"]
    assert [t.schema.field(n).type for n, _, _ in funcs] == [pa.float32(), pa.timestamp("us"), pa.bool_(),
                                                            pa.int32(), pa.int64(), pa.float64()]


def test_integer_sums_are_exact():
    big = 2 ** 53
    rows = [row("a", 0, v=big), row("a", 1, v=1), row("a", 2, v=1)]
    got = check(ref.Time(10 * S), [("ev", rows)], funcs=[("sv", "sum", "v"), ("mx", "max", "v")])
    assert got["sv"][0] == big + 2


# --- firing -----------------------------------------------------------------------------
def collect(e):
    return sorted(set(e.collect("out").column("window_start").cast(pa.int64()).to_pylist()))


def test_window_fires_when_watermark_reaches_its_end_and_end_fires_the_rest():
    q = agg_query(ref.Time(10 * S), funcs=[("n", "count", None)])
    with cep.Engine.local() as e:
        e.deploy(q)
        e.send("ev", table([row("a", 1), row("a", 9.999999)], EV))
        assert collect(e) == []
        e.send("ev", table([row("b", 10 - 1e-6)], EV))
        assert collect(e) == []  # watermark 10s - 1us: [0, 10s) still open
        e.send("ev", table([row("b", 10)], EV))
        assert collect(e) == [T0]  # watermark 10s: [0, 10s) fired
        e.send("ev", table([row("a", 35)], EV))
        assert collect(e) == [T0, T0 + 10 * S]
        e.end("ev")
        assert collect(e) == [T0, T0 + 10 * S, T0 + 30 * S]


def test_lateness_delays_firing():
    q = agg_query(ref.Time(10 * S, lateness=5 * S), funcs=[("n", "count", None)])
    with cep.Engine.local() as e:
        e.deploy(q)
        e.send("ev", table([row("a", 1)], EV))
        e.send("ev", table([row("a", 14.9)], EV))
        assert collect(e) == []
        e.send("ev", table([row("a", 15)], EV))
        assert collect(e) == [T0]


def test_collect_accepts_every_input_format():
    q = agg_query(ref.Time(10 * S), funcs=[("n", "count", None), ("sv", "sum", "v")])
    rows = [row("a", 1, v=1, x=0.5, s="p"), row("b", 2, v=None, x=None, s=None)]
    t = table(rows, EV)
    as_dicts = {f: [r[f] for r in rows] for f in EV}
    as_dicts["ts"] = [dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=r["ts"]) for r in rows]
    frame = pd.DataFrame(as_dicts).astype({"v": "Int64"})  # pandas' nullable ints (float64 + NaN is refused)
    with cep.Engine.local() as e:
        e.deploy(q)
        assert e.send("ev", t) == 2
        assert e.send("ev", t.to_batches()[0]) == 2
        assert e.send("ev", as_dicts) == 2
        assert e.send("ev", frame) == 2
        e.end("ev")
        got = e.collect("out").to_pylist()
    assert sorted((r["k"], r["n"], r["sv"]) for r in got) == [("a", 4, 4), ("b", 4, None)]


# --- state growth -------------------------------------------------------------------------
@pytest.mark.parametrize("window", [ref.Tuples(2, 1), ref.Tuples(3), ref.Time(2 * S, S)], ids=repr)
@pytest.mark.parametrize("bins,chunk", [(1, 500), (16, 1300)])
def test_many_groups_over_several_batches_grow_the_state(window, bins, chunk):
    schema = {"k": "string", "ts": "timestamp", "v": "int64", "s": "string"}
    data = [{"k": f"key-{i % 1500}", "ts": T0 + i * 1000, "v": i, "s": f"s{i % 7}"} for i in range(4000)]
    sends = [("ev", data[i:i + chunk]) for i in range(0, len(data), chunk)]
    funcs = [("n", "count", None), ("l", "last", "s"), ("sv", "sum", "v")]
    q = agg_query(window, funcs=funcs, schema=schema)
    want, _ = ref.aggregate(stamped(q, sends)["ev"], window, ["k"], funcs)
    assert_same_rows(run(q, sends, bins=bins).outputs["out"], want)


@pytest.mark.parametrize("window", [ref.Time(60 * S, S, lateness=3 * S), ref.Tuples(40, 1)], ids=repr)
def test_rows_in_many_windows_go_in_parts_and_give_the_same_windows(window, monkeypatch):
    """A batch whose rows fall in more (row, window) pairs than ``SCRATCH`` is added in parts of rows,
    so its scratch stays bounded (a 64K-row send of a 1 h window sliding by 1 s asked for 3.8 GB and
    failed): the windows, and the late rows counted, are the reference's."""
    import random
    from cases import events
    from sparkcep.core import aggregate
    monkeypatch.setattr(aggregate, "SCRATCH", 500)
    rows = events(300, random.Random(3), disorder_s=8.0)
    schema = {"k": "string", "g": "int64", "ts": "timestamp", "v": "int64", "x": "float64", "s": "string"}
    check(window, [("ev", rows[:200]), ("ev", rows[200:])], schema=schema, by=("k",),
          funcs=[("n", "count", None), ("f", "first", "v"), ("hi", "max", "s")], parallelism=(1, 2))


def test_the_late_rows_of_a_batch_added_in_parts_are_its_own(monkeypatch):
    """The late rows a sliding window keeps (``late=``) are found part by part: the same rows as when the
    batch is added whole."""
    import random
    from cases import events
    from sparkcep.core import aggregate
    schema = {"k": "string", "g": "int64", "ts": "timestamp", "v": "int64", "x": "float64", "s": "string"}
    rows = events(400, random.Random(5), disorder_s=20.0)
    q = cep.Query("lp")
    s = q.stream("ev", schema)
    q.output("out", s.aggregate(cep.TimeWindow("8s", advance="1s"), by="k", n=cep.count(), late="late"))
    sends = [("ev", rows[i:i + 100]) for i in range(0, 400, 100)]
    whole = run(q, sends)
    monkeypatch.setattr(aggregate, "SCRATCH", 50)
    parts = run(q, sends)
    assert len(whole.outputs["late"]) > 20
    for out in ("out", "late"):
        assert_same_rows(parts.outputs[out], whole.outputs[out], out)


def test_one_row_sends_into_a_long_sliding_tuple_window_make_room_for_its_windows():
    """A row of ``TupleWindow(40, advance=1)`` needs room for 40 windows in its bin; with one row a send,
    the table was grown for 8 entries and the send never returned. Bounded here by a thread's join."""
    import threading
    rows = [row(f"k{i % 3}", i * 0.01, v=i) for i in range(120)]
    done: list = []

    def sends():
        try:
            check(ref.Tuples(40, 1), [("ev", [r]) for r in rows], funcs=[("sv", "sum", "v"), ("n", "count", None)])
            done.append(None)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            done.append(e)
    t = threading.Thread(target=sends, daemon=True)
    t.start()
    t.join(120)
    assert done, "a one-row send into the tuple window did not return within 120 s"
    if done[0] is not None:
        raise done[0]


def test_a_sliding_window_s_table_is_sized_by_its_entries_not_by_its_row_window_pairs():
    """100 keys in a 1 h window sliding by 1 s: each row makes 3600 (row, window) pairs, but the rows of a
    key share their windows. The table grew for every pair (1.6 GB for 1,000 rows); it holds each
    entry once, its bins at most half full."""
    import numpy as np
    from sparkcep.core.aggregate import WindowAggregate
    q = cep.Query("k")
    op = q.stream("s", "k int64, ts timestamp, v int64").aggregate(
        cep.TimeWindow("1h", advance="1s"), by="k", n=cep.count()).op
    agg = WindowAggregate(op.window, op.by, op.funcs, op.inputs[0].schema, op.schema, 128, "x")
    rng = np.random.default_rng(0)
    n = 1000
    ts = T0 + np.sort(rng.integers(0, S, n))
    agg.add(stamped_batch({"k": rng.integers(0, 100, n), "ts": pa.array(ts, pa.timestamp("us")),
                           "v": np.arange(n)}, ts))
    fullest = int(agg.table.meta[:, 0].max())
    assert fullest >= 3600 and agg.table.ent.shape[1] <= 4 * fullest, (fullest, agg.table.ent.shape)


def stamped_batch(columns: dict, ts) -> pa.RecordBatch:
    """A source batch as the engine stamps it (sequence numbers, ids, event times, watermark 0)."""
    import numpy as np
    from sparkcep.core.columns import as_int64, stamp
    batch = pa.RecordBatch.from_pydict(columns)
    assert (batch.column("ts").cast(pa.int64()).to_numpy() == ts).all()
    return stamp(batch, 0, as_int64(batch.column("ts")), np.int64(0))


def test_string_values_updated_by_many_batches_stay_in_their_bins_arena():
    """Every row of an open window may append a string value (last, max) to its bin's arena; batches
    after the window's first must make that room too, or values spill into the next bin's."""
    funcs = [("l", "last", "s"), ("hi", "max", "s"), ("n", "count", None)]
    sends = [("ev", [row(f"k{i % 40}", 1 + j * 0.01, s=f"{j:04d}-{i:03d}-" + "x" * 60) for i in range(200)])
             for j in range(30)]
    check(ref.Time(10 * S), sends, funcs=funcs)


def test_a_large_fire_leaves_in_batches_of_about_fire_rows(monkeypatch):
    """Firing 20K windows on 2 instances, each owning half of the bins, yields batches of about
    ``FIRE_ROWS`` rows (ranges of the bins an instance holds) that together are exactly the
    reference's windows, string maxima included."""
    from sparkcep.core import aggregate
    monkeypatch.setattr(aggregate, "FIRE_ROWS", 2000)
    n = 20_000
    funcs = [("n", "count", None), ("lo", "min", "v"), ("hi", "max", "s")]
    rows = [row(f"10.0.{i % 251}.{i}", (i % 7) * 0.5, v=i, s=f"s{i % 13}") for i in range(n)]
    rows += [row(f"10.0.{i % 251}.{i}", 3.0, v=-i, s="a") for i in range(0, n, 3)]
    sends = [("ev", rows), ("ev", [row("closer", 25)])]
    batches = []
    with cep.Engine.local() as e:
        e.deploy(agg_query(ref.Time(10 * S), funcs=funcs), parallelism=2)
        e.subscribe("out", batches.append)
        for _, rs in sends:
            e.send("ev", table(rs, EV))
        assert len(batches) >= n // 2000 and max(b.num_rows for b in batches) <= 2000 * 5 // 4
        assert sum(b.num_rows for b in batches) == n
    check(ref.Time(10 * S), sends, funcs=funcs)


def test_a_fire_does_not_wait_for_the_rows_of_later_windows():
    """An order-free aggregate fires before consuming a batch no firing window reads; settle() (after
    the results are out) or the next advance consumes it. The windows come out all the same."""
    import numpy as np

    from sparkcep.core import columns
    from sparkcep.core.operators import WM_END, physical
    q = cep.Query("settle")
    op = physical(q.stream("ev", "k string, ts timestamp").aggregate(cep.TimeWindow("1s"), by="k", n=cep.count()).op, 8)

    def batch(seq0, secs):
        ts = [T0 + int(s * S) for s in secs]
        n = len(ts)
        return pa.RecordBatch.from_arrays(
            [pa.array(["a"] * n), pa.array(ts, pa.timestamp("us")), pa.array(np.arange(seq0, seq0 + n)),
             pa.array(np.zeros(n, np.int64)), pa.array(ts), pa.array(np.full(n, T0))], names=["k", "ts", *columns.HIDDEN])

    def counts(batches):
        return [(b.column("window_start")[i].value - T0, b.column("n")[i].as_py()) for b in batches for i in range(b.num_rows)]

    op.process(0, batch(0, [0.1, 0.5]))
    assert counts(op.advance(1, T0 + int(0.5 * S))) == []
    op.settle()
    op.process(0, batch(2, [1.2, 1.5]))  # the next window's rows close the first
    assert counts(op.advance(3, T0 + int(1.5 * S))) == [(0, 2)]
    assert [b.num_rows for b in op.pending[0]] == [2]  # not consumed yet: the fire did not wait for them
    op.settle()
    assert op.pending[0] == []
    op.process(0, batch(4, [1.7]))
    assert counts(op.advance(4, WM_END)) == [(S, 3)]


def test_an_int64_sum_wraps_around_as_numpys_does_in_any_order():
    """The documented rule: past int64's range an integer sum wraps (it stays order-free), as numpy's does."""
    import numpy as np
    values = [2**62, 2**62, 2**62, -5, 7]
    want = int(np.array(values, np.int64).sum())
    assert want < 0  # wrapped
    for order in (values, values[::-1]):
        q = cep.Query("q")
        s = q.stream("ev", "ts timestamp, v int64")
        q.output("o", s.aggregate(cep.TimeWindow("10s"), total=cep.sum("v"), mean=cep.avg("v")))
        with cep.Engine.local(workers=0) as e:
            e.deploy(q)
            e.send("ev", pd.DataFrame({"ts": pd.to_datetime([1_000_000] * 5, unit="us"), "v": order}))
            e.end("ev")
            got = e.collect("o").to_pylist()
        assert [r["total"] for r in got] == [want]
        assert got[0]["mean"] == pytest.approx(sum(values) / 5)  # avg sums in float64: no wrap
