"""Running aggregates (``aggregate(cep.Running(), ...)``) against a reference written from the
semantics: after each send, one row per group the send held, in the order of the group's last
tuple in it, with every function over all the group's tuples so far. Parallel deployments, on
instance managers too, and bins moved between instances give the same rows."""

import random

import numpy as np
import pyarrow as pa
import pytest

import reference as ref
import sparkcep as cep
from cases import ALL_FUNCS, EVENTS, T0, cep_funcs, events
from harness import chunk, plain, run, table
from reference import S, SEQ, TS, WM, assert_same_rows
from sparkcep.core import columns
from sparkcep.core.hashing import hash_rows
from sparkcep.core.operators import WM_END, WM_NONE, physical

BINS = 16


def expected(sends, by, funcs) -> list[list[dict]]:
    """Per send, the rows the running aggregate emits for it, in order."""
    stamped = ref.stamp(sends, {"ev": "ts"})["ev"]
    so_far: dict[tuple, list[dict]] = {}
    out, i = [], 0
    for _, rows in sends:
        last = {}
        for r in stamped[i:i + len(rows)]:
            key = tuple((0.0 if isinstance(r[f], float) and r[f] == 0 else r[f]) for f in by)
            so_far.setdefault(key, []).append(r)
            last[key] = r
        i += len(rows)
        out.append([{**{f: r[f] for f in by}, **{n: ref.agg_value(k, f, so_far[key]) for n, k, f in funcs}}
                    for key, r in sorted(last.items(), key=lambda kv: kv[1][SEQ])])
    return out


def frame(rows, by, funcs):
    return ref.frame(rows, list(by) + [n for n, _, _ in funcs])


def running_query(by, funcs):
    q = cep.Query("running")
    q.output("out", q.stream("ev", EVENTS).aggregate(cep.Running(), by=by, **cep_funcs(funcs)))
    return q


COUNT = [("n", "count", None)]  # a lone count() is counted inline (wordcount's shape)


