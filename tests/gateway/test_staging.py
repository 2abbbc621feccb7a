"""A Spark micro-batch through the endpoint protocol: staged by tasks, one engine send at commit, once.

These drive the protocol as the Spark sink does (``stage`` per task,
``commit_stage``/``abort_stage`` on the driver), including the steps Spark
cannot be made to take in local mode: a task killed mid-stage and retried,
a driver restarted between its tasks' writes and its commit, an engine
restarted in between. Outputs are compared with an engine fed by plain
sends: equal to a run without the failed batch, or with it exactly once.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pyarrow as pa
import pytest

import sparkcep as cep
from sparkcep.gateway import protocol
from sparkcep.gateway.client import EngineClient
from sparkcep.errors import InputError

T0 = 1_704_067_200_000_000
S = 1_000_000
W = "query-1"  # a writer: Spark's streaming query id


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCEP_HOME", str(tmp_path))


def _query() -> cep.Query:
    q = cep.Query("demo")
    s = q.stream("connections", "ip string, ts timestamp, bytes int64")
    q.output("per_ip", s.aggregate(cep.TimeWindow("10s"), by=["ip"], name="window", n=cep.count(),
                                   total=cep.sum("bytes")))
    q.output("all", s.map(ip="ip", ts="ts", bytes="bytes", name="copy"))
    return q


@pytest.fixture
def served(home):
    with cep.Engine.local() as e:
        e.deploy(_query())
        with EngineClient.connect() as c:
            yield e, c


def _rows(start_s: float, n: int, step_s: float = 0.1, ts: list | None = None) -> pa.Table:
    i = np.arange(n)
    times = ts if ts is not None else [int(t) for t in T0 + (start_s * S + i * step_s * S).astype(np.int64)]
    return pa.table({"ip": [f"10.0.0.{k % 3}" for k in range(n)], "ts": pa.array(times, pa.timestamp("us")),
                     "bytes": pa.array(i + int(start_s * 1000), pa.int64())})


def _stage(c: EngineClient, batch: int, parts: dict[int, pa.Table], attempt: str = "a", order=None):
    """Stage each partition as one task would; the commit's (partition, attempt, rows, run) list."""
    out = []
    for p in order or sorted(parts):
        reply = c.stage("connections", W, batch, p, f"{attempt}{p}", 0, parts[p].to_batches())
        out.append((p, f"{attempt}{p}", parts[p].num_rows, reply["engine"]))
    return out


def _outputs(e: cep.Engine) -> dict[str, pa.Table]:
    e.end("connections")
    return {o: e.collect(o) for o in ("per_ip", "all")}


def _reference(*sends: pa.Table) -> dict[str, pa.Table]:
    """The outputs of an engine fed by plain sends, one per micro-batch."""
    with cep.Engine.local() as e:
        e.deploy(_query())
        for t in sends:
            e.send("connections", t)
        return _outputs(e)


def _same(got: dict, want: dict) -> None:
    for name in want:
        assert got[name].sort_by([(c, "ascending") for c in got[name].column_names]).equals(
            want[name].sort_by([(c, "ascending") for c in want[name].column_names])), name


def test_micro_batch_is_one_send_in_partition_order(served):
    """Partition 1 (the later event times) staged first: the commit still sends partition 0 first, and
    as one send its rows are stamped with the watermark from before the batch -- nothing is late."""
    e, c = served
    early, late = _rows(0, 100), _rows(10, 100)
    parts = _stage(c, 0, {0: early, 1: late}, order=[1, 0])
    assert c.commit_stage("connections", W, 0, parts) == {"rows": 200, "duplicate": False}
    assert e.collect("all").column("bytes").to_pylist() == early.column("bytes").to_pylist() + \
        late.column("bytes").to_pylist()
    got = _outputs(e)
    assert e.metrics()["late"]["demo"] == {"window": 0}
    assert sum(got["per_ip"].column("n").to_pylist()) == 200
    _same(got, _reference(pa.concat_tables([early, late])))


