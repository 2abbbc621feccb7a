"""Micro-batches through the sink protocol with a failure at a random moment of each (hypothesis).

A sequence of Spark micro-batches, each written by one to three tasks in
chunks, and at each one a failure Spark can meet: a task killed mid-stage and
retried, a partition the engine refuses at commit, a driver that restarted
between its tasks' writes and its commit, a commit Spark did not record (the
batch replayed after the engine took it), an abort. Whatever the moments,
the outputs equal an engine fed each micro-batch's good rows by one plain
send, in batch order: every batch taken exactly once, nothing of a failed
attempt left behind.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_staging import T0, S, _query, _same

import sparkcep as cep
from sparkcep.gateway.client import EngineClient
from sparkcep.errors import InputError

W = "query-f"
STREAM = "connections"
FAILURES = ("none", "task_killed", "bad_partition", "driver_restarted", "commit_replayed", "aborted")


def _partition(batch: int, seed: int, n: int) -> pa.Table:
    """``n`` rows whose event times fall in micro-batch ``batch``'s 10 s (some late, by chance)."""
    rng = np.random.default_rng(seed)
    ts = T0 + batch * 5 * S + rng.integers(0, 10 * S, n)
    return pa.table({"ip": [f"10.0.0.{k}" for k in rng.integers(0, 4, n)], "ts": pa.array(ts, pa.timestamp("us")),
                     "bytes": pa.array(rng.integers(0, 1000, n), pa.int64())})


def _with_null_time(t: pa.Table, row: int) -> pa.Table:
    ts = t.column("ts").to_pylist()
    ts[row] = None
    return t.set_column(1, "ts", pa.array(ts, pa.timestamp("us")))


micro_batch = st.fixed_dictionaries({
    "sizes": st.lists(st.integers(1, 30), min_size=1, max_size=3),
    "seed": st.integers(0, 2**16),
    "chunk": st.integers(1, 12),
    "failure": st.sampled_from(FAILURES),
    "victim": st.integers(0, 2),
})


class SparkSink:
    """Drives the protocol as the Spark sink does: tasks stage, the driver commits or aborts."""

    def __init__(self, client: EngineClient, chunk: int):
        self.c, self.chunk = client, chunk

    def stage(self, batch: int, parts: dict[int, pa.Table], attempt: str, only: int | None = None,
              chunks: int | None = None) -> list[tuple]:
        """Every task (or just ``only``, stopping after ``chunks`` chunks) stages its rows; the commit list."""
        out = []
        for p, t in parts.items():
            if only is not None and p != only:
                continue
            reply = None
            for k, b in enumerate(t.to_batches(max_chunksize=self.chunk)[:chunks]):
                reply = self.c.stage(STREAM, W, batch, p, f"{attempt}{p}", k, [b])
            out.append((p, f"{attempt}{p}", t.num_rows, reply["engine"]))
        return out

    def commit(self, batch: int, staged: list[tuple]) -> dict:
        return self.c.commit_stage(STREAM, W, batch, staged)


def _write(sink: SparkSink, batch: int, parts: dict[int, pa.Table], failure: str, victim: int) -> None:
    """Micro-batch ``batch`` written through ``failure``; it ends taken exactly once."""
    victim = sorted(parts)[victim % len(parts)]
    if failure == "task_killed":  # the victim's first attempt dies after its first chunk, with other rows
        sink.stage(batch, {victim: _partition(batch + 100, 1, 7)}, "dead", chunks=1)
    elif failure == "bad_partition":
        bad = {**parts, victim: _with_null_time(parts[victim], parts[victim].num_rows - 1)}
        with pytest.raises(InputError) as err:
            sink.commit(batch, sink.stage(batch, bad, "a"))
        assert err.value.code == "NULL_TIME"
        sink.c.abort_stage(W, batch)
    elif failure == "driver_restarted":  # the old driver's tasks staged, it never committed
        sink.stage(batch, parts, "old")
    elif failure == "aborted":
        sink.stage(batch, parts, "a")
        sink.c.abort_stage(W, batch)
    reply = sink.commit(batch, sink.stage(batch, parts, "b"))
    assert reply == {"rows": sum(t.num_rows for t in parts.values()), "duplicate": False}
    if failure == "commit_replayed":  # Spark did not record the commit: it replays the batch
        assert sink.commit(batch, sink.stage(batch, parts, "r")) == {"rows": 0, "duplicate": True}


@given(st.lists(micro_batch, min_size=1, max_size=5))
def test_each_micro_batch_is_taken_once_whatever_fails(batches):
    data = [{p: _partition(k, b["seed"] + p, n) for p, n in enumerate(b["sizes"])} for k, b in enumerate(batches)]
    with cep.Engine.local() as e:
        e.deploy(_query())
        with EngineClient(e.endpoint.address) as c:
            for k, (b, parts) in enumerate(zip(batches, data)):
                _write(SparkSink(c, b["chunk"]), k, parts, b["failure"], b["victim"])
        assert e.endpoint.staging.rows == 0
        assert e.metrics()["sequence"] == sum(t.num_rows for parts in data for t in parts.values())
        e.end(STREAM)
        got = {o: e.collect(o) for o in ("per_ip", "all")}
    with cep.Engine.local() as ref:
        ref.deploy(_query())
        for parts in data:
            ref.send(STREAM, pa.concat_tables([parts[p] for p in sorted(parts)]))
        ref.end(STREAM)
        _same(got, {o: ref.collect(o) for o in ("per_ip", "all")})
