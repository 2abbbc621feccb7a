"""A worker that dies or fails: a clear error on the deployment, nothing hangs, nothing is left behind."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pyarrow as pa
import pytest

import sparkcep as cep


def events(n, start=0):
    return {"k": [f"k{i % 7}" for i in range(start, start + n)],
            "ts": pa.array(np.arange(start, start + n) * 1_000_000, pa.timestamp("us")),
            "v": np.arange(start, start + n)}


def query(name="fq"):
    q = cep.Query(name)
    s = q.stream("f_in", "k string, ts timestamp, v int64")
    q.output("f_out", s.filter(cep.col("v") >= 0, name="keep")
             .aggregate(cep.TimeWindow("5s"), by="k", name="agg", n=cep.count()))
    return q


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_killed_instance_manager_fails_its_deployment_with_a_clear_error():
    with cep.Engine.local(workers=2) as engine:
        dep = engine.deploy(query(), parallelism=2)
        engine.send("f_in", events(100))
        assert engine.collect("f_out").num_rows > 0
        victim = engine.instance_managers()[1]
        os.kill(victim["pid"], signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(cep.EngineError) as e:
            for i in range(1000):  # the error surfaces on a send or on collect, never a hang
                engine.send("f_in", events(100, 100 * (i + 1)))
                engine.collect("f_out", timeout=30)
        assert time.monotonic() - t0 < 10
        err = e.value
        assert err.code == "WORKER_DIED"
        text = str(err)
        assert "instance manager im-1" in text and f"pid {victim['pid']}" in text and "query fq" in text
        assert "died with exit code -9" in text, text
        assert "SQ1[1]" in text and "SQ2[1]" in text, text
        assert dep.error is err
        with pytest.raises(cep.EngineError, match="instance manager im-1"):
            dep.explain() and engine.collect("f_out")
        ims = engine.metrics()["instance_managers"]
        assert ims[1]["alive"] is False and ims[0]["alive"] is True
        pids = [im["pid"] for im in engine.instance_managers()]
    t0 = time.monotonic()
    while not all(gone(p) for p in pids) and time.monotonic() - t0 < 5:
        time.sleep(0.05)
    assert all(gone(p) for p in pids)


def failing(batch):
    if pa.compute.max(batch.column("v")).as_py() >= 150:
        raise ValueError("v too large for this operator")
    return batch


def test_an_operator_failing_inside_a_worker_is_reported_with_its_place():
    with cep.Engine.local(workers=2) as engine:
        q = cep.Query("boom")
        s = q.stream("b_in", "k string, ts timestamp, v int64")
        q.output("b_out", s.apply(failing, name="picky"))
        engine.deploy(q, parallelism=2)
        engine.send("b_in", events(100))
        assert engine.collect("b_out").num_rows == 100
        with pytest.raises(cep.EngineError) as e:
            engine.send("b_in", events(100, 100))
            engine.collect("b_out", timeout=30)
        assert e.value.code == "OPERATOR_FAILED"
        text = str(e.value)
        assert "v too large" in text and "SQ1[" in text and "query boom" in text and "'picky'" in text
        # the other instance managers carry on with other queries
        engine.undeploy("boom")
        engine.deploy(query("after"), parallelism=2)
        engine.send("f_in", events(50))
        engine.end("f_in")
        assert engine.collect("f_out").column("n").to_pylist() and \
            sum(engine.collect("f_out").column("n").to_pylist()) == 50


def test_workers_stop_by_themselves_when_the_engine_process_dies(tmp_path):
    script = textwrap.dedent(f"""
        import json, os, signal, sys
        sys.path.insert(0, {os.path.dirname(os.path.dirname(cep.__file__))!r})
        import sparkcep as cep
        import psutil
        e = cep.Engine.local(workers=2)
        ims = [im["pid"] for im in e.instance_managers()]
        print(json.dumps(ims + [psutil.Process(ims[0]).ppid()]), flush=True)  # and the template they came from
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    env = dict(os.environ, SPARKCEP_HOME=str(tmp_path))
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    pids = json.loads(p.stdout.strip().splitlines()[-1])
    t0 = time.monotonic()
    while not all(gone(pid) for pid in pids) and time.monotonic() - t0 < 10:
        time.sleep(0.1)
    assert all(gone(pid) for pid in pids), pids


