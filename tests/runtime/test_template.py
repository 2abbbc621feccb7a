"""The instance-manager template: the engines of a process fork their instance managers from one
process that loaded the kernels once; a fork runs with the environment and ``sys.path`` of the moment,
outlives the thread that asked for it, and ends with the template, which the engine then names."""

import json
import signal
import os
import subprocess
import sys
import textwrap
import threading
import time

import psutil

import sparkcep as cep


def parent(pid: int) -> psutil.Process:
    return psutil.Process(pid).parent()


def assert_rows_pass(engine, name: str) -> None:
    """Rows sent through a query of two instances come out, on the engine's instance managers."""
    q = cep.Query(name)
    q.output(f"{name}_out", q.stream(f"{name}_in", "v int64"))
    engine.deploy(q, parallelism=2)
    engine.send(f"{name}_in", {"v": [1, 2, 3]})
    engine.end(f"{name}_in")
    assert sorted(engine.collect(f"{name}_out").column("v").to_pylist()) == [1, 2, 3]


def test_the_engines_of_a_process_fork_their_instance_managers_from_one_template():
    first = cep.Engine.local(workers=1)
    second = cep.Engine.local(workers=2)
    try:
        pids = [im["pid"] for e in (first, second) for im in e.instance_managers()]
        templates = {parent(pid).pid for pid in pids}
        assert len(templates) == 1 and os.getpid() not in templates
        template = psutil.Process(templates.pop())
        assert "sparkcep.runtime.template" in template.cmdline()
        assert template.parent().pid == os.getpid()
        first.close()
        assert all(not psutil.pid_exists(pid) for pid in pids[:1])  # reaped by the template, not left a zombie
        assert template.is_running() and template.status() != psutil.STATUS_ZOMBIE
    finally:
        first.close()
        second.close()


