"""A Spark query reading a replicated query's output through ``format("upmcep")`` while a replica is killed
sees no gap and no duplicate.

``Engine.local(workers=2, standby=1)``, the demo query deployed with ``replicas=2`` (one instance manager
per replica). Two Spark streaming queries read its outputs ``all`` (every input row) and ``per_ip`` (10 s
windows per IP) into memory sinks while a thread sends chunks at a steady pace; once Spark has read rows
of both, the instance manager of the replica that delivered the most epochs first is SIGKILLed while a
send is under way, with sends left to make; sends go on, the replica is rebuilt on the standby. After
``engine.end``, the rows each Spark query saw equal, as exact multisets, those of the same sends through a
parallelism-1 engine in this process.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter

import pyarrow as pa
from pyspark.sql import functions as F
from sender import Sender
from spark_harness import connections, demo_query, reference, wait_for

import sparkcep as cep

CHUNKS, ROWS = 40, 250  # 10,000 rows, 1,000 s of event time
PACE_S = 0.05  # between sends
LIMIT_S = 240  # the whole test, Spark's micro-batches included
OUTPUTS = ("all", "per_ip")


def _rows(table: pa.Table) -> Counter:
    """A multiset of ``table``'s rows, timestamps as microseconds."""
    cols = [c.cast(pa.int64()) if pa.types.is_timestamp(c.type) else c for c in table.columns]
    return Counter(zip(*(c.to_pylist() for c in cols)))


def _spark_rows(spark, name: str, columns: list[str], times: set[str]) -> Counter:
    df = spark.table(name).select(*[F.unix_micros(c).alias(c) if c in times else F.col(c) for c in columns])
    return Counter(tuple(r) for r in df.collect())


def _seen(q) -> int:
    return sum(p["numInputRows"] for p in q.recentProgress)


def test_a_replica_killed_while_spark_reads_leaves_no_gap_and_no_duplicate(spark, sparkcep_home, tmp_path):
    chunks = [connections(ROWS, start=k * ROWS) for k in range(CHUNKS)]
    want = reference(chunks)  # the same sends, parallelism 1, in this process
    deadline = time.monotonic() + LIMIT_S
    with cep.Engine.local(workers=2, standby=1) as engine:
        dep = engine.deploy(demo_query(), parallelism=2, replicas=2)
        queries = {}
        for out in OUTPUTS:
            df = spark.readStream.format("upmcep").option("engine", engine.endpoint.address).option("stream", out)
            queries[out] = (df.load().writeStream.format("memory").queryName(f"replica_read_{out}")
                            .option("checkpointLocation", str(tmp_path / f"ck-{out}"))
                            .trigger(processingTime="0.2 seconds").start())
        try:
            go_on = threading.Event()

            def chunks_to_send():
                for k, chunk in enumerate(chunks):
                    if k == CHUNKS // 3:  # hold on until Spark has read rows of both outputs
                        go_on.wait(deadline - time.monotonic())
                    yield chunk

            sender = Sender(lambda chunk: engine.send("connections", chunk), chunks_to_send(), PACE_S).start()
            wait_for(lambda: all(_seen(q) for q in queries.values()) or sender.errors, 120,
                     "Spark to read both outputs")
            go_on.set()
            wait_for(lambda: sender.done >= CHUNKS // 2 or sender.errors, 60, "half of the sends")
            firsts = engine.metrics()["queries"]["demo"]["replication"]["dedup"]["first_copies"]
            leader = max((0, 1), key=lambda r: firsts.get(r, 0))  # the replica whose epochs Spark was reading
            victim = next(im for im in engine.instance_managers() if im["replica"] == leader and im["instances"])
            under_way = sender.during_send(lambda: os.kill(victim["pid"], signal.SIGKILL))
            sent_at_kill = sender.done
            read_at_kill = {out: _seen(q) for out, q in queries.items()}
            sender.thread.join(max(1.0, deadline - time.monotonic()))
            assert not sender.thread.is_alive() and not sender.errors, sender.errors or "the sends did not finish"
            assert sender.done == CHUNKS
            assert under_way and sent_at_kill < CHUNKS - 1, \
                f"the kill came after {sent_at_kill} of {CHUNKS} sends, a send under way: {under_way}"
            wait_for(lambda: all(r["state"] == "running" for r in dep.replicas()), 60, "the replica rebuilt")
            engine.end("connections")
            for q in queries.values():
                q.processAllAvailable()
                assert q.exception() is None, q.exception()
            rep = engine.metrics()["queries"]["demo"]["replication"]
        finally:
            for q in queries.values():
                q.stop()
    assert time.monotonic() < deadline, f"over {LIMIT_S} s"
    for out in OUTPUTS:
        assert 0 < read_at_kill[out] < want[out].num_rows, (out, read_at_kill[out])  # killed mid-read
        schema = want[out].schema
        times = {f.name for f in schema if pa.types.is_timestamp(f.type)}
        got, expected = _spark_rows(spark, f"replica_read_{out}", schema.names, times), _rows(want[out])
        missing, extra = expected - got, got - expected
        assert (sum(missing.values()), sum(extra.values())) == (0, 0), \
            f"{out}: rows missing, rows extra of {want[out].num_rows} (e.g. {list(missing)[:2]}, {list(extra)[:2]})"
    assert [f["replica"] for f in rep["failovers"]] == [leader] and len(rep["catchups"]) == 1, rep
    assert rep["dedup"]["dropped_rows"] > 0  # both replicas delivered: second copies were dropped
