"""Spark executors run a cluster's queries (acceptance 4): a real multi-process Spark, ``local-cluster[2,1,1024]``.

Two executor JVMs, each with its plugin, its launcher and one instance
manager (one core each). The session is configured with ``spark.sparkcep.zk``:
the instance managers join the cluster's registry (a root of the run's
ZooKeeper server) as members, and the cluster's engine host -- started by
the orchestrator, a process of its own -- adopts them. A query deployed
through the orchestrator (``Engine.connect("zk://...")``) spans both
executors' instance managers, Spark feeds it through
``writeStream.format("upmcep").option("engine", "zk://...")`` and reads its
output back (batch and streaming, ``engine=zk://...`` too), and the rows
equal those of the same query on the same data with ``workers=0`` and those
of pandas. One such session for the whole run (about a minute to start on 2
cores), in a child driver process (see :mod:`driver_process`), stopped by the
module's fixture: the members leave, and no process is left behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import NamedTuple

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from driver_process import DriverProcess, alive, cmdline, parent
from spark_harness import SPARK_DDL, big_per_ip_query, connections, live_instance_managers, wait_for, write_files

import sparkcep as cep
from sparkcep import auth
from sparkcep.control import tree
from sparkcep.control.registry import Registry, open_registry

pytestmark = pytest.mark.slow

EXECUTORS = 2
PER_IP = ["window_start", "window_end", "ip", "n", "total"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _sorted(t: pa.Table) -> pa.Table:
    return t.select(PER_IP).sort_by([("window_start", "ascending"), ("ip", "ascending")])


def pandas_per_ip(chunks: list[pa.Table]) -> pd.DataFrame:
    """``big_per_ip_query`` in pandas: bytes > 100, 10 s windows from the epoch per IP, n and total."""
    df = pa.concat_tables(chunks).to_pandas()
    df = df[df["bytes"] > 100].assign(window_start=lambda d: d["ts"].dt.floor("10s"))
    out = df.groupby(["window_start", "ip"], as_index=False).agg(n=("bytes", "size"), total=("bytes", "sum"))
    out["window_end"] = out["window_start"] + pd.Timedelta("10s")
    return _frame(out)


def _frame(rows) -> pd.DataFrame:
    """Rows (a pandas frame or an Arrow table) in one form to compare: UTC timestamps, int64 counts, sorted."""
    df = rows.to_pandas() if isinstance(rows, pa.Table) else rows
    df = df[PER_IP].copy()
    for c in ("window_start", "window_end"):
        df[c] = pd.to_datetime(df[c], utc=True).dt.as_unit("us")
    return df.astype({"n": "int64", "total": "int64"}).sort_values(["window_start", "ip"]).reset_index(drop=True)


class Cluster(NamedTuple):
    engine: object  # the cluster's engine: sparkcep.control.connect.ConnectedEngine
    registry: Registry  # a session on the cluster's root
    zk: str  # zk://HOST:PORT/PATH
    token_file: str
    driver: DriverProcess
    work: Path


def start(*argv, log: Path) -> subprocess.Popen:
    """``sparkcep ARGV...`` in a process of its own, its output (and its children's) in ``log``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, *sys.path]))
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "sparkcep", *argv], env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def cluster(sparkcep_home, zookeeper, tmp_path_factory):
    """A cluster on the run's ZooKeeper (an orchestrator, its engine host) and a local-cluster session whose
    executors' instance managers joined it and were adopted by its engine host."""
    from sparkcep.spark.plugin import shim_jar

    shim_jar()
    work = tmp_path_factory.mktemp("local-cluster")
    token_file = str(auth.write(work / "keys" / "token", auth.generate()))
    zk = f"zk://{zookeeper}/local-cluster-{uuid.uuid4().hex[:8]}"
    registry = open_registry(zk, session_timeout=2.0)
    t = time.monotonic()
    orchestrator = start("orchestrator", "--zk", zk, "--name", "o1", "--token-file", token_file,
                         log=work / "orchestrator.log")  # it starts the engine host, which logs there too
    driver = engine = None
    try:
        driver = DriverProcess(f"local-cluster[{EXECUTORS},1,1024]", {"zk": zk, "token_file": token_file},
                               {"spark.sql.shuffle.partitions": "2",
                                "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"},
                               EXECUTORS, work, timeout=300)
        engine = cep.Engine.connect(zk, token_file=token_file)
        members = wait_for(lambda: len(m := registry.children(tree.MEMBERS)) >= EXECUTORS and m, 120,
                           "the executors' instance managers to join the registry")
        ims = wait_for(lambda: live_instance_managers(engine, len(members)), 60,
                       "the engine host to adopt the members")
        engine_host = registry.get(tree.ENGINE)["pid"]
        launchers = [parent(im["pid"]) for im in ims]
        processes = [im["pid"] for im in ims] + launchers + [parent(p) for p in launchers]
        print(f"\nlocal-cluster session, orchestrator, engine host and {len(ims)} member instance managers up in "
              f"{time.monotonic() - t:.1f} s")
        yield Cluster(engine, registry, zk, token_file, driver, work)
        t = time.monotonic()
        driver.stop(120)
        # gone with their executors: they leave the registry, the engine host sees it, no process is left behind
        wait_for(lambda: not registry.children(tree.MEMBERS), 30, "the members to leave the registry")
        wait_for(lambda: not live_instance_managers(engine, 1), 30,
                 "the engine host to see the executors' instance managers gone")
        wait_for(lambda: not any(alive(p) for p in processes), 60,
                 "the executor JVMs, launchers and instance managers to exit")
        engine.close()
        orchestrator.send_signal(signal.SIGTERM)  # the last orchestrator leaving stops the engine host
        assert orchestrator.wait(60) == 0
        wait_for(lambda: not alive(engine_host), 60, "the engine host to stop")
        print(f"\nlocal-cluster session and cluster stopped in {time.monotonic() - t:.1f} s")
    finally:
        host = (registry.get(tree.ENGINE) or {}).get("pid")
        if driver is not None:
            driver.kill()
            shutil.rmtree(driver.info["work"], ignore_errors=True)  # the executors' logs, under pyspark's install
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(driver.info["work"]))  # Spark's work/, unless another session uses it
        if engine is not None:
            engine.close()
        if orchestrator.poll() is None:
            orchestrator.kill()
            orchestrator.wait(30)
        if host and alive(host):  # detached from the orchestrator: it outlives a killed one
            os.kill(host, signal.SIGKILL)
        registry.close()


