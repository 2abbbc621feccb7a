"""The JVM plugin starts instance managers with the executor; they serve whichever local engine runs.

Local mode: the driver hosts the executor (executor id ``driver``), in a
child process (see :mod:`driver_process`); the engines are in this process.
The session starts before any engine, its launcher waits; the first engine
gets the executor's instance managers, deploys on them and closes; the
second engine gets new ones; stopping the session stops them.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow as pa
from driver_process import DriverProcess, alive, parent
from spark_harness import big_per_ip_query, connections, live_instance_managers, wait_for

import sparkcep as cep


def _registered(engine, n: int) -> list[dict]:
    """The engine's instance managers once ``n`` are registered and alive."""
    return wait_for(lambda: live_instance_managers(engine, n), 90, f"{n} registered instance managers")


def _run(engine, data: pa.Table) -> pa.Table:
    engine.send("connections", data)
    engine.end("connections")
    return engine.collect("per_ip").sort_by([("window_start", "ascending"), ("ip", "ascending")])


def test_executor_instance_managers_serve_each_engine_and_stop_with_the_session(tmp_path, monkeypatch, sparkcep_home):
    from sparkcep.spark.plugin import shim_jar

    jar = shim_jar()  # built (or found) before the session, so its time is not the session's
    home = tmp_path / "home"  # this test's engines only: the launcher finds "the local engine" here
    monkeypatch.setenv("SPARKCEP_HOME", str(home))
    monkeypatch.setenv("SPARKCEP_SHIM_JAR", str(jar))
    driver = DriverProcess("local[1]", {"instance_managers": 2}, {}, 0, tmp_path, timeout=120)
    try:
        with cep.Engine.local() as first:  # started after the session: the launcher was waiting for it
            ims = _registered(first, 2)
            assert [i["name"].split(".")[0] for i in ims] == ["driver-0", "driver-1"]
            cpus = sorted(os.sched_getaffinity(0))
            for k, im in enumerate(ims):
                assert im["host"] == "127.0.0.1" and im["address"].startswith("127.0.0.1:")  # loopback by default
                assert os.sched_getaffinity(im["pid"]) == {cpus[k % len(cpus)]} == {im["cpu"]}  # pinned
            launcher = parent(ims[0]["pid"])
            assert parent(ims[1]["pid"]) == launcher
            status = subprocess.run([sys.executable, "-m", "sparkcep", "status", "--engine", first.endpoint.address],
                                    capture_output=True, text=True, timeout=60)
            assert status.returncode == 0, status.stderr
            assert all(im["name"] in status.stdout and im["address"] in status.stdout for im in ims)

            data = connections(2000)
            first.deploy(big_per_ip_query("plugin_q"), parallelism=2)
            hosted = {im["name"]: im["instances"] for im in first.instance_managers()}
            assert all(hosted.values()), hosted  # both instance managers run instances of the query
            got = _run(first, data)
        with cep.Engine() as alone:  # workers=0, and not published: the launcher never sees it
            alone.deploy(big_per_ip_query("plugin_q"), parallelism=2)
            assert got.equals(_run(alone, data))
        wait_for(lambda: not any(alive(im["pid"]) for im in ims), 30, "the first engine's instance managers to exit")

        with cep.Engine.local() as second:  # the launcher serves the next engine with new instance managers
            again = _registered(second, 2)
            assert {im["pid"] for im in again}.isdisjoint(im["pid"] for im in ims)
            assert parent(again[0]["pid"]) == launcher
            driver.stop(60)
            # stopped with the executor: processes gone, and the engine sees them gone
            wait_for(lambda: not any(i["alive"] for i in second.instance_managers()), 30,
                     "the engine to see the instance managers gone")
            wait_for(lambda: not any(alive(p) for p in [launcher] + [im["pid"] for im in again]), 30,
                     "the launcher and its instance managers to exit")
    finally:
        driver.kill()