def test_a_fork_runs_with_the_environment_and_path_the_engine_has_when_it_starts(tmp_path, monkeypatch):
    cep.Engine.local(workers=1).close()  # the template is up, started before the path and variable below
    (tmp_path / "stamped_by_env.py").write_text(textwrap.dedent("""
        import os
        import pyarrow as pa

        def stamp(batch):
            return batch.append_column("mark", pa.array([os.environ["SPARKCEP_TEST_MARK"]] * batch.num_rows))
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SPARKCEP_TEST_MARK", "set-after-the-template")
    import stamped_by_env
    q = cep.Query("marked")
    s = q.stream("m_in", "k string, v int64")
    q.output("m_out", s.apply(stamped_by_env.stamp, schema="k string, v int64, mark string"))
    with cep.Engine.local(workers=1) as engine:
        engine.deploy(q)
        engine.send("m_in", {"k": ["a", "b"], "v": [1, 2]})
        engine.end("m_in")
        assert engine.collect("m_out").column("mark").to_pylist() == ["set-after-the-template"] * 2


def test_killing_the_template_ends_its_instance_managers_and_the_next_engine_starts_another(tmp_path):
    """In a process of its own: this one's template serves the other tests."""
    script = textwrap.dedent(f"""
        import json, os, signal, sys, time
        sys.path.insert(0, {os.path.dirname(os.path.dirname(cep.__file__))!r})
        import psutil
        import sparkcep as cep
        e = cep.Engine.local(workers=2)
        q = cep.Query("t")
        q.output("t_out", q.stream("t_in", "v int64"))
        e.deploy(q, parallelism=2)
        e.send("t_in", {{"v": [1, 2, 3]}})
        ims = [im["pid"] for im in e.instance_managers()]
        template = psutil.Process(ims[0]).parent().pid
        os.kill(template, signal.SIGKILL)
        error = None
        for _ in range(100):
            try:
                e.send("t_in", {{"v": [4]}})
            except cep.EngineError as err:
                error = [err.code, str(err)]
                break
            time.sleep(0.1)
        time.sleep(1)
        gone = [pid for pid in ims if not psutil.pid_exists(pid) or
                psutil.Process(pid).status() == psutil.STATUS_ZOMBIE]
        with cep.Engine.local(workers=1) as again:
            again.deploy(q)
            again.send("t_in", {{"v": [5, 6]}})
            again.end("t_in")
            rows = again.collect("t_out").column("v").to_pylist()
            other = psutil.Process(again.instance_managers()[0]["pid"]).parent().pid
        print(json.dumps({{"error": error, "gone": gone, "ims": ims, "rows": rows,
                          "new_template": other != template}}), flush=True)
        e.close()
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, SPARKCEP_HOME=str(tmp_path)))
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["error"] is not None and got["error"][0] == "WORKER_DIED", got
    assert "instance manager im-" in got["error"][1], got
    assert sorted(got["gone"]) == sorted(got["ims"]), got
    assert got["rows"] == [5, 6] and got["new_template"], got



def test_an_engine_started_in_a_thread_that_ended_keeps_its_instance_managers():
    """Each instance manager used to get SIGTERM when the thread that started it ended (PR_SET_PDEATHSIG
    follows the starting thread): an engine started in a worker thread had none left to deploy to."""
    started = []
    thread = threading.Thread(target=lambda: started.append(cep.Engine.local(workers=2)))
    thread.start()
    thread.join()
    with started[0] as engine:
        assert_rows_pass(engine, "threaded")
        assert all(im["alive"] for im in engine.instance_managers())


def test_a_stopped_template_is_named_and_a_fork_after_it_resumes_is_its_own(monkeypatch):
    """SIGSTOP of the template: an engine's start says so within the limit instead of hanging, and once it
    resumes, the answer to the fork that timed out is not taken for the next one's."""
    from sparkcep.runtime import template
    cep.Engine.local(workers=1).close()
    monkeypatch.setattr(template, "FORK_ANSWER_S", 1.0)
    stopped = template._template.process.pid
    os.kill(stopped, signal.SIGSTOP)
    try:
        started = time.monotonic()
        try:
            cep.Engine.local(workers=1)
        except cep.EngineError as e:
            assert e.code == "WORKER_STUCK" and f"pid {stopped}" in str(e) and "SIGSTOP" in str(e), e
        else:
            raise AssertionError("an engine started with its template stopped")
        assert time.monotonic() - started < 10
    finally:
        os.kill(stopped, signal.SIGCONT)
    with cep.Engine.local(workers=2) as engine:
        assert_rows_pass(engine, "resumed")
        pids = [im["pid"] for im in engine.instance_managers()]
        assert len(set(pids)) == 2 and all(parent(pid).pid == stopped for pid in pids)


def test_an_idle_template_ends_and_the_next_engine_starts_another(tmp_path):
    """In a process of its own (with a short idle limit): once its last instance manager ended and no
    request came for the limit, the template exits, giving its memory back; the next engine starts one."""
    script = textwrap.dedent(f"""
        import json, sys, time
        sys.path.insert(0, {os.path.dirname(os.path.dirname(cep.__file__))!r})
        import psutil
        import sparkcep as cep
        from sparkcep.runtime import template
        template.IDLE_S = 1.0
        def rows_through(e, name):
            q = cep.Query(name)
            q.output(name + "_out", q.stream(name + "_in", "v int64"))
            e.deploy(q)
            e.send(name + "_in", {{"v": [7]}})
            e.end(name + "_in")
            return e.collect(name + "_out").column("v").to_pylist()
        def running(p):
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        with cep.Engine.local(workers=1) as e:
            first = psutil.Process(e.instance_managers()[0]["pid"]).parent()
            time.sleep(1.5)
            alive_while_used = running(first) and rows_through(e, "first") == [7]
        time.sleep(2.5)
        ended = not running(first)
        with cep.Engine.local(workers=1) as e:
            rows = rows_through(e, "again")
        print(json.dumps({{"alive_while_used": alive_while_used, "ended": ended, "rows": rows}}), flush=True)
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, SPARKCEP_HOME=str(tmp_path)))
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got == {"alive_while_used": True, "ended": True, "rows": [7]}, got
