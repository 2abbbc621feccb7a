"""Output ids (``__seq``, ``__id``): the same at every parallelism, unique within an output, and the
(seq, id) order in which stateful operators consume rows derived from rows with equal sequence numbers."""

import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

import sparkcep as cep
from harness import run
from id_queries import Positions, assert_same_ids, build, id_rows, parallelism, params, sends
from reference import S
from sparkcep.core import ids
from sparkcep.core.hashing import derive_ids, operator_salt

T0 = 1_704_067_200 * S


def test_consume_order_sorts_only_what_is_out_of_order():
    seq = np.array([3, 5, 5, 9], np.int64)
    assert ids.consume_order(seq, np.array([0, -4, 7, 0], np.int64)) is None  # already (seq, id) ordered
    assert ids.consume_order(seq, np.array([0, 7, -4, 0], np.int64)).tolist() == [0, 2, 1, 3]
    assert ids.consume_order(np.array([9, 5, 3, 5], np.int64),
                             np.array([0, 2, 0, 1], np.int64)).tolist() == [2, 3, 1, 0]


def test_derived_ids_fold_in_every_part():
    salt, a = operator_salt("u", 0), np.arange(4, dtype=np.int64)
    assert operator_salt("u", 0) != operator_salt("u", 1) != operator_salt("v", 0)
    assert len(set(derive_ids(salt, a).tolist())) == 4
    assert derive_ids(salt, a, a).tolist() != derive_ids(salt, a, a[::-1]).tolist()


def test_apply_numbers_a_repeated_row_by_occurrence():
    salt = operator_salt("twice")
    seq, rid = np.array([4, 4, 4, 7], np.int64), np.array([0, 0, 0, 0], np.int64)
    got = ids.apply_ids(salt, seq, rid)
    assert got[0] == 0 and len({(s, i) for s, i in zip(seq, got)}) == 4
    assert got[1:3].tolist() == derive_ids(salt, rid[1:3], np.array([1, 2])).tolist()
    assert ids.apply_ids(salt, np.array([1, 2], np.int64), np.array([0, 0], np.int64)) is None


def test_source_rows_are_seq_and_zero_and_filter_and_map_keep_them():
    q = cep.Query("keep")
    q.output("out", q.stream("ev", {"k": "string", "ts": "timestamp", "v": "int64"})
             .filter(cep.col("v") > 1).map(k="k", w=cep.col("v") * 2))
    rows = [{"k": "a", "ts": T0 + i * S, "v": i} for i in range(5)]
    with cep.Engine.local() as e:
        got = id_rows(e, q, [("ev", rows[:2]), ("ev", rows[2:])])["out"]
    assert sorted(got) == [("a", 4, 2, 0), ("a", 6, 3, 0), ("a", 8, 4, 0)]


def demux_union_query():
    """A tuple reaching a union through two demux branches (tagged 1 and 2), then a tuple window."""
    q = cep.Query("demux_union_tuples")
    s = q.stream("ev", {"k": "string", "ts": "timestamp", "v": "int64"})
    a, b = s.demux(cep.col("v") >= 0, cep.col("v") >= 10, name="d")
    u = a.map(k="k", ts="ts", tag=cep.lit(1), name="ma").union(b.map(k="k", ts="ts", tag=cep.lit(2), name="mb"),
                                                                 name="u")
    q.output("rows", u)
    q.output("out", u.aggregate(cep.TupleWindow(1), by="k", name="t", tag=cep.first("tag")))
    return q


def test_demux_copies_through_a_union_keep_one_order():
    """Round-robin sends the copy of branch 2 to union instance 0 and that of branch 1 to instance 1
    (the producer order a stateful instance reads in): the tuple window used to see them swapped."""
    sends_ = [("ev", [{"k": "x", "ts": T0, "v": 5}]), ("ev", [{"k": "x", "ts": T0, "v": 5}]),
              ("ev", [{"k": "x", "ts": T0 + S, "v": 20}])]
    want = run(demux_union_query(), sends_).outputs["out"]
    assert sorted(want.tag) == [1, 1, 1, 2]
    for p in (2, {"u": 2}, 3):
        got = run(demux_union_query(), sends_, parallelism=p).outputs["out"]
        assert got.sort_values("window_start").values.tolist() == want.sort_values("window_start").values.tolist()
    with cep.Engine.local() as e:
        rows = id_rows(e, demux_union_query(), sends_)["rows"]
    copies = [r for r in rows if r[-2] == 2]  # seq 2 reached the union on both inputs
    assert sorted(r[2] for r in copies) == [1, 2] and copies[0][-1] != copies[1][-1]


