"""Data, queries and waits shared by the Spark tests.

A module of its own name (not conftest): several test folders have a
conftest, and a plain ``from conftest import`` may find another folder's.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import sparkcep as cep

T0 = 1_704_067_200_000_000  # 2024-01-01 00:00:00 UTC, microseconds
SCHEMA_DDL = "ip string, ts timestamp, bytes int64"
SPARK_DDL = "ip STRING, ts TIMESTAMP, bytes BIGINT"


def connections(n: int, start: int = 0, seed: int = 0, ips: int = 7) -> pa.Table:
    """Rows ``start .. start+n-1`` of a deterministic connection log, event time 0.1 s apart."""
    i = np.arange(start, start + n, dtype=np.int64)
    rng = np.random.default_rng([seed, start])
    return pa.table({
        "ip": pa.array([f"10.0.0.{k}" for k in (i * 7919 + seed) % ips]),
        "ts": pa.array(T0 + i * 100_000, pa.timestamp("us", tz="UTC")),
        "bytes": pa.array(rng.integers(0, 1000, n), pa.int64()),
    })


def demo_query(name: str = "demo") -> cep.Query:
    """connections -> per_ip (10 s windows per IP), big (bytes > 900), all (every row)."""
    q = cep.Query(name)
    s = q.stream("connections", SCHEMA_DDL)
    q.output("per_ip", s.aggregate(cep.TimeWindow("10s", lateness="5s"), by=["ip"], name="window",
                                   n=cep.count(), total=cep.sum("bytes"), first=cep.min("ts")))
    q.output("big", s.filter(cep.col("bytes") > 900, name="big_filter"))
    q.output("all", s.map(ip="ip", ts="ts", bytes="bytes", name="copy"))
    return q


def big_per_ip_query(name: str) -> cep.Query:
    """Built-in operators only (nothing of a test must be importable on an executor):
    connections -> bytes > 100 -> per_ip (10 s windows per IP: n, total)."""
    q = cep.Query(name)
    s = q.stream("connections", SCHEMA_DDL)
    q.output("per_ip", s.filter(cep.col("bytes") > 100, name="big")
             .aggregate(cep.TimeWindow("10s"), by=["ip"], name="window", n=cep.count(), total=cep.sum("bytes")))
    return q


def reference(chunks: list[pa.Table], query=demo_query, parallelism=1) -> dict[str, pa.Table]:
    """Every output of ``query`` after sending ``chunks`` in order and ending input, in-process, no Spark."""
    with cep.Engine.local() as e:
        q = query()
        e.deploy(q, parallelism=parallelism)
        for c in chunks:
            e.send("connections", c)
        e.end("connections")
        return {out: e.collect(out) for out in q.outputs}


def write_files(directory, chunks: list[pa.Table]) -> None:
    """One Parquet file per chunk, named so that they sort in chunk order."""
    directory.mkdir(parents=True, exist_ok=True)
    for k, c in enumerate(chunks):
        pq.write_table(c, directory / f"part-{k:04d}.parquet")


def spark_df(spark, table: pa.Table, columns: list[str] | None = None):
    """A Spark DataFrame of an engine result (timestamps as UTC)."""
    t = table.select(columns) if columns else table
    pdf = t.to_pandas()
    from sparkcep.spark.types import spark_schema
    from sparkcep.schema import Schema

    return spark.createDataFrame(pdf, schema=spark_schema(Schema(t.schema).fields, metadata=False))


def wait_for(predicate, timeout: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def live_instance_managers(engine, n: int) -> list[dict]:
    """The engine's live instance managers, sorted by name, if there are at least ``n`` (else [])."""
    ims = sorted((i for i in engine.instance_managers() if i["alive"]), key=lambda i: i["name"])
    return ims if len(ims) >= n else []
