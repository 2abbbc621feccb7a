"""A Spark query reading an output through ``format("upmcep")`` while migrations run sees every row once.

``Engine.local(workers=2)``, the demo query at parallelism 2. Two Spark
streaming queries read its outputs ``per_ip`` (10 s windows per IP: the
migrated aggregate's own output) and ``all`` (every input row) into memory
sinks, with their positions (``includeMetadata``), while a thread sends
chunks at a steady pace and the aggregate is migrated live: bins moved
(fluid, then all at once), rescaled to three instances (a new output
partition), an instance moved to the other instance manager (State
Transfer), rescaled back to two. After ``engine.end``, each Spark query saw
every position of every partition of its output exactly once, and its rows
equal, as exact multisets, those of the same sends through a parallelism-1
engine in this process.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pyarrow as pa
from pyspark.sql import functions as F
from spark_harness import connections, demo_query, reference, wait_for

import sparkcep as cep

ROWS = 200  # per send: 20 s of event time
PACE_S = 0.05  # between sends
LIMIT_S = 240  # the whole test, Spark's micro-batches included
OUTPUTS = ("per_ip", "all")
META = ["_partition", "_offset", "_seq"]


def _rows(table: pa.Table) -> Counter:
    """A multiset of ``table``'s rows, timestamps as microseconds."""
    cols = [c.cast(pa.int64()) if pa.types.is_timestamp(c.type) else c for c in table.columns]
    return Counter(zip(*(c.to_pylist() for c in cols)))


def _seen(q) -> int:
    return sum(p["numInputRows"] for p in q.recentProgress)


def test_spark_reads_every_row_once_while_migrations_run(spark, sparkcep_home, tmp_path):
    deadline = time.monotonic() + LIMIT_S
    with cep.Engine.local(workers=2) as engine:
        dep = engine.deploy(demo_query(), parallelism=2, bins=64)
        a = engine.endpoint.address
        queries = {out: (spark.readStream.format("upmcep").option("engine", a).option("stream", out)
                         .option("includeMetadata", "true").load()
                         .writeStream.format("memory").queryName(f"migration_read_{out}")
                         .option("checkpointLocation", str(tmp_path / f"ck-{out}"))
                         .trigger(processingTime="0.2 seconds").start())
                   for out in OUTPUTS}
        try:
            sent, stop, errors = [0], threading.Event(), []

            def send():
                try:
                    while not stop.is_set():
                        engine.send("connections", connections(ROWS, start=sent[0] * ROWS))
                        sent[0] += 1
                        time.sleep(PACE_S)
                except BaseException as e:  # noqa: BLE001 - reported by the test thread
                    errors.append(e)

            sender = threading.Thread(target=send, name="sender")
            sender.start()
            wait_for(lambda: all(_seen(q) for q in queries.values()) or errors, 120, "Spark to read both outputs")
            owners = dep.bin_owners("window")
            ims = [im["name"] for im in engine.instance_managers()]
            reports = []
            at = [sent[0]]
            reports.append(dep.migrate("window", {b: 1 - o for b, o in enumerate(owners) if b % 2}, "fluid"))
            reports.append(dep.rescale("window", 3, strategy="batched"))
            where = next(im["name"] for im in engine.instance_managers() if "demo.SQ2[0]" in im["instances"])
            reports.append(dep.move("window", 0, next(n for n in ims if n != where)))
            reports.append(dep.migrate("window", {b: (o + 1) % 3 for b, o in enumerate(dep.bin_owners("window"))},
                                       "all-at-once"))
            reports.append(dep.rescale("window", 2, strategy="fluid"))
            at.append(sent[0])
            time.sleep(1.0)  # sends go on after the last one
            stop.set()
            sender.join(60)
            assert not sender.is_alive() and not errors, errors or "the sends did not finish"
            engine.end("connections")
            for q in queries.values():
                q.processAllAvailable()
                assert q.exception() is None, q.exception()
            latest = {out: engine.outputs[out].latest() for out in OUTPUTS}
        finally:
            stop.set()
            for q in queries.values():
                q.stop()
    assert [r["kind"] for r in reports] == ["migrate", "rescale", "move", "migrate", "rescale"]
    assert all(r["bins"] > 0 for r in reports) and dep.parallelism["SQ2"] == 2, reports
    assert at[1] > at[0], "no send while the migrations ran"
    assert set(latest["per_ip"]) >= {0, 1, 2}, latest  # the third instance's rows, read from its own partition
    want = reference([connections(ROWS, start=k * ROWS) for k in range(sent[0])])
    for out in OUTPUTS:
        schema = want[out].schema
        times = [f.name for f in schema if pa.types.is_timestamp(f.type)]
        df = spark.table(f"migration_read_{out}")
        rows = [tuple(r) for r in df.select(*[F.unix_micros(c).alias(c) if c in times else F.col(c)
                                              for c in schema.names + META]).collect()]
        n = len(schema.names)
        # every position of every partition once: no gap, no duplicate
        positions = Counter((r[n], r[n + 1]) for r in rows)
        assert max(positions.values()) == 1, f"{out}: positions read twice: {positions.most_common(3)}"
        assert set(positions) == {(p, i) for p, end in latest[out].items() for i in range(end)}, \
            f"{out}: {sum(latest[out].values()) - len(positions)} position(s) missing"
        # and the rows are those of the same sends at parallelism 1
        got, expected = Counter(r[:n] for r in rows), _rows(want[out])
        missing, extra = expected - got, got - expected
        assert not missing and not extra, (f"{out}: {sum(missing.values())} row(s) missing, {sum(extra.values())} "
                                           f"extra (e.g. {list(missing)[:2]}, {list(extra)[:2]}) of "
                                           f"{want[out].num_rows}")
    assert time.monotonic() < deadline, f"over {LIMIT_S} s"
