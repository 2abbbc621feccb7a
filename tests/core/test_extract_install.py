"""Per-bin state of Aggregate and Join: extracting bins from one instance and
installing them in another, mid-stream, gives the same final output.

Works at the operator level (no runtime): two physical instances of one
stateful operator; rows are stamped as a source would stamp them, first all
go to instance A, then some bins move to B and their later rows follow them.
"""

import random

import numpy as np
import pyarrow as pa
import pytest

import reference as ref
import sparkcep as cep
from cases import EVENTS, LEFT, RIGHT, cep_funcs, cep_window, events, sides
from harness import plain, table
from reference import S, SEQ, TS, WM, assert_same_rows
from sparkcep.core import columns
from sparkcep.core.hashing import hash_rows
from sparkcep.core.operators import WM_END, WM_NONE, physical

BINS = 16


def stamp_batches(sends, time_fields, schemas):
    """[(stream, stamped Arrow batch)] as the engine's sources stamp them."""
    st = ref.stamp(sends, time_fields)
    out, i = [], {name: 0 for name in schemas}
    for stream, rows in sends:
        rows = st[stream][i[stream]:i[stream] + len(rows)]
        i[stream] += len(rows)
        t = table(rows, schemas[stream])
        hidden = [pa.array([r[SEQ] for r in rows], pa.int64()), pa.array([0] * len(rows), pa.int64()),
                  pa.array([r[TS] for r in rows], pa.int64()),
                  pa.array([WM_NONE if r[WM] is None else r[WM] for r in rows], pa.int64())]
        for name, arr in zip(columns.HIDDEN, hidden):
            t = t.append_column(name, arr)
        out.append((stream, t.combine_chunks().to_batches()[0] if t.num_rows else None))
    return st, out


def bins_of(batch, keys):
    h = hash_rows(*columns.encode_keys(batch, keys))
    return (h & np.uint64(BINS - 1)).astype(np.int64)


def drive(logical_op, ports, keys, batches, move_after, moved, streams):
    """Run batches through instance A; after ``move_after`` batches move bins ``moved`` to B.

    ``ports``: stream -> input port; ``keys``: port -> key fields. Returns A's and B's output.
    """
    a, b = physical(logical_op, BINS), physical(logical_op, BINS)
    seen = {s: WM_NONE for s in streams}
    out = []
    for n, (stream, batch) in enumerate(batches):
        if n == move_after:
            for bn in moved:
                b.install(bn, a.extract(bn))
        if batch is None:
            continue
        port = ports[stream]
        if n < move_after:
            a.process(port, batch)
        else:
            go_b = np.isin(bins_of(batch, keys[port]), list(moved))
            a.process(port, batch.filter(pa.array(~go_b)))
            b.process(port, batch.filter(pa.array(go_b)))
        seen[stream] = max(seen[stream], int(batch.column(columns.TS).to_numpy().max()))
        frontier = int(batch.column(columns.SEQ).to_numpy().max())
        wm = min(seen.values())
        for op in (a, b):
            out += list(op.advance(frontier, wm))
    for op in (a, b):
        out += list(op.advance(1 << 62, WM_END))
    names = logical_op.schema.names
    return plain(pa.Table.from_batches([o.select(names) for o in out if o.num_rows],
                                       schema=logical_op.schema.to_arrow()))


WINDOWS = [ref.Time(5 * S), ref.Time(6 * S, 2 * S, lateness=2 * S), ref.Tuples(3, 2), ref.Tuples(2)]


