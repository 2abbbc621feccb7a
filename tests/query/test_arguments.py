"""A misspelled keyword of the public API is refused by name, with the closest valid one."""

import numpy as np
import pytest

import sparkcep as cep
from sparkcep.errors import EngineError, QueryError


@pytest.fixture
def s():
    return cep.Query("q").stream("s", "ip string, ts timestamp, v int64")


CASES = [
    ("aggregate", lambda s: s.aggregate(cep.TimeWindow("10s"), byy=["ip"], n=cep.count()), "byy", "by"),
    ("aggregate late", lambda s: s.aggregate(cep.TimeWindow("10s"), by="ip", lat="x", n=cep.count()), "lat", "late"),
    ("aggregate name", lambda s: s.aggregate(cep.TimeWindow("10s"), nme="a", n=cep.count()), "nme", "name"),
    ("aggregate window", lambda s: s.aggregate(windw=cep.TimeWindow("10s"), by="ip", n=cep.count()), "windw",
     "window"),  # Python's TypeError about a missing 'window' named no typo
    ("join", lambda s: s.join(s, cep.TimeWindow("1s"), onn="ip"), "onn", "on"),
    ("join where", lambda s: s.join(s, cep.TimeWindow("1s"), on="ip", wher=cep.col("v_left") > 1), "wher", "where"),
    ("filter", lambda s: s.filter(cep.col("v") > 1, nam="x"), "nam", "name"),
    ("stateful", lambda s: s.stateful(None, byy="ip"), "byy", "by"),
    ("TimeWindow", lambda s: cep.TimeWindow("10s", advanc="5s"), "advanc", "advance"),
    ("TimeWindow lateness", lambda s: cep.TimeWindow("10s", latenes="1s"), "latenes", "lateness"),
    ("TupleWindow", lambda s: cep.TupleWindow(3, advnce=1), "advnce", "advance"),
    ("stream", lambda s: s.op.query.stream("t", "a int64, ts timestamp", tim="ts"), "tim", "time"),
    ("stream max_ahead", lambda s: s.op.query.stream("t", "a int64, ts timestamp", max_ahed="1d"), "max_ahed",
     "max_ahead"),
    ("count", lambda s: cep.count(feild="v"), "feild", "field"),
]


@pytest.mark.parametrize("what, call, given, meant", CASES, ids=[c[0] for c in CASES])
def test_a_misspelled_keyword_is_refused_naming_the_closest_valid_one(s, what, call, given, meant):
    with pytest.raises(QueryError) as e:
        call(s)
    assert e.value.code == "UNKNOWN_ARGUMENT"
    assert f"unknown argument {given!r}" in str(e.value) and f"did you mean {meant!r}" in str(e.value)


def test_engine_and_deploy_keywords():
    with pytest.raises(EngineError) as e:
        cep.Engine.local(worker=2)
    assert e.value.code == "UNKNOWN_ARGUMENT" and "'workers'" in str(e.value)
    q = cep.Query("q")
    q.output("o", q.stream("s", "ip string, ts timestamp").filter(cep.col("ip") == "a"))
    with cep.Engine.local() as engine:
        with pytest.raises(QueryError) as e:
            engine.deploy(q, paralelism=2)
        assert e.value.code == "UNKNOWN_ARGUMENT" and "did you mean 'parallelism'" in str(e.value)
        assert not engine.deployments  # nothing half-applied


@pytest.mark.parametrize("given, meant", [("row", "rows"), ("age", "age_s"), ("byte", "bytes")])
def test_a_misspelled_retention_keyword_is_refused_naming_the_closest_valid_one(given, meant):
    """Retention(row=5) raised Python's TypeError, with no code and no suggestion."""
    with pytest.raises(EngineError) as e:
        cep.Retention(**{given: 5})
    assert e.value.code == "UNKNOWN_ARGUMENT"
    assert f"Retention() got an unknown argument {given!r} (did you mean {meant!r}?)" in str(e.value)


def test_function_outputs_named_freely_stay_valid(s):
    """An output field named like no argument is still a function's output name."""
    out = s.aggregate(cep.TimeWindow("10s"), by="ip", total=cep.sum("v"), bytes=cep.count())
    assert out.schema.names == ["window_start", "window_end", "ip", "total", "bytes"]


@pytest.mark.parametrize("declare", [lambda q: q.stream("", "k string"), lambda q: q.stream(" ", "k string"),
                                     lambda q: q.stream(5, "k string"),
                                     lambda q: q.output("", q.stream("a", "k string")),
                                     lambda q: q.output(None, q.stream("a", "k string"))])
def test_a_stream_or_output_needs_a_name(declare):
    """A stream named 5 or '' was taken (a query named '' was not), and nothing could send to it by name."""
    with pytest.raises(cep.QueryError) as e:
        declare(cep.Query("q"))
    assert "needs a non-empty name" in str(e.value)


@pytest.mark.parametrize("window", [cep.TimeWindow("10s"), cep.TupleWindow(2), cep.Running()], ids=repr)
def test_a_key_named_twice_or_not_a_name_is_refused(window):
    """by=["k", "k"] gave keys of the engine's own encoding ('\\x01\\x01...a' for 'a'), or a failed query with a
    running aggregate; by=5 raised Python's TypeError."""
    s = cep.Query("q").stream("s", "k string, ts timestamp, v int64")
    with pytest.raises(QueryError, match=r"aggregate\(\) by=\['k', 'v', 'k'\] names 'k' more than once"):
        s.aggregate(window, by=["k", "v", "k"], n=cep.count())
    for by in (5, ["k", 5], {"k": 1}):
        with pytest.raises(QueryError, match=r"by=.*: expected a field name or a list of them"):
            s.aggregate(window, by=by, n=cep.count())
    assert s.aggregate(window, by=None, n=cep.count()).schema.names[-1:] == ["n"]


def test_a_stateful_key_named_twice_is_refused():
    class Count(cep.StatefulOperator):
        schema = "k string, n int64"

        def process(self, batch, bins, state):
            return batch
    s = cep.Query("q").stream("s", "k string, ts timestamp")
    with pytest.raises(QueryError, match=r"stateful\(\) by=\('k', 'k'\) names 'k' more than once"):
        s.stateful(Count(), by=("k", "k"))


def test_a_number_out_of_range_is_named_as_given():
    """gap_ms=10**9 was refused as "got 1e+09"."""
    from sparkcep.arguments import number
    for given, shown in [(10**9, "1000000000"), (np.int64(70_000), "70000"), (-3, "-3")]:
        with pytest.raises(QueryError, match=rf"gap_ms must be [<>]= \d+, got {shown}$"):
            number(given, "gap_ms", maximum=60_000)
