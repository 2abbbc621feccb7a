"""The engine's Python API: deploy, send, end, collect, subscribe, metrics."""

import pyarrow as pa
import pytest

import reference as ref
import sparkcep as cep
from cases import T0
from harness import plain, table
from reference import S, assert_same_rows

EV = {"k": "string", "ts": "timestamp", "v": "int64"}


def rows(*secs):
    return [{"k": "ab"[i % 2], "ts": T0 + int(s * S), "v": i} for i, s in enumerate(secs)]


def counting(name="q", stream="ev", out="out"):
    q = cep.Query(name)
    q.output(out, q.stream(stream, EV).aggregate(cep.TimeWindow("10s"), by="k", n=cep.count()))
    return q


def test_the_documented_session():
    with cep.Engine.local(workers=0) as e:
        e.deploy(counting(), parallelism=2)
        assert e.send("ev", table(rows(1, 2, 3, 15), EV)) == 4
        e.end("ev")
        t = e.collect("out")
    assert isinstance(t, pa.Table)
    assert sorted((r["k"], r["n"]) for r in t.to_pylist()) == [("a", 2), ("b", 1), ("b", 1)]


def test_two_queries_read_one_stream():
    with cep.Engine.local() as e:
        e.deploy(counting("q1", out="o1"))
        q2 = cep.Query("q2")
        q2.output("o2", q2.stream("ev", EV).filter(cep.col("v") > 0))
        e.deploy(q2, parallelism=3)
        data = rows(1, 2, 11, 12)
        e.send("ev", table(data, EV))
        e.end("ev")
        assert e.collect("o1").num_rows == 4
        st = ref.stamp([("ev", data)], {"ev": "ts"})["ev"]
        assert_same_rows(plain(e.collect("o2")), ref.frame(ref.filter_rows(st, ref.Bin(">", ref.Col("v"), ref.Lit(0))), EV))
        assert e.metrics()["outputs"] == {"o1": 4, "o2": 3}
        assert e.metrics()["sequence"] == 4


def test_deploy_errors():
    with cep.Engine.local() as e:
        e.deploy(counting())
        with pytest.raises(cep.QueryError, match="already deployed"):
            e.deploy(counting())
        with pytest.raises(cep.QueryError, match="already a stream"):
            e.deploy(counting("other"))  # same output name
        clash = cep.Query("clash")
        clash.output("o3", clash.stream("ev", "k string, ts timestamp"))
        with pytest.raises(cep.QueryError, match="schema"):
            e.deploy(clash)
        reads_output = cep.Query("reads")
        reads_output.output("o4", reads_output.stream("out", "k string"))
        with pytest.raises(cep.QueryError, match="output of another query"):
            e.deploy(reads_output)
        with pytest.raises(cep.QueryError):
            e.deploy("not a query")


def test_queries_reading_one_stream_declare_it_alike():
    """Its rows are stamped once for all its readers: a second query giving the stream another event time
    field or max_ahead got the first query's, its windows silently in the wrong time."""
    fields = {"k": "string", "t1": "timestamp", "t2": "timestamp"}

    def reading(name, **declared):
        q = cep.Query(name)
        q.output(f"{name}_out", q.stream("ev", fields, **declared).aggregate(cep.TimeWindow("10s"), n=cep.count()))
        return q
    with cep.Engine.local(workers=0) as e:
        e.deploy(reading("q1", time="t1"))
        with pytest.raises(cep.QueryError, match="event time field t2 but query 'q1' declares it with t1"):
            e.deploy(reading("q2", time="t2"))
        with pytest.raises(cep.QueryError, match="max_ahead"):
            e.deploy(reading("q3", time="t1", max_ahead="1h"))
        e.deploy(reading("q4", time="t1"))
        assert sorted(e.metrics()["queries"]) == ["q1", "q4"]