@pytest.mark.parametrize("window", WINDOWS, ids=repr)
@pytest.mark.parametrize("by", [["k"], ["k", "g"]])
@pytest.mark.parametrize("seed", [0, 1])
def test_aggregate_bins_move_between_instances(window, by, seed):
    rng = random.Random(seed)
    rows = events(240, rng, disorder_s=1.5)
    sends = [("ev", rows[i:i + 17]) for i in range(0, 240, 17)]
    q = cep.Query("agg")
    funcs = [("n", "count", None), ("sv", "sum", "v"), ("ax", "avg", "x"), ("mins", "min", "s"), ("ls", "last", "s"),
             ("fx", "first", "x")]
    q.output("out", q.stream("ev", EVENTS).aggregate(cep_window(window), by=by, **cep_funcs(funcs)))
    logical_op = q.outputs["out"]
    st, batches = stamp_batches(sends, {"ev": "ts"}, {"ev": EVENTS})
    want, _ = ref.aggregate(st["ev"], window, by, funcs)
    moved = set(rng.sample(range(BINS), BINS // 2))
    got = drive(logical_op, {"ev": 0}, {0: by}, batches, move_after=len(batches) // 2, moved=moved, streams=["ev"])
    assert_same_rows(got, want, f"moved bins {sorted(moved)}")


@pytest.mark.parametrize("window", [ref.Time(5 * S), ref.Time(6 * S, 2 * S, lateness=2 * S)], ids=repr)
@pytest.mark.parametrize("seed", [0, 1])
def test_join_bins_move_between_instances(window, seed):
    rng = random.Random(seed)
    left, right = sides(120, rng, disorder_s=2.0)
    sends = []
    for i in range(0, 120, 11):
        sends += [("l", left[i:i + 11]), ("r", right[i:i + 11])]
    q = cep.Query("join")
    l, r = q.stream("l", LEFT), q.stream("r", RIGHT)
    q.output("out", l.join(r, cep_window(window), on=["k"], where=cep.col("a") <= cep.col("b")))
    logical_op = q.outputs["out"]
    st, batches = stamp_batches(sends, {"l": "ts", "r": "ts"}, {"l": LEFT, "r": RIGHT})
    want, _ = ref.join(st["l"], st["r"], LEFT, RIGHT, window, ["k"], ref.Bin("<=", ref.Col("a"), ref.Col("b")))
    moved = set(rng.sample(range(BINS), BINS // 2))
    got = drive(logical_op, {"l": 0, "r": 1}, {0: ["k"], 1: ["k"]}, batches, move_after=len(batches) // 2,
                moved=moved, streams=["l", "r"])
    assert_same_rows(got, want, f"moved bins {sorted(moved)}")


def test_extract_empties_an_instance_and_install_continues_tuple_positions():
    q = cep.Query("agg")
    q.output("out", q.stream("ev", EVENTS).aggregate(cep.TupleWindow(3), by="k", n=cep.count(), l=cep.last("v")))
    logical_op = q.outputs["out"]
    rng = random.Random(5)
    rows, more = events(50, rng), events(40, rng)
    st, [(_, first), (_, second)] = stamp_batches([("ev", rows), ("ev", more)], {"ev": "ts"}, {"ev": EVENTS})
    a, b = physical(logical_op, BINS), physical(logical_op, BINS)
    out = a.process(0, first) + list(a.advance(49, WM_NONE))
    for bn in range(BINS):
        b.install(bn, a.extract(bn))
    assert list(a.advance(49, WM_END)) == []  # every bin left A
    out += b.process(0, second) + list(b.advance(89, WM_END))
    names = logical_op.schema.names
    got = plain(pa.Table.from_batches([o.select(names) for o in out], schema=logical_op.schema.to_arrow()))
    want, _ = ref.aggregate(st["ev"], ref.Tuples(3), ["k"], [("n", "count", None), ("l", "last", "v")])
    assert_same_rows(got, want)


@pytest.mark.parametrize("window", [ref.Tuples(3), ref.Time(5 * S)], ids=repr)
def test_a_bin_moves_with_its_tuples_not_consumed_yet(window):
    """take_bin carries a bin's pending tuples (past the frontier) along with its state; put_bin installs both."""
    q = cep.Query("agg")
    q.output("out", q.stream("ev", EVENTS).aggregate(cep_window(window), by="k", n=cep.count(), l=cep.last("v")))
    logical_op = q.outputs["out"]
    rng = random.Random(9)
    rows = events(60, rng)
    st, [(_, batch)] = stamp_batches([("ev", rows)], {"ev": "ts"}, {"ev": EVENTS})
    a, b = physical(logical_op, BINS), physical(logical_op, BINS)
    a.process(0, batch)
    out = list(a.advance(29, WM_NONE))  # rows 0..29 consumed, 30..59 pending in A
    pending_bins = set(bins_of(a.pending[0][0], ["k"]))
    moved = set(sorted(pending_bins)[::2])
    assert moved and pending_bins - moved
    for bn in moved:
        taken = a.take_bin(bn)
        assert taken.pending[0] is not None and set(bins_of(taken.pending[0], ["k"])) == {bn}
        b.put_bin(bn, taken)
    assert set(bins_of(a.pending[0][0], ["k"])) == pending_bins - moved
    for op in (a, b):
        out += list(op.advance(59, WM_END))
    names = logical_op.schema.names
    got = plain(pa.Table.from_batches([o.select(names) for o in out if o.num_rows],
                                      schema=logical_op.schema.to_arrow()))
    want, _ = ref.aggregate(st["ev"], window, ["k"], [("n", "count", None), ("l", "last", "v")])
    assert_same_rows(got, want)