def test_task_killed_mid_stage_then_retried_is_taken_once(served):
    e, c = served
    rows = _rows(0, 300)
    batches = rows.to_batches(max_chunksize=100)
    c.stage("connections", W, 0, 0, "killed", 0, batches[:1])
    c.stage("connections", W, 0, 0, "killed", 1, batches[1:2])  # ... and the task dies
    c.stage("connections", W, 0, 0, "retry", 0, batches[:2])
    c.stage("connections", W, 0, 0, "retry", 1, batches[2:])
    c.stage("connections", W, 0, 0, "retry", 1, batches[2:])  # a chunk sent again replaces itself
    assert e.endpoint.staging.staged(W, 0) == {0: 300}
    with pytest.raises(InputError) as err:
        c.stage("connections", W, 0, 0, "killed", 2, batches[2:])  # the dead attempt's last words
    assert err.value.code == "STAGE_ORDER"
    assert c.commit_stage("connections", W, 0, [(0, "retry", 300, e.run_id)])["rows"] == 300
    _same(_outputs(e), _reference(rows))


def test_commit_refuses_partitions_not_staged_as_their_task_reported(served):
    e, c = served
    parts = _stage(c, 0, {0: _rows(0, 50), 1: _rows(5, 50)})
    for wrong, what in (((1, "a1", 49, e.run_id), "49 rows"), ((1, "zz", 50, e.run_id), "attempt zz"),
                        ((2, "a2", 7, e.run_id), "partition 2")):
        with pytest.raises(InputError) as err:
            c.commit_stage("connections", W, 0, [parts[0], wrong])
        assert err.value.code == "STAGE_MISSING" and what in str(err.value)
    assert e.metrics()["sequence"] == 0  # nothing taken
    assert c.commit_stage("connections", W, 0, parts)["rows"] == 100


def test_replayed_committed_batch_is_taken_once(served):
    """The driver died after the engine took batch 0 but before Spark recorded it: Spark replays batch 0."""
    e, c = served
    b0, b1 = _rows(0, 80), _rows(8, 80)
    c.commit_stage("connections", W, 0, _stage(c, 0, {0: b0}))
    replay = _stage(c, 0, {0: b0}, attempt="r")
    assert e.endpoint.staging.staged(W, 0) == {}  # a committed batch stages nothing
    assert c.commit_stage("connections", W, 0, replay) == {"rows": 0, "duplicate": True}
    assert c.commit_stage("connections", W, 1, _stage(c, 1, {0: b1}))["rows"] == 80
    assert c.commit_stage("connections", "another-query", 0, _stage_as(c, "another-query", b1))["rows"] == 80
    assert e.endpoint.counters["duplicate_batches"] == 1
    _same(_outputs(e), _reference(b0, b1, b1))


def _stage_as(c, writer, table):
    reply = c.stage("connections", writer, 0, 0, "x", 0, table.to_batches())
    return [(0, "x", table.num_rows, reply["engine"])]


def test_driver_restarted_between_stage_and_commit(served):
    """Tasks staged batch 1, the driver died before its commit; the new driver replays batch 1."""
    e, c = served
    b0, b1 = _rows(0, 60), {0: _rows(6, 40), 1: _rows(7, 40)}
    c.commit_stage("connections", W, 0, _stage(c, 0, {0: b0}))
    _stage(c, 1, b1, attempt="old")  # ... no commit: the driver is gone
    assert e.collect("all").num_rows == 60  # staged rows are not visible
    parts = _stage(c, 1, b1, attempt="new")
    assert c.commit_stage("connections", W, 1, parts)["rows"] == 80
    assert e.endpoint.snapshot()["endpoint"]["staged_rows"] == 0
    _same(_outputs(e), _reference(b0, pa.concat_tables([b1[0], b1[1]])))


