"""The planner against UPM-CEP's splitting rules (§4):

* a new sub-query starts at every stateful operator and at every operator
  with more than one input; consecutive stateless operators stay together;
* the balancer into a sub-query follows its first operator: route-key on the
  group-by / equi-join fields into Aggregate and equi-Join, round-robin +
  broadcast into a cartesian (non-equi) join, round-robin into stateless
  operators, point-to-point into a single instance.
"""

import pytest

import sparkcep as cep
from sparkcep import col
from sparkcep.query.planner import plan
from sparkcep.runtime.deployment import Deployment


def shape(q):
    """[(operators, [(source, port, balancer, keys)])] per sub-query."""
    return [([op.name for op in sq.operators], [(e.src.name, e.port, e.balancer, e.keys) for e in sq.inputs])
            for sq in plan(q).subqueries]


def streams():
    q = cep.Query("q")
    return q, q.stream("a", "k string, ts timestamp, v int64"), q.stream("b", "k string, ts timestamp, v int64")


def test_stateless_chain_is_one_subquery():
    q, a, _ = streams()
    q.output("o", a.filter(col("v") > 1, name="f").map(k="k", name="m").filter(col("k") == "x", name="g"))
    assert shape(q) == [(["f", "m", "g"], [("a", 0, "round-robin", [])])]


def test_aggregate_starts_a_subquery_and_keeps_following_stateless_operators():
    q, a, _ = streams()
    agg = a.filter(col("v") > 0, name="f").aggregate(cep.TimeWindow("1s"), by=["k"], n=cep.count(), name="agg")
    q.output("o", agg.filter(col("n") > 1, name="post").map(k="k", n="n", name="m"))
    assert shape(q) == [(["f"], [("a", 0, "round-robin", [])]),
                        (["agg", "post", "m"], [("f", 0, "route-key", ["k"])])]


def test_aggregate_reading_a_source_routes_by_all_group_fields():
    q, a, _ = streams()
    q.output("o", a.aggregate(cep.TupleWindow(3), by=["k", "v"], n=cep.count(), name="agg"))
    assert shape(q) == [(["agg"], [("a", 0, "route-key", ["k", "v"])])]


def test_global_aggregate_is_point_to_point_and_single_instance():
    q, a, _ = streams()
    q.output("o", a.aggregate(cep.TimeWindow("1s"), n=cep.count(), name="agg"))
    p = plan(q)
    assert shape(q) == [(["agg"], [("a", 0, "point-to-point", [])])]
    assert not p.subqueries[0].parallelizable
    d = Deployment("t#1", q, parallelism=4)
    assert d.parallelism == {"SQ1": 1}
    with pytest.raises(cep.QueryError, match="global aggregate"):
        Deployment("t#1", q, parallelism={"agg": 2})


def test_union_starts_a_subquery():
    q, a, b = streams()
    u = a.map(k="k", v="v", name="ma").union(b.map(k="k", v="v", name="mb"), name="u")
    q.output("o", u.filter(col("v") > 0, name="f"))
    assert shape(q) == [(["ma"], [("a", 0, "round-robin", [])]),
                        (["mb"], [("b", 0, "round-robin", [])]),
                        (["u", "f"], [("ma", 0, "round-robin", []), ("mb", 1, "round-robin", [])])]


def test_equi_join_routes_both_sides_by_their_keys():
    q, a, b = streams()
    r = b.map(id="k", ts="ts", w="v", name="mb")
    q.output("o", a.join(r, cep.TimeWindow("1s"), on=[("k", "id")], name="j"))
    assert shape(q) == [(["mb"], [("b", 0, "round-robin", [])]),
                        (["j"], [("a", 0, "route-key", ["k"]), ("mb", 1, "route-key", ["id"])])]


def test_join_with_only_a_condition_broadcasts_the_right_input():
    q, a, b = streams()
    q.output("o", a.join(b, cep.TimeWindow("1s"), where=col("v_left") < col("v_right"), name="j"))
    assert shape(q) == [(["j"], [("a", 0, "round-robin", []), ("b", 1, "broadcast", [])])]


def test_two_stateful_operators_in_a_row():
    q, a, _ = streams()
    per_key = a.aggregate(cep.TimeWindow("1s"), by="k", n=cep.count(), name="a1")
    q.output("o", per_key.aggregate(cep.TimeWindow("10s"), by="n", c=cep.count(), name="a2"))
    assert shape(q) == [(["a1"], [("a", 0, "route-key", ["k"])]), (["a2"], [("a1", 0, "route-key", ["n"])])]


def test_operators_not_feeding_an_output_are_not_planned():
    q, a, _ = streams()
    a.filter(col("v") > 1, name="unused")
    q.output("o", a.map(k="k", name="m"))
    assert shape(q) == [(["m"], [("a", 0, "round-robin", [])])]


def test_query_without_output():
    q, a, _ = streams()
    a.filter(col("v") > 1)
    with pytest.raises(cep.QueryError, match="no output"):
        plan(q)


def test_explain_shows_subqueries_balancers_and_point_to_point_for_one_instance():
    q, a, _ = streams()
    f = a.filter(col("v") > 0, name="f")
    q.output("o", f.aggregate(cep.TimeWindow("1s"), by=["k"], n=cep.count(), name="agg"))
    text = q.explain()
    assert "SQ1: f[filter((col('v') > 0))]" in text
    assert "in 0: a --round-robin--> f" in text
    assert "in 0: SQ1.f --route-key(k)--> agg" in text
    assert "output o <- SQ2.agg" in text
    d = Deployment("t#1", q, parallelism={"agg": 3})
    shown = d.explain()
    assert "SQ2 x3" in shown and "SQ1 x1" in shown
    assert "SQ1.f --route-key(k)--> agg" in shown
    assert "a --point-to-point--> f" in shown  # one instance of SQ1


