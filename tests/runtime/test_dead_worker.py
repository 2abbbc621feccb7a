"""A SIGKILLed instance manager of a local engine is reported and cleaned up: the engine's log names it
with the instances it ran, ``sparkcep status`` shows it DEAD with the same, and its shared memory (the
rings it read) is removed once the engine noticed the death."""

import logging
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa

import sparkcep as cep
from sparkcep.runtime.process import SHM

ROOT = os.path.dirname(os.path.dirname(cep.__file__))


def query() -> cep.Query:
    q = cep.Query("dq")
    s = q.stream("d_in", "k string, ts timestamp, v int64")
    q.output("d_out", s.aggregate(cep.TimeWindow("5s"), by="k", name="agg", n=cep.count()))
    return q


def shm_of(pid: int) -> list[str]:
    return [n for n in os.listdir(SHM) if n.startswith(f"sparkcep-im-{pid}-")]


def test_a_killed_instance_manager_is_logged_shown_dead_by_status_and_its_shared_memory_goes(caplog):
    caplog.set_level(logging.WARNING, logger="sparkcep")
    with cep.Engine.local(workers=2) as engine:
        engine.deploy(query(), parallelism=2)
        engine.send("d_in", {"k": [f"k{i % 7}" for i in range(100)],
                             "ts": pa.array(np.arange(100) * 1_000_000, pa.timestamp("us")), "v": np.arange(100)})
        victim = engine.instance_managers()[1]
        ran = [i.split(".", 1)[1] for i in victim["instances"]]
        assert ran and shm_of(victim["pid"])
        os.kill(victim["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 5
        while any(im["alive"] for im in engine.instance_managers() if im["name"] == victim["name"]) \
                or shm_of(victim["pid"]):
            assert time.monotonic() < deadline, f"death noticed, shared memory left: {shm_of(victim['pid'])}"
            time.sleep(0.02)

        logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert any(f"instance manager {victim['name']}" in m and f"pid {victim['pid']}" in m
                   and all(i in m for i in ran) for m in logged), logged

        env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, *sys.path]))
        status = subprocess.run([sys.executable, "-m", "sparkcep", "status", "--engine", engine.endpoint.address],
                                env=env, capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stderr
        lines = status.stdout.splitlines()
        row = next(k for k, line in enumerate(lines) if line.split()[:1] == [victim["name"]])
        assert "DEAD" in lines[row].split() and str(victim["pid"]) in lines[row], status.stdout
        assert "died" in lines[row + 1] and all(i in lines[row + 1] for i in ran), status.stdout
        other = next(line for line in lines if line.split()[:1] == ["im-0"])
        assert "up" in other.split(), status.stdout
