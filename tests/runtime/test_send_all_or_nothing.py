"""A send takes its whole batch or leaves no trace, whatever fails on the way (issue: ingestion contract).

Each test compares the outputs with a run that never had the failed batch,
and checks that sequence numbers went only to what was taken.
"""

import functools
import os
import time

import numpy as np
import pyarrow as pa
import pytest

import sparkcep as cep
from sparkcep.runtime import remote as remote_module

SCHEMA = "k string, ts timestamp, v int64"


def events(n, start=0, pad=0):
    i = np.arange(start, start + n)
    return pa.table({"k": [f"k{j % 5}" + "x" * pad for j in i],
                     "ts": pa.array(i * 100_000, pa.timestamp("us")), "v": i})


def picky(batch):
    """Fails on the row with v == 150, after the rows before it went through."""
    if 150 in batch.column("v").to_pylist():
        raise ValueError("v == 150 is not allowed here")
    return batch


def slow_once(flag, batch):
    """Stalls its instance manager for 3 s the first time it sees v == 5000 (the file ``flag`` says it did)."""
    if 5000 in batch.column("v").to_pylist() and not os.path.exists(flag):
        open(flag, "w").close()
        time.sleep(3)
    return batch


def query(name, fn):
    q = cep.Query(name)
    s = q.stream("in", SCHEMA).apply(fn, name="user_fn")
    q.output("rows", s)
    q.output("counts", s.aggregate(cep.TimeWindow("10s"), by="k", name="agg", n=cep.count(), sv=cep.sum("v")))
    return q


def outputs(engine):
    return {o: engine.collect(o, timeout=60).sort_by([(c, "ascending") for c in engine.collect(o).schema.names])
            for o in ("rows", "counts")}


def reference(*batches):
    with cep.Engine.local(workers=0) as e:
        e.deploy(query("ref", lambda b: b))
        for b in batches:
            e.send("in", b)
        e.end("in")
        return outputs(e)


@pytest.mark.parametrize("workers", [0, 2])
def test_an_operator_failing_mid_batch_fails_its_deployment_and_shows_nothing_of_the_batch(workers):
    with cep.Engine.local(workers=workers) as engine:
        dep = engine.deploy(query("picky", picky), parallelism=2)
        engine.send("in", events(100))
        before = {o: engine.collect(o, timeout=60).num_rows for o in ("rows", "counts")}
        with pytest.raises(cep.EngineError) as e:
            engine.send("in", events(100, 100))  # rows 100..149 pass the function, 150 fails it
            engine.collect("rows", timeout=30)
        err = e.value
        assert err.code == "OPERATOR_FAILED", err
        assert "'user_fn'" in str(err) and "query picky" in str(err) and "v == 150" in str(err)
        assert dep.error is not None
        log = engine.outputs["rows"]
        assert log.rows == before["rows"] == 100  # no row of the failed batch reached the output
        assert engine.outputs["counts"].rows == before["counts"] == 0
        with pytest.raises(cep.EngineError) as again:
            engine.send("in", events(10, 300))
        assert again.value.code == "OPERATOR_FAILED"


def test_a_send_that_fails_one_query_names_the_queries_that_took_it():
    """In process, the send raised the failing query's error alone while another query reading the stream
    had taken it: a retry put its rows there twice."""
    with cep.Engine.local(workers=0) as engine:
        for name, fn in (("picky", picky), ("plain", lambda b: b)):
            q = cep.Query(name)
            q.output(f"{name}_rows", q.stream("in", SCHEMA).apply(fn, name="user_fn"))
            engine.deploy(q)
        with pytest.raises(cep.EngineError) as e:
            engine.send("in", events(200))
        assert e.value.code == "OPERATOR_FAILED" and "v == 150" in str(e.value)
        assert str(e.value).endswith("; queries ['plain'] reading stream 'in' took this send: do not send it again")
        assert engine.outputs["plain_rows"].rows == 200 and engine.outputs["picky_rows"].rows == 0


def test_a_row_larger_than_a_ring_arrives_whole_and_takes_its_own_sequence_numbers():
    big = events(100, pad=50_000)  # every row ~50 KB, the rings hold 64 KiB
    with cep.Engine.local(workers=2, ring_bytes=1 << 16) as engine:
        engine.deploy(query("big", lambda b: b), parallelism=2)
        engine.send("in", big)
        engine.send("in", events(50, 100))
        engine.end("in")
        got = outputs(engine)
        seq = [b.column("__seq") for part in range(2)
               for b in engine.outputs["rows"].read(part, 0, engine.outputs["rows"].latest().get(part, 0), seq=True)]
        assert engine.metrics()["sequence"] == 150
    assert sorted(pa.chunked_array(seq).to_pylist()) == list(range(150))
    want = reference(big, events(50, 100))
    assert got["rows"].equals(want["rows"]) and got["counts"].equals(want["counts"])


def test_a_send_that_times_out_on_back_pressure_leaves_no_trace_and_can_be_sent_again(tmp_path, monkeypatch):
    monkeypatch.setattr(remote_module, "SEND_TIMEOUT_S", 0.5)
    first, stalled = events(5000), events(20_000, 5000)
    with cep.Engine.local(workers=1, ring_bytes=1 << 16) as engine:
        engine.deploy(query("slow", functools.partial(slow_once, str(tmp_path / "stalled"))))
        engine.send("in", first)
        with pytest.raises(cep.EngineError) as e:
            engine.send("in", stalled)  # its instance stalls for 3 s: the rings fill, the send gives up
        assert e.value.code == "BACKPRESSURE_TIMEOUT"
        assert engine.metrics()["sequence"] == 5000  # no sequence number went to the aborted batch
        time.sleep(3)
        assert outputs(engine)["rows"].num_rows == 5000
        engine.send("in", stalled)  # sent again: taken once
        engine.end("in")
        got = outputs(engine)
        assert engine.metrics()["sequence"] == 25_000
    want = reference(first, stalled)
    assert got["rows"].equals(want["rows"]) and got["counts"].equals(want["counts"])