def test_parallelism_forms_and_errors():
    q, a, _ = streams()
    q.output("o", a.filter(col("v") > 0, name="f").aggregate(cep.TimeWindow("1s"), by="k", n=cep.count(), name="agg"))
    assert Deployment("t#1", q, parallelism=3).parallelism == {"SQ1": 3, "SQ2": 3}
    assert Deployment("t#1", q, parallelism={"agg": 2}).parallelism == {"SQ1": 1, "SQ2": 2}
    for bad in (0, {"nope": 2}, {"agg": 0}, {"agg": 1.5}, "2"):
        with pytest.raises(cep.QueryError):
            Deployment("t#1", q, parallelism=bad)
    with pytest.raises(cep.QueryError, match="power of two"):
        Deployment("t#1", q, bins=100)


def test_duplicate_names_and_outputs():
    q, a, _ = streams()
    a.filter(col("v") > 1, name="x")
    with pytest.raises(cep.QueryError, match="used twice"):
        a.filter(col("v") > 1, name="x")
    q.output("o", a)
    with pytest.raises(cep.QueryError, match="already used"):
        q.output("o", a)
    with pytest.raises(cep.QueryError):
        q.output("a", a)  # a stream's name


ATOMIC = [  # (a call that raises, the corrected call)
    ("aggregate late= an output's name",
     lambda a, b: a.aggregate(cep.TimeWindow("1s"), by="k", n=cep.count(), late="o", name="agg"),
     lambda a, b: a.aggregate(cep.TimeWindow("1s"), by="k", n=cep.count(), late="late_rows", name="agg")),
    ("aggregate late= of a TupleWindow",
     lambda a, b: a.aggregate(cep.TupleWindow(2), by="k", n=cep.count(), late="late_rows", name="agg"),
     lambda a, b: a.aggregate(cep.TupleWindow(2), by="k", n=cep.count(), name="agg")),
    ("aggregate late= no name",
     lambda a, b: a.aggregate(cep.TimeWindow("1s"), by="k", n=cep.count(), late="", name="agg"),
     lambda a, b: a.aggregate(cep.TimeWindow("1s"), by="k", n=cep.count(), late="late_rows", name="agg")),
    ("demux", lambda a, b: a.demux(col("v") > 1, col("v"), name="d"),
     lambda a, b: a.demux(col("v") > 1, col("v") > 5, name="d")),
    ("demux unnamed", lambda a, b: a.demux(col("v") > 1, col("v")),
     lambda a, b: a.demux(col("v") > 1, col("v") > 5)),
    ("filter", lambda a, b: a.filter(col("v"), name="f"), lambda a, b: a.filter(col("v") > 1, name="f")),
    ("map", lambda a, b: a.map(k="k", w=col("nope"), name="m"), lambda a, b: a.map(k="k", w=col("v"), name="m")),
    ("join", lambda a, b: a.join(b, cep.TimeWindow("1s"), on="k", where=col("v_left"), name="j"),
     lambda a, b: a.join(b, cep.TimeWindow("1s"), on="k", name="j")),
    ("apply", lambda a, b: a.apply(None, name="ap"), lambda a, b: a.apply(lambda batch: batch, name="ap")),
    ("output of a source", lambda a, b: a.op.query.output("o", a), lambda a, b: a.op.query.output("copy", a)),
]


@pytest.mark.parametrize("what, bad, good", ATOMIC, ids=[c[0] for c in ATOMIC])
def test_a_call_that_raises_leaves_the_query_unchanged(what, bad, good):
    """aggregate(..., late=...) and demux() left the operators they had made in the query: the corrected
    call then failed "operator name 'agg' is used twice"."""
    def built(mistake: bool):
        q, a, b = streams()
        q.output("o", a.filter(col("v") > 0))
        if mistake:
            with pytest.raises(cep.SparkcepError):
                bad(a, b)
        good(a, b)
        q.output("last", a.filter(col("v") > 2))  # named as it would be without the mistake
        return [op.name for op in q.operators], list(q.outputs), list(q.sources), q.explain()

    assert built(mistake=True) == built(mistake=False)


def test_a_source_published_as_an_output_passes_through_one_operator():
    q, a, _ = streams()
    q.output("copy", a)
    (ops, inputs), = shape(q)
    assert len(ops) == 1 and inputs == [("a", 0, "round-robin", [])]
    assert q.outputs["copy"].schema == a.schema


def test_a_field_named_like_the_window_columns_is_never_overwritten():
    q = cep.Query("clash")
    a = q.stream("a", "k string, ts timestamp, window_start timestamp")
    b = q.stream("b", "k string, ts timestamp, v int64")
    joined = a.join(b, cep.TimeWindow("10s"), on="k")  # the join's own window columns come first
    assert joined.schema.names[:2] == ["window_start", "window_end"] and "window_start_left" in joined.schema.names
    with pytest.raises(cep.QueryError, match="window_start"):
        a.aggregate(cep.TimeWindow("10s"), by=["window_start"], n=cep.count())