def test_failing_partition_leaves_no_trace_and_the_retry_is_taken_once(served):
    """One partition of two has a null event time: the engine refuses the whole micro-batch."""
    e, c = served
    b0 = _rows(0, 100)
    c.commit_stage("connections", W, 0, _stage(c, 0, {0: b0}))
    good, bad = _rows(10, 100), _rows(11, 100, ts=[T0 + 11 * S] * 99 + [None])
    parts = _stage(c, 1, {0: good, 1: bad})
    with pytest.raises(InputError) as err:
        c.commit_stage("connections", W, 1, parts)
    assert "'ts'" in str(err.value)
    assert e.metrics()["sequence"] == 100 and e.collect("all").num_rows == 100
    assert c.abort_stage(W, 1) == 200
    fixed = _rows(11, 100)
    assert c.commit_stage("connections", W, 1, _stage(c, 1, {0: good, 1: fixed}, attempt="b"))["rows"] == 200
    _same(_outputs(e), _reference(b0, pa.concat_tables([good, fixed])))


def test_partition_whose_staging_fails_aborts_the_batch(served):
    """A stage request cut short (the task's connection died mid-payload) stages nothing; abort drops the rest."""
    e, c = served
    b0, b1 = _rows(0, 50), {0: _rows(5, 50), 1: _rows(6, 50)}
    c.commit_stage("connections", W, 0, _stage(c, 0, {0: b0}))
    _stage(c, 1, {0: b1[0]})
    payload = protocol.to_ipc(b1[1].to_batches(), b1[1].schema)
    head = json.dumps({"op": "stage", "stream": "connections", "writer": W, "batch": 1, "partition": 1,
                       "attempt": "a1", "chunk": 0}).encode()
    cut = EngineClient(c.address, token=c.token)
    s = cut._socket()  # a connection that proved the token, as a task's does
    s.sendall(struct.pack(">2sBBIQ", b"UC", protocol.VERSION, 0, len(head), payload.size) + head)
    s.sendall(payload.to_pybytes()[: payload.size // 2])
    cut.close()  # the task dies mid-payload: its partition is never staged
    assert e.endpoint.staging.staged(W, 1) == {0: 50}
    c.abort_stage(W, 1)
    assert e.collect("all").num_rows == 50 and e.endpoint.snapshot()["endpoint"]["staged_rows"] == 0
    _same(_outputs(e), _reference(b0))  # the run without the failed batch


def test_engine_restarted_between_stage_and_commit(served, home):
    e, c = served
    parts = _stage(c, 0, {0: _rows(0, 30)})
    with cep.Engine.local() as e2:
        e2.deploy(_query())
        with EngineClient(e2.endpoint.address) as c2:
            with pytest.raises(InputError) as err:
                c2.commit_stage("connections", W, 0, parts)
    assert err.value.code == "STAGE_MISSING" and e.run_id in str(err.value) and e2.run_id in str(err.value)


def test_staged_rows_of_older_batches_go_when_a_later_batch_commits(served):
    """Every task of batch 1 failed (the driver cannot tell whose rows to abort); batch 2 commits."""
    e, c = served
    _stage(c, 1, {0: _rows(0, 20)})
    assert e.endpoint.snapshot()["endpoint"]["staged_rows"] == 20
    c.commit_stage("connections", W, 2, _stage(c, 2, {0: _rows(2, 20)}))
    assert e.endpoint.snapshot()["endpoint"]["staged_rows"] == 0
    assert c.stage("connections", W, 1, 0, "late", 0, _rows(0, 20).to_batches())["duplicate"] is True


def test_a_task_stages_each_chunk_as_one_record_batch(served, monkeypatch):
    """Spark hands a writer 10,000-row batches; the engine gets each chunk of them joined into one."""
    from sparkcep.spark import writer
    from sparkcep.spark.connection import Target

    e, c = served
    monkeypatch.setattr(writer, "chunk_bytes", lambda: 64 << 10)
    rows = _rows(0, 5_000, step_s=0.001)
    staged = writer.stage_partition(Target(e.endpoint.address), "connections", rows.column_names,
                                    rows.to_batches(max_chunksize=100), W, 0, 0, "a0")
    chunks = e.endpoint.staging._staged[W][0][0].chunks
    assert staged.rows == 5_000 and len(chunks) > 1
    assert all(t.num_rows > 100 and len(t.to_batches()) == 1 for t in chunks)
    c.commit_stage("connections", W, 0, [(0, "a0", 5_000, staged.engine)])
    _same(_outputs(e), _reference(rows))
