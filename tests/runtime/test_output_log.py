"""The output log's positions, reads and retention (what the Spark source builds on)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from sparkcep.errors import EngineError
from sparkcep.runtime.output_log import OutputLog

SCHEMA = pa.schema([("v", pa.int64())])


def _batch(lo: int, hi: int) -> pa.RecordBatch:
    v = np.arange(lo, hi, dtype=np.int64)
    return pa.RecordBatch.from_arrays([pa.array(v), pa.array(v + 1000)], names=["v", "__seq"])


def _values(batches) -> list[int]:
    return [x for b in batches for x in b.column(0).to_pylist()]


@pytest.fixture
def log() -> OutputLog:
    log = OutputLog(SCHEMA)
    for lo, hi in ((0, 3), (3, 4), (4, 10)):  # partition 0: rows 0..9 in batches of 3, 1, 6
        log.append(0, _batch(lo, hi))
    log.append(1, _batch(100, 105))
    return log


def test_positions_and_reads_across_batch_boundaries(log):
    assert log.earliest() == {0: 0, 1: 0} and log.latest() == {0: 10, 1: 5}
    for start in range(11):
        for end in range(start, 11):
            assert _values(log.read(0, start, end)) == list(range(start, end))
    with_seq = log.read(1, 1, 3, seq=True)
    assert with_seq[0].schema.names == ["v", "__seq"] and with_seq[0].column(1).to_pylist() == [1101, 1102]
    assert log.read(0, 2, 5)[0].schema == SCHEMA


def test_release_keeps_positions_and_collect_means_retained(log):
    log.release(0, 5)
    assert log.earliest()[0] == 5 and log.latest()[0] == 10
    assert _values(log.read(0, 5, 10)) == [5, 6, 7, 8, 9]
    assert log.table().column("v").to_pylist() == [5, 6, 7, 8, 9, 100, 101, 102, 103, 104]
    assert log.retained == 10 and log.rows == 15
    with pytest.raises(EngineError) as e:
        log.read(0, 4, 6)
    assert e.value.code == "OFFSET_RELEASED"
    with pytest.raises(EngineError) as e:
        log.read(0, 8, 11)
    assert e.value.code == "OFFSET_RANGE"
    log.append(0, _batch(10, 12))  # positions continue after a release
    assert _values(log.read(0, 9, 12)) == [9, 10, 11]
    log.release(0, 12)
    assert log.read(0, 12, 12) == [] and log.table().num_rows == 5


def test_commit_releases_what_every_consumer_passed(log):
    log.commit({0: 6}, consumer="a")
    assert log.earliest()[0] == 6
    log.commit({0: 8}, consumer="b")  # b is new: releases nothing below a's position
    assert log.earliest()[0] == 6
    log.commit({0: 9, 1: 2}, consumer="a")
    assert log.earliest() == {0: 8, 1: 0}  # b has not committed partition 1
    log.commit({0: 3}, consumer="a")  # positions never move back
    assert log.earliest()[0] == 8


def test_reads_with_output_ids_and_seq_only_as_before():
    log = OutputLog(SCHEMA)
    v = np.arange(3, dtype=np.int64)
    log.append(0, pa.RecordBatch.from_arrays([pa.array(v), pa.array(v + 10), pa.array(-v), pa.array(v)],
                                             names=["v", "__seq", "__id", "__ts"]))
    log.append(0, pa.RecordBatch.from_arrays([pa.array(v)], names=["v"]))  # no hidden columns (metrics)
    (a, b) = log.read(0, 1, 5, ids=True)
    assert a.schema.names == ["v", "__seq", "__id"] and a.to_pydict() == {"v": [1, 2], "__seq": [11, 12],
                                                                            "__id": [-1, -2]}
    assert b.to_pydict() == {"v": [0, 1], "__seq": [-1, -1], "__id": [-1, -1]}
    assert [x.schema.names for x in log.read(0, 1, 5, seq=True)] == [["v", "__seq"]] * 2
    assert log.table().schema == SCHEMA


@pytest.mark.parametrize("workers", [0, 2])
def test_a_reader_sees_a_send_s_rows_all_at_once(workers):
    """One send whose rows leave in several batches: whenever a subscriber gets one of them, a reader
    of the log (the Spark source asking for the latest positions) already sees every row of the send."""
    import sparkcep as cep

    q = cep.Query("wide")
    s = q.stream("s", "k int64, pad string")
    q.output("o", s.map(k="k", pad="pad"))
    seen = []
    with cep.Engine.local(workers=workers) as e:
        e.deploy(q, parallelism=max(workers, 1))
        log = e.outputs["o"]
        e.subscribe("o", lambda batch: seen.append((batch.num_rows, sum(log.latest().values()))))
        pieces = [pa.record_batch({"k": pa.array(np.arange(k, k + 20_000)), "pad": ["x" * 64] * 20_000})
                  for k in range(0, 60_000, 20_000)]
        e.send("s", pa.Table.from_batches(pieces))
        e.end("s")
    assert len(seen) > 1 and sum(n for n, _ in seen) == 60_000
    assert {total for _, total in seen} == {60_000}


def test_an_output_nobody_reads_stays_within_its_retention():
    """Ten times the default retention through an output nobody reads: memory stays bounded, the oldest
    rows go, and a reader asking for them is told how many it missed."""
    import psutil

    import sparkcep as cep
    from sparkcep.runtime.output_log import DEFAULT_RETENTION

    q = cep.Query("big")
    q.output("kept", q.stream("big_in", "k string, v int64").filter(cep.col("v") >= 0))
    value = "x" * 2000
    rows = 50_000
    me = psutil.Process()
    with cep.Engine.local() as engine:
        engine.deploy(q)
        log = engine.outputs["kept"]
        batch = pa.table({"k": pa.array([value] * rows), "v": pa.array(range(rows), pa.int64())})
        engine.send("big_in", batch)
        per_send = log.held_bytes
        before = me.memory_info().rss
        sends = 10 * DEFAULT_RETENTION.bytes // per_send + 1
        for _ in range(sends):
            engine.send("big_in", batch)
        grew = me.memory_info().rss - before
        assert sends * per_send > 10 * DEFAULT_RETENTION.bytes
        assert log.held_bytes <= DEFAULT_RETENTION.bytes
        assert grew < DEFAULT_RETENTION.bytes + (256 << 20), f"RSS grew {grew >> 20} MiB"
        assert log.rows == (sends + 1) * rows and log.dropped > 9 * log.held_rows
        first = log.earliest()[0]
        with pytest.raises(cep.EngineError) as e:
            log.read(0, 10, 20)
        assert e.value.code == "OFFSET_RELEASED" and f"{first - 10} rows missed" in str(e.value)
        with pytest.raises(cep.EngineError) as e:
            engine.collect("kept")
        assert e.value.code == "OUTPUT_TRUNCATED" and str(log.dropped) in str(e.value)
        assert sum(b.num_rows for b in log.read(0, first, log.latest()[0])) == log.latest()[0] - first
