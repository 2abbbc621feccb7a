"""Spark executors run queries (acceptance 4): a real multi-process Spark, ``local-cluster[2,1,1024]``.

Two executor JVMs, each with its plugin, its launcher and one instance
manager (one core each); the engine is in this process. A query deployed
here spans both executors' instance managers, Spark feeds it through
``writeStream.format("upmcep")`` and reads its output back, and the rows
equal those of the same query on the same data with ``workers=0``. One such
session for the whole run (about a minute to start on 2 cores), in a child
driver process (see :mod:`driver_process`), stopped by the module's fixture.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from driver_process import DriverProcess, alive, cmdline, parent
from spark_harness import SPARK_DDL, big_per_ip_query, connections, live_instance_managers, wait_for, write_files

import sparkcep as cep

pytestmark = pytest.mark.slow

EXECUTORS = 2
PER_IP = ["window_start", "window_end", "ip", "n", "total"]


def _sorted(t: pa.Table) -> pa.Table:
    return t.select(PER_IP).sort_by([("window_start", "ascending"), ("ip", "ascending")])


@pytest.fixture(scope="module")
def cluster(sparkcep_home, tmp_path_factory):
    """An engine here, and a local-cluster session whose executors' instance managers registered with it."""
    from sparkcep.spark.plugin import shim_jar

    shim_jar()
    work = tmp_path_factory.mktemp("local-cluster")
    t = time.monotonic()
    with cep.Engine.local() as engine:
        driver = DriverProcess(f"local-cluster[{EXECUTORS},1,1024]", {"engine": engine.endpoint.address},
                               {"spark.sql.shuffle.partitions": "2",
                                "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"},
                               EXECUTORS, work, timeout=300)
        try:
            ims = wait_for(lambda: live_instance_managers(engine, EXECUTORS), 120, "the executors' instance managers")
            launchers = [parent(im["pid"]) for im in ims]
            processes = [im["pid"] for im in ims] + launchers + [parent(p) for p in launchers]
            print(f"\nlocal-cluster session and {len(ims)} instance managers up in {time.monotonic() - t:.1f} s")
            yield engine, driver, work
            t = time.monotonic()
            driver.stop(120)
            # gone with their executors: the engine sees it, and no process is left behind
            wait_for(lambda: not live_instance_managers(engine, 1), 30,
                     "the engine to see the executors' instance managers gone")
            wait_for(lambda: not any(alive(p) for p in processes), 60,
                     "the executor JVMs, launchers and instance managers to exit")
            print(f"\nlocal-cluster session stopped in {time.monotonic() - t:.1f} s")
        finally:
            driver.kill()
            shutil.rmtree(driver.info["work"], ignore_errors=True)  # the executors' logs, under pyspark's install
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(driver.info["work"]))  # Spark's work/, unless another session uses it


def test_a_query_spans_the_executors_and_gives_the_rows_of_workers_0(cluster):
    engine, driver, work = cluster
    ims = engine.instance_managers()
    # one instance manager per executor (one core each), started by the plugin in that executor's JVM
    by_executor = {}
    for im in ims:
        launcher = parent(im["pid"])
        jvm = cmdline(parent(launcher))
        assert "org.apache.spark.executor.CoarseGrainedExecutorBackend" in jvm, jvm[:3]
        executor = jvm[jvm.index("--executor-id") + 1]
        assert im["name"].startswith(f"exec{executor}-0.")
        assert im["host"] == "127.0.0.1"
        assert os.sched_getaffinity(im["pid"]) == {im["cpu"]}
        log = (Path(driver.info["work"]) / executor / "stderr").read_text()  # where a Spark user looks
        assert f"sparkcep executor {executor} launcher (pid {launcher}): serving the engine at " \
               f"{engine.endpoint.address}" in log
        by_executor[executor] = im
    assert sorted(by_executor) == [str(k) for k in range(EXECUTORS)]
    assert len({im["cpu"] for im in ims}) == min(EXECUTORS, len(os.sched_getaffinity(0)))  # spread over the cores

    chunks = [connections(2000, start=k * 2000) for k in range(5)]  # 1000 s of events, in order
    write_files(work / "in", chunks)
    engine.deploy(big_per_ip_query("cluster_q"), parallelism=2)
    hosted = {im["name"]: im["instances"] for im in engine.instance_managers()}
    assert all(hosted.values()), hosted  # every executor hosts instances of the query

    wrote = driver.run("write", 300, source=str(work / "in"), schema=SPARK_DDL, engine=engine.endpoint.address,
                       stream="connections", checkpoint=str(work / "ck-in"))
    assert wrote["batches"] >= len(chunks)
    engine.end("connections")
    got = engine.collect("per_ip")

    with cep.Engine() as alone:  # workers=0
        alone.deploy(big_per_ip_query("cluster_q"), parallelism=2)
        for c in chunks:
            alone.send("connections", c)
        alone.end("connections")
        want = _sorted(alone.collect("per_ip"))
    assert want.num_rows > 0
    assert _sorted(got).equals(want)
    print(f"\n{want.num_rows} rows of per_ip from {sum(c.num_rows for c in chunks)} events: the same as workers=0")

    read = driver.run("read", 300, engine=engine.endpoint.address, stream="per_ip", columns=PER_IP,
                      path=str(work / "out"))
    assert read["rows"] == want.num_rows
    assert _sorted(pq.read_table(work / "out").cast(want.schema)).equals(want)
