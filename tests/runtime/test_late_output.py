"""Late data you can see: counted per stream and operator, logged once, kept in a side output on request."""

import logging
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

import reference as ref
import sparkcep as cep
from cases import T0
from harness import plain, table
from reference import S, WM, assert_same_rows

EV = {"k": "string", "ts": "timestamp", "v": "int64"}
SIZE, ADVANCE, LATENESS = 10 * S, 5 * S, 2 * S


def query(name="lq"):
    q = cep.Query(name)
    s = q.stream("ev", EV)
    q.output("counts", s.filter(cep.col("v") >= 0, name="keep")
             .aggregate(cep.TimeWindow("10s", advance="5s", lateness="2s"), by="k", name="agg",
                        late="late_ev", n=cep.count()))
    return q


def disordered(rng: random.Random, n: int):
    """Mostly increasing event times with some far behind: sends of 1-20 rows."""
    rows, t = [], T0
    for i in range(n):
        t += rng.randint(0, 2 * S)
        ts = t - rng.choice([0, 0, 0, 8 * S, 20 * S])
        rows.append({"k": f"k{rng.randint(0, 4)}", "ts": ts, "v": i})
    sends, i = [], 0
    while i < n:
        k = rng.randint(1, 20)
        sends.append(("ev", rows[i:i + k]))
        i += k
    return sends


def expected_late(sends):
    """The rows that missed at least one of their windows, by the reference's stamps."""
    window = ref.Time(SIZE, ADVANCE, LATENESS)
    stamped = ref.stamp(sends, {"ev": "ts"})["ev"]
    late = [r for r in stamped if not all(window.admitted(s, r[WM]) for s in window.starts(r["ts"]))]
    return ref.frame([{f: r[f] for f in EV} for r in late], EV)


def run(engine, sends, parallelism):
    q = query()
    engine.deploy(q, parallelism=parallelism)
    try:
        for stream, rows in sends:
            engine.send(stream, table(rows, EV))
        engine.end("ev")
        return plain(engine.collect("late_ev", timeout=60)), engine.metrics()
    finally:
        engine.undeploy(q.name)


@given(seed=st.integers(0, 10_000), parallelism=st.sampled_from([1, 3]))
def test_the_late_output_holds_exactly_the_late_tuples_as_they_came(seed, parallelism):
    sends = disordered(random.Random(seed), 120)
    want = expected_late(sends)
    with cep.Engine.local(workers=0) as engine:
        got, metrics = run(engine, sends, parallelism)
    assert_same_rows(got, want, "late_ev")
    assert metrics["late"]["lq"]["agg"] == len(want)
    assert metrics["late_by_stream"].get("ev", {}).get("lq.agg", 0) == len(want)


def test_late_tuples_on_instance_managers_equal_the_in_process_run(worker_engines):
    sends = disordered(random.Random(3), 400)
    want = expected_late(sends)
    assert len(want) > 10
    got, metrics = run(worker_engines(2), sends, parallelism=2)
    assert_same_rows(got, want, "late_ev on workers")
    assert metrics["late_by_stream"]["ev"]["lq.agg"] == len(want)


def test_the_first_late_tuple_is_logged_once_with_where_it_went(caplog):
    sends = [("ev", [{"k": "a", "ts": T0 + 30 * S, "v": 1}]), ("ev", [{"k": "a", "ts": T0, "v": 2}]),
             ("ev", [{"k": "b", "ts": T0, "v": 3}])]
    with caplog.at_level(logging.WARNING, logger="sparkcep"), cep.Engine.local() as engine:
        q = query("logged")
        engine.deploy(q)
        for stream, rows in sends:
            engine.send(stream, table(rows, EV))
    lines = [r.getMessage() for r in caplog.records if "late" in r.getMessage()]
    assert len(lines) == 1 and "'agg'" in lines[0] and "'late_ev'" in lines[0] and "logged" in lines[0]


def test_late_counts_name_every_stream_of_a_union():
    q = cep.Query("u")
    a, b = q.stream("a", EV), q.stream("b", EV)
    q.output("n", a.union(b).aggregate(cep.TimeWindow("10s"), by="k", name="agg", n=cep.count()))
    with cep.Engine.local() as engine:
        engine.deploy(q)
        engine.send("a", table([{"k": "x", "ts": T0 + 30 * S, "v": 1}], EV))
        engine.send("b", table([{"k": "x", "ts": T0 + 30 * S, "v": 1}], EV))
        engine.send("a", table([{"k": "x", "ts": T0, "v": 1}], EV))
        m = engine.metrics()
    assert m["late"]["u"]["agg"] == 1
    assert m["late_by_stream"] == {"a+b": {"u.agg": 1}}


def test_only_a_time_window_has_a_late_output():
    q = cep.Query("bad")
    with pytest.raises(cep.QueryError, match="TimeWindow"):
        q.stream("ev", EV).aggregate(cep.TupleWindow(3), by="k", late="x", n=cep.count())
    q = cep.Query("clash")
    s = q.stream("ev", EV)
    q.output("x", s.filter(cep.col("v") > 0))
    with pytest.raises(cep.QueryError, match="'x'"):
        s.aggregate(cep.TimeWindow("1s"), late="x", n=cep.count())


def test_sparkcep_status_shows_late_tuples_per_stream_and_operator():
    from sparkcep.control.status import render

    sends = [("ev", [{"k": "a", "ts": T0 + 30 * S, "v": 1}]), ("ev", [{"k": "a", "ts": T0, "v": 2}])]
    with cep.Engine.local() as engine:
        engine.deploy(query("shown"))
        for stream, rows in sends:
            engine.send(stream, table(rows, EV))
        text = render({"address": "x", "pid": 1}, engine.metrics())
    assert "late tuples: agg 1" in text and "ev: shown.agg 1" in text