def join_tuples_query():
    """A non-equi join (left round-robin, right broadcast) feeding a tuple window."""
    q = cep.Query("join_tuples")
    left = q.stream("l", {"k": "string", "ts": "timestamp", "a": "int64"})
    right = q.stream("r", {"k": "string", "ts": "timestamp", "b": "int64"})
    pairs = left.join(right, cep.TimeWindow("10s"), where=cep.col("a") < cep.col("b"), name="j")
    q.output("out", pairs.aggregate(cep.TupleWindow(1), name="t", a=cep.first("a")))
    return q


def test_join_rows_with_one_sequence_number_feed_a_tuple_window_alike():
    """Both pairs of the right tuple share its sequence number; at parallelism 2 their left tuples
    sit on different join instances, and the tuple window used to number them in instance order."""
    sends_ = [("l", [{"k": "x", "ts": T0, "a": 1}]), ("l", [{"k": "x", "ts": T0 + 20 * S, "a": 2}]),
              ("l", [{"k": "x", "ts": T0 + 21 * S, "a": 3}]), ("r", [{"k": "y", "ts": T0 + 22 * S, "b": 10}])]
    want = sorted(run(join_tuples_query(), sends_).outputs["out"].values.tolist())
    for p in (2, 3, 4):
        assert sorted(run(join_tuples_query(), sends_, parallelism=p).outputs["out"].values.tolist()) == want, p


def test_stateful_rows_carry_the_frontier_they_were_emitted_at():
    q = cep.Query("pos")
    s = q.stream("ev", {"k": "string", "ts": "timestamp", "v": "int64"})
    q.output("out", s.map(k="k", ts="ts", v="v", tag=cep.lit(0)).stateful(Positions(), by="k", name="pos"))
    sends_ = [("ev", [{"k": k, "ts": T0, "v": i} for i, k in enumerate("abab")]),
              ("ev", [{"k": "a", "ts": T0, "v": 9}])]
    with cep.Engine.local() as e:
        one = id_rows(e, q, sends_)["out"]
    assert sorted((r[0], r[1], r[-2]) for r in one) == [("a", -1, 4), ("a", 1, 3), ("a", 2, 3), ("a", 3, 4),
                                                        ("b", -1, 4), ("b", 1, 3), ("b", 2, 3)]
    with cep.Engine.local() as e:
        assert_same_ids(id_rows(e, q, sends_, parallelism=2), {"out": one}, "parallelism 2")


@given(p=params(), data=st.data())
def test_output_ids_are_the_same_at_every_parallelism(p, data):
    """Rows and their ids at 1-4 instances per sub-query, and at 2-4 everywhere, equal parallelism 1's."""
    p["name"] = "ids"
    q = build(p)
    sent = data.draw(sends(list(q.sources)))
    with cep.Engine.local() as e:
        want = id_rows(e, build(p), sent)
    for par in (parallelism(q, data.draw), data.draw(st.integers(2, 4))):
        with cep.Engine.local() as e:
            got = id_rows(e, build(p), sent, parallelism=par)
        assert_same_ids(got, want, f"{p['front']} -> {p['back']} at parallelism {par}")


def test_rows_the_engine_reads_back_have_hidden_ids_only_in_logs():
    q = demux_union_query()
    with cep.Engine.local() as e:
        e.deploy(q)
        e.send("ev", pa.table({"k": ["x"], "ts": pa.array([T0], pa.timestamp("us")), "v": [20]}))
        assert e.collect("rows").schema.names == ["k", "ts", "tag"]
        for read, names in ((dict(ids=True), ["__seq", "__id"]), (dict(seq=True), ["__seq"]), ({}, [])):
            assert {tuple(b.schema.names) for b in e.outputs["rows"].read(0, 0, 2, **read)} == \
                {("k", "ts", "tag", *names)}


def test_a_window_rows_id_hashes_its_whole_key():
    """Keys alike in their first 16 bytes and length differ past them, in the bin's arena: their window
    rows' ids differ too."""
    q = cep.Query("long")
    s = q.stream("ev", {"k": "string", "ts": "timestamp", "v": "int64"})
    q.output("out", s.aggregate(cep.TimeWindow("10s"), by="k", n=cep.count()))
    keys = [f"sixteen bytes ab{i}" for i in range(4)] + ["short"]
    with cep.Engine.local() as e:
        rows = id_rows(e, q, [("ev", [{"k": k, "ts": T0, "v": 1} for k in keys])])["out"]
    assert sorted(r[2] for r in rows) == sorted(keys)
    assert len({r[-1] for r in rows}) == len(keys)