@pytest.mark.parametrize("funcs", [ALL_FUNCS, COUNT], ids=["all", "count"])
@pytest.mark.parametrize("by", [["k"], ["k", "g"], ["x"], []], ids=str)
@pytest.mark.parametrize("parallelism", [1, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_running_aggregate_matches_the_reference(funcs, by, parallelism, seed):
    rng = random.Random(seed)
    sends = chunk([("ev", events(300, rng, disorder_s=2.0))], rng)
    got = run(running_query(by, funcs), sends, parallelism=parallelism).outputs["out"]
    want = expected(sends, by, funcs)
    assert_same_rows(got, frame([r for rows in want for r in rows], by, funcs), f"sends {len(sends)}")


def test_one_instance_emits_in_send_order_then_last_tuple_order():
    rng = random.Random(7)
    sends = chunk([("ev", events(200, rng))], sizes=[1, 30, 7, 64])
    funcs = [("n", "count", None), ("lv", "last", "v")]
    got = run(running_query(["k"], funcs), sends).outputs["out"]
    want = [list(r.values()) for rows in expected(sends, ["k"], funcs) for r in rows]
    assert got.values.tolist() == want


def test_instance_managers_give_the_rows_of_one_process():
    rng = random.Random(3)
    sends = chunk([("ev", events(2000, rng, keys=[f"10.0.{i}.{i % 7}" for i in range(150)] + [None]))],
                  sizes=[97, 400, 13])
    q = running_query(["k"], ALL_FUNCS)
    with cep.Engine.local(workers=2) as e:
        e.deploy(q, parallelism=2)
        for stream, rows in sends:
            e.send(stream, table(rows, EVENTS))
        e.end("ev")
        got = plain(e.collect("out"))
    assert_same_rows(got, run(running_query(["k"], ALL_FUNCS), sends).outputs["out"])


@pytest.mark.parametrize("funcs", [[("n", "count", None), ("mins", "min", "s"), ("maxs", "max", "s"),
                                    ("ls", "last", "s"), ("sv", "sum", "v")], COUNT], ids=["strings", "count"])
def test_groups_grow_the_table_mid_batch_and_long_keys_stay_exact(funcs):
    """Thousands of new groups in one batch (the table is rebuilt while it is consumed), keys longer
    than the 16 bytes an entry holds, string min/max/first/last appending to the arena."""
    rng = random.Random(11)
    keys = [f"{'long-key-' * (i % 4)}{i}" for i in range(6000)]
    rows = [{"k": rng.choice(keys), "g": 1, "ts": T0 + i, "v": i, "x": float(i % 13), "s": rng.choice(keys)}
            for i in range(20_000)]
    sends = [("ev", rows[:15_000]), ("ev", rows[15_000:])]
    got = run(running_query(["k"], funcs), sends, bins=4).outputs["out"]
    want = expected(sends, ["k"], funcs)
    assert_same_rows(got, frame([r for rows in want for r in rows], ["k"], funcs))


@pytest.mark.parametrize("funcs", [[("n", "count", None), ("sv", "sum", "v"), ("ax", "avg", "x"),
                                    ("mins", "min", "s"), ("fx", "first", "x")], COUNT], ids=["some", "count"])
@pytest.mark.parametrize("seed", [0, 1])
def test_bins_move_between_instances_mid_stream(funcs, seed):
    """Two physical instances; half the bins move from A to B halfway, their later rows follow."""
    rng = random.Random(seed)
    rows = events(400, rng)
    sends = [("ev", rows[i:i + 23]) for i in range(0, 400, 23)]
    op = running_query(["k"], funcs).outputs["out"]
    a, b = physical(op, BINS), physical(op, BINS)
    moved = set(rng.sample(range(BINS), BINS // 2))
    out, seen = [], WM_NONE
    for n, batch in enumerate(stamped_batches(sends)):
        if n == len(sends) // 2:
            b.put_bins(a.take_bins(np.array(sorted(moved))))
        to_b = np.isin((hash_rows(*columns.encode_keys(batch, ["k"])) & np.uint64(BINS - 1)).astype(np.int64),
                       list(moved)) if n >= len(sends) // 2 else np.zeros(batch.num_rows, bool)
        a.process(0, batch.filter(pa.array(~to_b)))
        b.process(0, batch.filter(pa.array(to_b)))
        seen = max(seen, int(batch.column(columns.TS).to_numpy().max()))
        for inst in (a, b):
            out += list(inst.advance(int(batch.column(columns.SEQ).to_numpy().max()), seen))
    for inst in (a, b):
        assert list(inst.advance(1 << 62, WM_END)) == []  # nothing fires at the end
    got = plain(pa.Table.from_batches([o.select(op.schema.names) for o in out], schema=op.schema.to_arrow()))
    want = expected(sends, ["k"], funcs)
    assert_same_rows(got, frame([r for rows in want for r in rows], ["k"], funcs), f"moved {sorted(moved)}")


def stamped_batches(sends):
    """Arrow batches of ``sends`` with the hidden columns a source stamps."""
    st = ref.stamp(sends, {"ev": "ts"})["ev"]
    out, i = [], 0
    for _, rows in sends:
        part = st[i:i + len(rows)]
        i += len(rows)
        t = table(part, EVENTS)
        for name, key in zip(columns.HIDDEN, (SEQ, None, TS, WM)):  # a source row's id is 0
            t = t.append_column(name, pa.array([0 if key is None else WM_NONE if r[key] is None else r[key]
                                                for r in part], pa.int64()))
        out.append(t.combine_chunks().to_batches()[0])
    return out


def test_output_schema_plan_and_time():
    q = cep.Query("wc")
    s = q.stream("ev", EVENTS)
    counts = s.aggregate(cep.Running(), by="k", n=cep.count(), top=cep.max("x"), name="counts")
    assert counts.schema.fields == {"k": "string", "n": "int64", "top": "float64"}
    q.output("out", counts)
    assert "aggregate(Running(), by=['k'], n=count(), top=max('x'))" in q.explain()
    assert "--route-key(k)--> counts" in q.explain()
    with pytest.raises(cep.QueryError, match="event-time"):
        counts.aggregate(cep.TimeWindow("1s"), n=cep.count())  # updates carry no event-time field
    with pytest.raises(cep.QueryError, match="TimeWindow, TupleWindow or Running"):
        s.aggregate("running", n=cep.count())


def test_nothing_is_late_and_the_end_emits_nothing_more():
    rows = [{"k": "a", "g": 1, "ts": T0 + 10 * S, "v": 1, "x": 1.0, "s": "p"},
            {"k": "a", "g": 1, "ts": T0, "v": 2, "x": 2.0, "s": "q"}]  # the second is far behind
    out = run(running_query(["k"], [("n", "count", None), ("sv", "sum", "v")]), [("ev", rows[:1]), ("ev", rows[1:])])
    assert out.outputs["out"].values.tolist() == [["a", 1, 1], ["a", 2, 3]]
    assert out.late == 0


@pytest.mark.parametrize("seed", [0, 1])
def test_a_batch_in_parts_gives_one_row_per_group(monkeypatch, seed):
    """Batches cut into parts of a few rows (a tiny ARENA_PART_BYTES), new groups and rebuilds between
    parts: the same updates, one row per group and send, as the reference."""
    monkeypatch.setattr("sparkcep.core.table.ARENA_PART_BYTES", 4096)
    rng = random.Random(seed)
    keys = [f"{'long-key-' * (i % 3)}{i}" for i in range(300)]
    rows = [{"k": rng.choice(keys[:5] if i % 3 else keys), "g": 1, "ts": T0 + i, "v": i, "x": float(i % 13),
             "s": "y" * rng.randrange(40) + rng.choice(keys)} for i in range(3000)]
    sends = [("ev", rows[:1000]), ("ev", rows[1000:1100]), ("ev", rows[1100:])]
    funcs = [("n", "count", None), ("mins", "min", "s"), ("maxs", "max", "s"), ("ls", "last", "s"),
             ("fs", "first", "s"), ("sv", "sum", "v")]
    got = run(running_query(["k"], funcs), sends, bins=4).outputs["out"]
    want = expected(sends, ["k"], funcs)
    assert_same_rows(got, frame([r for rows in want for r in rows], ["k"], funcs))