def test_close_leaves_no_process_and_no_shared_memory():
    engine = cep.Engine.local(workers=2)
    engine.deploy(query(), parallelism=2)
    engine.send("f_in", events(10))
    pids, shm = [im["pid"] for im in engine.instance_managers()], engine.cluster.dir
    assert os.path.isdir(shm)
    engine.close()
    assert all(gone(p) for p in pids)
    assert not os.path.exists(shm)
    with pytest.raises(cep.EngineError, match="closed"):
        engine.send("f_in", events(1))


def test_an_unguarded_script_with_threads_starts_its_workers(tmp_path):
    """Workers are `sparkcep worker` processes: nothing re-imports the user's script, whatever runs beside."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        import sys, threading, time
        sys.path.insert(0, {os.path.dirname(os.path.dirname(cep.__file__))!r})
        import sparkcep as cep
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()  # e.g. a JVM gateway
        q = cep.Query("top")
        q.output("out", q.stream("f_in", "k string, ts timestamp, v int64").filter(cep.col("v") > 0))
        engine = cep.Engine.local(workers=1)
        engine.deploy(q)
        engine.send("f_in", {{"k": ["a", "b"], "ts": [0, 1], "v": [1, 2]}})
        print("rows", engine.collect("out").num_rows)
        engine.close()
    """).replace('"ts": [0, 1]', '"ts": __import__("pyarrow").array([0, 1], __import__("pyarrow").timestamp("us"))'))
    env = dict(os.environ, SPARKCEP_HOME=str(tmp_path))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "rows 2"


def test_after_a_worker_death_the_engine_stays_usable_and_subscribers_hear_of_it():
    """One replica: the user's next call and the output's subscribers get WORKER_DIED at once; the dead
    instance manager is never placed on again; a new deployment runs on the others."""
    with cep.Engine.local(workers=2) as engine:
        engine.deploy(query(), parallelism=2)
        heard, got = [], []
        engine.subscribe("f_out", got.append, on_error=heard.append)
        engine.send("f_in", events(100))
        victim = engine.instance_managers()[1]
        os.kill(victim["pid"], signal.SIGKILL)
        t0 = time.monotonic()
        while not heard and time.monotonic() - t0 < 5:
            time.sleep(0.01)
        assert heard and heard[0].code == "WORKER_DIED" and victim["name"] in str(heard[0])
        with pytest.raises(cep.EngineError) as e:
            engine.send("f_in", events(10, 100))
        assert e.value.code == "WORKER_DIED" and time.monotonic() - t0 < 5
        engine.undeploy("fq")
        dep = engine.deploy(query("again"), parallelism=2)
        assert victim["name"] not in "".join(dep.explain().splitlines())
        assert all(im["instances"] == [] for im in engine.instance_managers() if im["name"] == victim["name"])
        engine.send("f_in", events(50))
        engine.end("f_in")
        assert sum(engine.collect("f_out").column("n").to_pylist()) == 50


def test_a_sigkilled_engine_s_shared_memory_is_reclaimed_by_the_next_engine(tmp_path):
    script = textwrap.dedent(f"""
        import json, os, signal, sys
        sys.path.insert(0, {os.path.dirname(os.path.dirname(cep.__file__))!r})
        import sparkcep as cep
        e = cep.Engine.local(workers=1)
        print(json.dumps(e.cluster.dir), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    env = dict(os.environ, SPARKCEP_HOME=str(tmp_path))
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    left = json.loads(p.stdout.strip().splitlines()[-1])
    assert os.path.isdir(left)  # SIGKILL: nobody could remove it
    with cep.Engine.local(workers=1) as engine:
        assert not os.path.exists(left)
        assert engine.cluster.dir != left
    shm = os.path.dirname(left)
    assert not [n for n in os.listdir(shm) if n.startswith("sparkcep-") and not _running(n)]


def _running(name: str) -> bool:
    """Is the process owning a sparkcep shared-memory directory alive?"""
    from sparkcep.runtime.process import SHM_NAME
    m = SHM_NAME.match(name)
    return not m or not gone(int(m.group(1)))
