"""The JVM plugin starts the executor's instance managers with it and stops them with it (acceptance 4).

Spark plugins are fixed when a SparkContext starts, so this test runs a
second, short-lived local session in a child process (local mode: the driver
hosts the executor, executor id "driver"); the engine is in this process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from spark_harness import wait_for

CHILD = r"""
import sys
from pyspark.sql import SparkSession
import sparkcep.spark
builder = (SparkSession.builder.master("local[1]").appName("sparkcep-plugin-test")
           .config("spark.ui.enabled", "false"))
spark = sparkcep.spark.configure(builder, instance_managers=2, engine=sys.argv[1]).getOrCreate()
assert spark.range(10).count() == 10
print("UP", flush=True)
sys.stdin.readline()
spark.stop()
print("DOWN", flush=True)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_plugin_starts_and_stops_instance_managers_with_the_executor(engine, tmp_path):
    from sparkcep.spark.plugin import shim_jar

    shim_jar()  # build (or find) the jar first, so its time is not taken from the session start
    child = subprocess.Popen([sys.executable, "-c", CHILD, engine.endpoint.address], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        assert child.stdout.readline().strip() == "UP"
        ims = wait_for(lambda: len(engine.endpoint.instance_managers) == 2 and engine.endpoint.instance_managers,
                       60, "two registered instance managers")
        infos = sorted(ims.values(), key=lambda i: i["id"])
        assert [i["id"] for i in infos] == ["driver-0", "driver-1"]
        assert all(i["executor"] == "driver" for i in infos)
        cpus = sorted(os.sched_getaffinity(0))
        for k, info in enumerate(infos):
            assert _alive(info["pid"])
            assert os.sched_getaffinity(info["pid"]) == {cpus[k % len(cpus)]}  # pinned, one CPU each
            assert info["kind"] in ("instance_manager", "standby")
        child.stdin.write("stop\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "DOWN"
        # stopped with the executor: processes gone, deregistered from the engine
        assert engine.endpoint.instance_managers == {}
        deadline = time.monotonic() + 10
        while any(_alive(i["pid"]) for i in infos) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(i["pid"]) for i in infos)
        assert not _alive(infos[0]["launcher_pid"])
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(30)