def test_a_query_is_not_deployed_on_a_stream_that_has_ended():
    """It could never get a row; once no query reads the stream, a deploy starts it afresh."""
    with cep.Engine.local(workers=0) as e:
        e.deploy(counting("q1", out="o1"))
        e.send("ev", table(rows(1, 2), EV))
        e.end("ev")
        with pytest.raises(cep.QueryError, match=r"stream 'ev' has ended \(queries \['q1'\] read it\)") as err:
            e.deploy(counting("q2", out="o2"))
        assert err.value.code == "ENDED"
        e.undeploy("q1")
        e.deploy(counting("q2", out="o2"))
        assert e.send("ev", table(rows(3), EV)) == 1


def test_a_misspelled_stream_output_or_field_is_named_with_the_closest_one():
    with cep.Engine.local(workers=0) as e:
        e.deploy(counting(stream="events", out="counts"))
        with pytest.raises(cep.UnknownStreamError, match=r"'event' \(did you mean 'events'\?\)"):
            e.send("event", table(rows(1), EV))
        with pytest.raises(cep.UnknownStreamError, match=r"'count' \(did you mean 'counts'\?\)"):
            e.collect("count")
    with pytest.raises(cep.SchemaError, match=r"'kk' in aggregate by= \(did you mean 'k'\?\)"):
        cep.Query("q").stream("ev", EV).aggregate(cep.TimeWindow("1s"), by="kk", n=cep.count())


def test_subscribe_sees_every_batch_from_then_on():
    seen = []
    with cep.Engine.local() as e:
        e.deploy(counting())
        e.subscribe("out", seen.append)
        e.send("ev", table(rows(1, 2), EV))
        assert seen == []
        e.send("ev", table(rows(11), EV))
        assert sum(b.num_rows for b in seen) == 2
        e.end("ev")
        assert sum(b.num_rows for b in seen) == 3
        assert all(b.schema.names == ["window_start", "window_end", "k", "n"] for b in seen)
        with pytest.raises(cep.UnknownStreamError):
            e.subscribe("nope", seen.append)


def test_an_output_deployed_without_retention_reaches_subscribers_only():
    seen = []
    with cep.Engine.local() as e:
        e.deploy(counting(), retain=False)
        e.subscribe("out", seen.append)
        e.send("ev", table(rows(1, 2, 11), EV))
        e.end("ev")
        assert sum(b.num_rows for b in seen) == 3
        log = e.outputs["out"]
        assert log.retained == 0 and log.rows == 3 and log.latest() == log.earliest()
        with pytest.raises(cep.EngineError, match="'out' keeps no rows.*retain=False") as err:
            e.collect("out")
        assert err.value.code == "NOT_RETAINED"


def test_collect_before_any_output_is_an_empty_table_with_the_schema():
    with cep.Engine.local() as e:
        e.deploy(counting())
        t = e.collect("out")
        assert t.num_rows == 0 and t.schema.names == ["window_start", "window_end", "k", "n"]


def test_a_closed_engine_refuses_work():
    e = cep.Engine.local()
    e.deploy(counting())
    e.close()
    with pytest.raises(cep.EngineError) as err:
        e.send("ev", table(rows(1), EV))
    assert err.value.code == "CLOSED"


def test_end_of_one_input_of_a_join_waits_for_the_other():
    schema = {"k": "string", "ts": "timestamp", "v": "int64"}
    q = cep.Query("j")
    l, r = q.stream("l", schema), q.stream("r", schema)
    q.output("out", l.join(r, cep.TimeWindow("10s"), on="k"))
    with cep.Engine.local() as e:
        e.deploy(q)
        e.send("l", table([{"k": "a", "ts": T0 + S, "v": 1}], schema))
        e.end("l")
        assert e.collect("out").num_rows == 0
        e.send("r", table([{"k": "a", "ts": T0 + 2 * S, "v": 2}], schema))
        e.end("r")
        assert e.collect("out").num_rows == 1


def test_a_source_stream_as_an_output():
    q = cep.Query("mirror")
    q.output("copy", q.stream("ev", EV))
    data = rows(1, 5, 2)
    with cep.Engine.local() as e:
        e.deploy(q, parallelism=2)
        e.send("ev", table(data[:1], EV))
        e.send("ev", table(data[1:], EV))
        e.end("ev")
        assert_same_rows(plain(e.collect("copy")), ref.frame(ref.stamp([("ev", data)], {"ev": "ts"})["ev"], EV))