def test_a_cluster_query_spans_the_executors_and_spark_writes_and_reads_it_through_zk(cluster):
    engine, registry, zk, token_file, driver, work = cluster
    ims = live_instance_managers(engine, EXECUTORS)
    members = sorted(registry.children(tree.MEMBERS))
    assert [im["name"] for im in ims] == members  # the engine host adopted every member, and only them
    # one instance manager per executor (one core each), started by the plugin in that executor's JVM
    by_executor = {}
    for im in ims:
        launcher = parent(im["pid"])
        jvm = cmdline(parent(launcher))
        assert "org.apache.spark.executor.CoarseGrainedExecutorBackend" in jvm, jvm[:3]
        executor = jvm[jvm.index("--executor-id") + 1]
        assert im["name"] == f"exec{executor}-0.{launcher}"
        assert registry.get(tree.member(im["name"]))["address"] == im["address"]
        assert im["host"] == "127.0.0.1"
        assert os.sched_getaffinity(im["pid"]) == {im["cpu"]}
        log = (Path(driver.info["work"]) / executor / "stderr").read_text()  # where a Spark user looks
        assert f"sparkcep executor {executor} launcher (pid {launcher}): serving the cluster at {zk} with 1 " \
               f"instance manager(s) (members of its registry): {im['name']} at {im['address']}" in log
        by_executor[executor] = im
    assert sorted(by_executor) == [str(k) for k in range(EXECUTORS)]
    assert len({im["cpu"] for im in ims}) == min(EXECUTORS, len(os.sched_getaffinity(0)))  # spread over the cores

    chunks = [connections(2000, start=k * 2000) for k in range(5)]  # 1000 s of events, in order
    write_files(work / "in", chunks)
    deployed = engine.deploy(big_per_ip_query("cluster_q"), parallelism=2)  # through the leading orchestrator
    hosted = {im["name"]: im["instances"] for im in engine.instance_managers()}
    assert sorted(hosted) == members and all(hosted.values()), hosted  # every executor hosts instances of it
    assert all(m in deployed.explain() for m in members), deployed.explain()
    assert registry.get(f"{tree.STREAMS}/connections")["query"] == "cluster_q"

    wrote = driver.run("write", 300, source=str(work / "in"), schema=SPARK_DDL, engine=zk, token_file=token_file,
                       stream="connections", checkpoint=str(work / "ck-in"))
    assert wrote["batches"] >= len(chunks)
    engine.end("connections")
    got = _sorted(engine.collect("per_ip"))

    with cep.Engine() as alone:  # workers=0
        alone.deploy(big_per_ip_query("cluster_q"), parallelism=2)
        for c in chunks:
            alone.send("connections", c)
        alone.end("connections")
        want = _sorted(alone.collect("per_ip"))
    assert want.num_rows > 0
    assert got.equals(want)
    pd.testing.assert_frame_equal(_frame(got), pandas_per_ip(chunks))
    print(f"\n{want.num_rows} rows of per_ip from {sum(c.num_rows for c in chunks)} events: the same as workers=0 "
          "and pandas")

    read = driver.run("read", 300, engine=zk, token_file=token_file, stream="per_ip", columns=PER_IP,
                      path=str(work / "out"))
    assert read["rows"] == want.num_rows
    assert _sorted(pq.read_table(work / "out").cast(want.schema)).equals(want)
    streamed = driver.run("read_stream", 300, engine=zk, token_file=token_file, stream="per_ip", columns=PER_IP,
                          path=str(work / "out-stream"), checkpoint=str(work / "ck-out"))
    assert streamed["rows"] == want.num_rows and streamed["batches"] >= 1
    pd.testing.assert_frame_equal(_frame(pq.read_table(work / "out-stream")), pandas_per_ip(chunks))
