"""The cluster survives any one failure: 20+ faults at seeded random moments while data flows.

A real cluster (:mod:`chaos_harness`: ZooKeeper, 2 orchestrators, 3
workers, the engine hosts the leader starts) runs two replicated queries:
``client_q`` fed through ``Engine.connect`` by a client that keeps sending,
and ``spark_q`` fed by a Spark streaming query writing on ``zk://`` from
Parquet files that keep arriving; a second Spark query reads ``client_q``'s
output on ``zk://``. Meanwhile, one at a time, at seeded random moments
(sends outstanding at each): SIGKILL of the data path's primary, of its
standby, of the leading orchestrator, of a worker of the replicated
queries (a new one joins, as a supervisor would start it); ZooKeeper
paused for 10 s (SIGSTOP) and restarted empty.

Asserted: no client call raised; both outputs equal a run without
failures (one process, the same input), per window and key: ``spark_q``'s
as the client collects it, ``client_q``'s as Spark read it — every row
once (no (partition, offset) twice), both Spark queries having been
stopped and restarted from their checkpoints after a fail-over midway;
after the stop, no process and no shared memory of the cluster is left. Printed: the time from each fault until sends were taken
again, the longest gap between sends, and between outputs.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import threading
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "control"))

import sparkcep as cep  # noqa: E402
from chaos_harness import Cluster  # noqa: E402

SEED = int(os.environ.get("SPARKCEP_CHAOS_SEED", "7"))
FAULTS = ["primary"] * 7 + ["standby"] * 3 + ["leader"] * 3 + ["worker"] * 7 + ["pause", "restart"]  # 20 kills
T0 = 1_700_000_000_000_000  # us
SCHEMA = "ip string, ts timestamp, bytes int64"


def events(i: int, n: int = 400) -> pd.DataFrame:
    """Send ``i`` of the client: 100 ms of event time, ``n`` rows over 40 IPs."""
    r = np.random.default_rng(i)
    return pd.DataFrame({"ip": [f"10.0.0.{k}" for k in r.integers(0, 40, n)],
                         "ts": pd.to_datetime(T0 + i * 100_000 + np.sort(r.integers(0, 100_000, n)), unit="us"),
                         "bytes": r.integers(1, 1000, n)})


def query(name: str, stream: str) -> cep.Query:
    q = cep.Query(name)
    s = q.stream(stream, SCHEMA)
    q.output(f"{name}_out", s.aggregate(cep.TimeWindow("1s"), by="ip", name="agg", n=cep.count(),
                                        total=cep.sum("bytes")))
    return q


def reference(q: cep.Query, stream: str, frames: list[pd.DataFrame]) -> pd.DataFrame:
    with cep.Engine.local(workers=0) as e:
        e.deploy(q)
        for f in frames:
            e.send(stream, f)
        e.end(stream)
        return canonical(e.collect(next(iter(q.outputs))).to_pandas())


def canonical(df: pd.DataFrame) -> pd.DataFrame:
    """The rows by window and key, in the engine's types (Spark's pandas times are in ns)."""
    out = df[["window_start", "window_end", "ip", "n", "total"]].astype(
        {"window_start": "datetime64[us]", "window_end": "datetime64[us]", "n": "int64", "total": "int64"})
    return out.sort_values(["window_start", "ip"]).reset_index(drop=True)


def output_gap(arrivals: list[float], start: float, end: float) -> float:
    """The longest time without an output batch across the fault that began at ``start`` and ended at ``end``."""
    times = np.asarray(arrivals)
    before, after = times[times <= start], times[times >= end]
    inside = times[(times > start) & (times < end)]
    edges = np.concatenate([before[-1:], inside, after[:1]])
    return float(np.diff(edges).max()) if len(edges) > 1 else float("nan")


class Feed:
    """The client: sends ``events(i)`` every ``every`` s through ``engine`` until stopped, recording what
    happened."""

    def __init__(self, engine, stream: str, every: float = 0.05):
        self.engine, self.stream, self.every = engine, stream, every
        self.taken: list[float] = []  # when each send returned
        self.started: list[float] = []  # when each of them began
        self.errors: list[BaseException] = []
        self.outstanding = threading.Event()  # set while a send is under way
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        i = 0
        while not self.stop.is_set():
            self.outstanding.set()
            began = time.monotonic()
            try:
                self.engine.send(self.stream, events(i).iloc[::-1])  # a pandas slice, index not 0..n-1
                self.taken.append(time.monotonic())
                self.started.append(began)
            except BaseException as e:  # noqa: BLE001 - asserted: no call may raise
                self.errors.append(e)
            i += 1
            self.outstanding.clear()
            time.sleep(self.every)


def test_the_cluster_survives_20_faults_with_no_row_lost_or_doubled(spark, tmp_path):
    rng = random.Random(SEED)
    faults = FAULTS[:]
    rng.shuffle(faults)
    cluster = Cluster(tmp_path / "cluster")
    left = None
    try:
        engine = cep.Engine.connect(cluster.zk, token_file=str(cluster.token_file), retry_s=60)
        deadline = time.monotonic() + 120
        while len(cluster.members()) < 3 or len(engine.instance_managers()) < 3:
            assert time.monotonic() < deadline, "the workers did not join"
            time.sleep(0.2)
        client_q, spark_q = query("client_q", "client_in"), query("spark_q", "spark_in")
        engine.deploy(client_q, replicas=2)
        engine.deploy(spark_q, replicas=2)
        arrivals: list[float] = []
        engine.subscribe("client_q_out", lambda b: arrivals.append(time.monotonic()))

        # Spark: Parquet files arriving -> zk:// (spark_in); zk:// (client_q_out) -> rows kept here
        files = tmp_path / "files"
        files.mkdir()
        spark_frames = []
        opts = {"engine": cluster.zk, "tokenFile": str(cluster.token_file)}
        read_rows: dict[int, pd.DataFrame] = {}  # by batch id: a batch Spark replays replaces itself

        def start_writer():
            return (spark.readStream.schema("ip STRING, ts TIMESTAMP, bytes BIGINT").option("maxFilesPerTrigger", 1)
                    .parquet(str(files)).writeStream.format("upmcep").options(**opts).option("stream", "spark_in")
                    .option("checkpointLocation", str(tmp_path / "ck-w")).start())

        def start_reader():
            return (spark.readStream.format("upmcep").options(**opts).option("stream", "client_q_out")
                    .option("includeMetadata", "true").load().writeStream
                    .foreachBatch(lambda df, batch: read_rows.__setitem__(batch, df.toPandas()))
                    .option("checkpointLocation", str(tmp_path / "ck-r")).start())
        writer, reader = start_writer(), start_reader()
        restarted = False

        def drop_files():  # file k holds the event times of its own 100 ms
            while not feed.stop.is_set():
                k = len(spark_frames)
                f = events(10_000 + k)
                f["ts"] = pd.to_datetime(T0 + k * 100_000 + (f["ts"].astype("int64") // 1000) % 100_000, unit="us")
                table = pa.Table.from_pandas(f.sort_values("ts"), preserve_index=False)
                pq.write_table(table.set_column(1, "ts", table.column("ts").cast(pa.timestamp("us", "UTC"))),
                               files / f"part-{k:04d}.parquet")
                spark_frames.append(f)
                time.sleep(1.0)
        feed = Feed(engine, "client_in")
        dropper = threading.Thread(target=drop_files, daemon=True)
        dropper.start()
        feed.thread.start()

        recovery, report = [], []
        for kind in faults:
            time.sleep(rng.uniform(0.5, 2.0))
            while not feed.outstanding.is_set():
                time.sleep(0.001)  # the fault lands while a send is under way
            started = time.monotonic()
            what = cluster.fault(kind, pick=lambda names: rng.choice(sorted(names)))
            ended = time.monotonic()  # a pause lasts: sends are taken again after its end
            while not (after := [t for s, t in zip(feed.started, feed.taken) if s > ended]):
                assert feed.thread.is_alive() and time.monotonic() - started < 60, f"no send after {what}"
                time.sleep(0.01)
            took = after[0] - ended
            recovery.append((kind, took, started, ended))
            report.append(f"{what}: a send begun after it was taken {took:.2f} s later")
            print(report[-1], flush=True)
            waited = time.monotonic()  # one failure at a time: the next once the cluster is whole again
            while not (cluster.settled() and all(r["state"] == "running" for q in ("client_q", "spark_q")
                                                 for r in engine.deployment(q).replicas())):
                assert time.monotonic() - waited < 90, f"the cluster is not whole again 90 s after {what}"
                time.sleep(0.2)
            if kind == "primary" and len(recovery) > len(faults) // 3 and not restarted:
                writer.stop()  # both Spark queries restarted from their checkpoints after a fail-over
                reader.stop()
                writer, reader, restarted = start_writer(), start_reader(), True
                print("the Spark queries restarted from their checkpoints", flush=True)

        feed.stop.set()
        feed.thread.join(120)
        dropper.join(120)
        writer.processAllAvailable()
        engine.end("client_in")
        engine.end("spark_in")
        got_client = canonical(engine.collect("client_q_out").to_pandas())
        got_spark = canonical(engine.collect("spark_q_out").to_pandas())
        reader.processAllAvailable()
        writer.stop()
        reader.stop()
        engine.close()

        kills = [r for r in recovery if r[0] in ("primary", "standby", "leader", "worker")]
        for kind in ("primary", "standby", "leader", "worker", "pause", "restart"):
            times = [r[1] for r in recovery if r[0] == kind]
            gaps = [output_gap(arrivals, r[2], r[3]) for r in recovery if r[0] == kind]
            print(f"{kind:>8} x{len(times)}: a send begun after it was taken {statistics.median(times):.2f} s later "
                  f"(median; max {max(times):.2f} s), longest output gap {max(gaps):.2f} s")
        took = [r[1] for r in kills]
        print(f"{len(recovery)} faults, {len(kills)} kills: sends taken again after median {statistics.median(took):.2f} "
              f"s, max {max(took):.2f} s; longest output gap at a kill {max(output_gap(arrivals, r[2], r[3]) for r in kills):.2f}"
              f" s; longest gap between sends {max(np.diff(feed.taken)):.2f} s (the ZooKeeper pause)")
        assert not feed.errors, feed.errors[:3]
        assert len(kills) >= 20
        sent = len(feed.taken) + len(feed.errors)
        assert restarted
        read = pd.concat(read_rows.values(), ignore_index=True)  # Spark committed them: the engine released them
        assert not read.duplicated(["_partition", "_offset"]).any(), "Spark read a row twice"
        pd.testing.assert_frame_equal(canonical(read), reference(client_q, "client_in",
                                                                 [events(i) for i in range(sent)]))
        assert len(got_client) < len(read)
        pd.testing.assert_frame_equal(got_spark, reference(spark_q, "spark_in", spark_frames))
    except BaseException:
        print(f"\nwhat the cluster said last:\n{cluster.story()}")
        raise
    finally:
        left = cluster.stop()
    assert left == {"processes": [], "shm": []}, left


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-s"]))
