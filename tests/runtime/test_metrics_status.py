"""Metrics of a running engine and ``sparkcep status``, checked against what was sent."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pytest

import sparkcep as cep


def make():
    q = cep.Query("mq")
    s = q.stream("m_in", "k string, ts timestamp, v int64")
    kept = s.filter(cep.col("v") % 2 == 0, name="even")
    q.output("m_out", kept.aggregate(cep.TimeWindow("1s"), by="k", name="per_k", n=cep.count()))
    return q


def send_all(engine, n=4000, batches=8):
    for b in range(batches):
        lo = b * n // batches
        hi = (b + 1) * n // batches
        engine.send("m_in", {"k": [f"k{i % 5}" for i in range(lo, hi)],
                             "ts": pa.array(np.arange(lo, hi) * 1000, pa.timestamp("us")),
                             "v": np.arange(lo, hi)})
    engine.end("m_in")


@pytest.mark.parametrize("workers", [0, 2])
def test_metrics_count_what_was_sent(workers):
    with cep.Engine.local(workers=workers) as engine:
        engine.deploy(make(), parallelism=2)
        send_all(engine)
        out = engine.collect("m_out")
        m = engine.metrics()
    assert m["sequence"] == 4000 and m["outputs"] == {"m_out": out.num_rows} and m["late"] == {"mq": {"per_k": 0}}
    q = m["queries"]["mq"]
    assert q["rows_in"] == 4000 and q["rows_out"] == out.num_rows == 4 * 5
    assert q["done_epoch"] == q["epoch"] == 9
    sq1, sq2 = q["subqueries"]["SQ1"], q["subqueries"]["SQ2"]
    assert (sq1["rows_in"], sq1["rows_out"]) == (4000, 2000) and sq1["instances"] == 2
    assert (sq2["rows_in"], sq2["rows_out"]) == (2000, 20) and sq2["operators"] == ["per_k"]
    assert q["operators"]["even"]["rows_out"] == 2000 and q["operators"]["per_k"]["rows_in"] == 2000
    for section in (q, sq1, sq2, q["operators"]["per_k"]):
        lat = section["latency_ms"]
        assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p99.9"] < 60_000
    assert q["input_rate"] > 0 and q["throughput"] > 0 and sq1["input_rate"] > 0
    assert all(v == 0 for v in sq1["queue"].values())  # everything consumed
    ims = m["instance_managers"]
    assert len(ims) == workers
    for im in ims.values():
        assert im["alive"] and im["rss_bytes"] > 10 << 20 and im["bytes_in"] > 0 and im["bytes_out"] > 0
        assert im["cpu_percent"] >= 0 and im["instances"] == 2
        # the ~150K objects of numba/pyarrow are frozen out of the GC: no full collection scans them
        assert im["gc"]["frozen_objects"] > 50_000 and im["gc"]["pause_ms_max"] < 50
    json.dumps(m)  # the endpoint ships it as JSON


@pytest.mark.parametrize("workers", [0, 2])
def test_a_closed_engine_has_no_metrics_and_no_instance_managers(workers):
    """After close() the workers are gone; instance_managers() listed each as alive and metrics() answered,
    while send() raised CLOSED. Each raises CLOSED now, as every call on a closed engine does."""
    engine = cep.Engine.local(workers=workers)
    engine.deploy(make(), parallelism=2)
    pids = [im["pid"] for im in engine.instance_managers()]
    engine.close()
    assert len(pids) == workers and not [pid for pid in pids if os.path.exists(f"/proc/{pid}")]
    for call in (engine.instance_managers, engine.metrics, lambda: engine.send("m_in", {"k": []})):
        with pytest.raises(cep.EngineError) as err:
            call()
        assert err.value.code == "CLOSED", err.value


def test_an_instance_manager_that_does_not_answer_is_named_in_the_metrics(monkeypatch):
    """One SIGSTOPped: metrics() waits METRICS_TIMEOUT_S for it, then its entry says it did not answer;
    its figures were missing without a word. The other's are there."""
    monkeypatch.setattr("sparkcep.runtime.cluster.METRICS_TIMEOUT_S", 1.0)
    with cep.Engine.local(workers=2) as engine:
        engine.deploy(make(), parallelism=2)
        stopped = engine.instance_managers()[0]
        os.kill(stopped["pid"], signal.SIGSTOP)
        try:
            ims = engine.metrics()["instance_managers"]
        finally:
            os.kill(stopped["pid"], signal.SIGCONT)
    by_name = {im["name"]: im for im in ims.values()}
    quiet, other = by_name[stopped["name"]], next(im for n, im in by_name.items() if n != stopped["name"])
    assert quiet["alive"] and "rss_bytes" not in quiet
    assert quiet["error"] == "no answer to the metrics request within 1 s (stopped? overloaded?)"
    assert other["rss_bytes"] > 10 << 20 and "error" not in other


def test_metrics_answer_while_a_send_waits_on_a_stopped_instance_manager(monkeypatch):
    """metrics() waited for the engine's lock, which a send blocked on the stopped process's full ring holds
    until it gives up (60 s): it answered after 67 s instead of the metrics wait."""
    monkeypatch.setattr("sparkcep.runtime.cluster.METRICS_TIMEOUT_S", 1.0)
    with cep.Engine.local(workers=1, ring_bytes=65536) as engine:
        engine.deploy(make())
        stopped = engine.instance_managers()[0]
        os.kill(stopped["pid"], signal.SIGSTOP)
        sent = []

        def send_on():
            for b in range(50):
                engine.send("m_in", {"k": ["k"] * 1000, "ts": pa.array(np.full(1000, b), pa.timestamp("us")),
                                     "v": np.arange(1000)})
                sent.append(b)
        sender = threading.Thread(target=send_on, daemon=True)
        try:
            sender.start()
            time.sleep(1.0)
            assert len(sent) < 50  # the ring is full: the send waits
            t0 = time.monotonic()
            ims = engine.metrics()["instance_managers"]
            took = time.monotonic() - t0
        finally:
            os.kill(stopped["pid"], signal.SIGCONT)
        sender.join(30)
    assert took < 5, took
    assert ims[0]["error"] == "no answer to the metrics request within 1 s (stopped? overloaded?)"
    assert len(sent) == 50  # and the send went on once it was back


def test_sends_go_on_while_metrics_wait_for_a_stopped_instance_manager(zookeeper, monkeypatch):
    """The endpoint held its lock while metrics() waited for an instance manager that did not answer: every
    send through it (Engine.connect's, Spark's), even to a query elsewhere, waited as long, and concurrent
    metrics requests were answered one after another. And ``Engine.connect`` made every call on one
    connection, one at a time: its metrics() held up the sends of other threads (9.5 s on a cluster). Its
    data path here is this process's engine, named in the registry as an engine host is."""
    from sparkcep.control import tree
    from sparkcep.control.registry import open_registry
    from sparkcep.gateway.client import EngineClient
    monkeypatch.setattr("sparkcep.runtime.cluster.METRICS_TIMEOUT_S", 3.0)
    took = {}

    def timed(what, call):
        t0 = time.monotonic()
        call()
        took[what] = time.monotonic() - t0

    def send(sender):
        return lambda: sender.send("m_in", {"k": ["a"], "ts": pa.array([0], pa.timestamp("us")), "v": [2]})
    with cep.Engine.local(workers=2) as engine:
        q = cep.Query("one")
        q.output("one_out", q.stream("m_in", "k string, ts timestamp, v int64").filter(cep.col("v") > 0))
        engine.deploy(q)  # one instance
        stopped = next(im for im in engine.instance_managers() if not im["instances"])  # not the query's
        root = f"/connect{os.getpid()}"
        registry = open_registry(f"zk://{zookeeper}{root}", token=engine.token)
        registry.create(tree.ENGINE, {"name": "here", "address": engine.endpoint.address}, ephemeral=True)
        try:
            with EngineClient(engine.endpoint.address, token=engine.token) as a, \
                    EngineClient(engine.endpoint.address, token=engine.token) as b, \
                    EngineClient(engine.endpoint.address, token=engine.token) as c, \
                    cep.Engine.connect(f"zk://{zookeeper}{root}", token=engine.token) as connected:
                os.kill(stopped["pid"], signal.SIGSTOP)
                waits = [threading.Thread(target=timed, args=(what, call)) for what, call in
                         [("metrics a", a.metrics), ("metrics b", b.metrics), ("connected", connected.metrics)]]
                for t in waits:
                    t.start()
                time.sleep(0.5)  # they all wait for the stopped one
                timed("send", send(c))
                timed("send connected", send(connected))
                for t in waits:
                    t.join(30)
        finally:
            os.kill(stopped["pid"], signal.SIGCONT)
            registry.close()
    assert took["send"] < 1.0 and took["send connected"] < 1.0, took
    assert all(2.5 < took[w] < 5 for w in ("metrics a", "metrics b", "connected")), took  # side by side


def test_status_shows_a_running_local_engine(own_home):
    with cep.Engine.local(workers=2) as engine:
        engine.deploy(make(), parallelism=2)
        send_all(engine)
        engine.collect("m_out")
        env = dict(os.environ, SPARKCEP_HOME=str(own_home))
        p = subprocess.run([sys.executable, "-m", "sparkcep.cli", "status"], capture_output=True, text=True,
                           timeout=120, env=env)
        pids = [im["pid"] for im in engine.instance_managers()]
    assert p.returncode == 0, p.stderr
    text = p.stdout
    assert f"engine {engine.endpoint.address} (pid {os.getpid()}): 4,000 tuples in" in text
    assert "instance managers (2):" in text and all(str(pid) in text for pid in pids)
    assert "mq: in 4,000" in text and "out 20" in text
    assert "SQ1 x2 [even]" in text and "SQ2 x2 [per_k]" in text
    assert "instance 1: instance manager im-1 (127.0.0.1:" in text
    assert "output m_out: 20 rows" in text


def test_status_says_a_query_failed():
    """A query failed by its instance manager's death (metrics: state failed) was printed as a healthy one."""
    from sparkcep.control.status import render
    with cep.Engine.local(workers=2) as engine:
        engine.deploy(make(), parallelism=2)
        send_all(engine, batches=2)
        os.kill(engine.instance_managers()[1]["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while (m := engine.metrics())["queries"]["mq"]["state"] != "failed" and time.monotonic() < deadline:
            time.sleep(0.1)
    lines = render({"address": "a", "pid": 1}, m).splitlines()
    assert m["queries"]["mq"]["state"] == "failed"
    assert any(line.startswith("  mq [FAILED]: in 4,000") for line in lines), lines


def test_status_without_an_engine_says_so(own_home):
    env = dict(os.environ, SPARKCEP_HOME=str(own_home / "empty"))
    p = subprocess.run([sys.executable, "-m", "sparkcep.cli", "status"], capture_output=True, text=True,
                       timeout=120, env=env)
    assert p.returncode == 1 and "no local engine is running" in p.stderr


def _status(home) -> str:
    env = dict(os.environ, SPARKCEP_HOME=str(home))
    p = subprocess.run([sys.executable, "-m", "sparkcep.cli", "status"], capture_output=True, text=True,
                       timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    return p.stdout


def _metric_samples(engine) -> dict[str, float]:
    """The last ``$metrics`` sample (long form), taken now, as {name: value}."""
    from sparkcep.gateway.client import EngineClient

    with EngineClient.connect(engine.endpoint.address) as c:
        latest = c.offsets("$metrics", interval=0)["latest"][0]
        rows = c.read("$metrics", 0, 0, latest).to_pydict()
    last = max(rows["time"])
    return {n: v for t, n, v in zip(rows["time"], rows["name"], rows["value"]) if t == last}


def test_migrations_and_balancer_decisions_are_visible(own_home, tmp_path):
    """A migration under way, the finished ones (bins, bytes, steps, duration, latency) and the balancer's
    decisions with their reasons appear in engine.metrics(), in the $metrics stream and in ``sparkcep status``."""
    from sparkcep import auth
    from sparkcep.runtime.worker_start import Starting, wait_ready

    with cep.Engine.local(workers=2) as engine:
        dep = engine.deploy(make(), parallelism=2, bins=1024, balance=True)
        engine.send("m_in", {"k": [f"k{i}" for i in range(500)], "ts": pa.array(np.arange(500) * 1000,
                                                                                  pa.timestamp("us")),
                             "v": np.arange(500)})
        before = _metric_samples(engine)
        assert before["balancer.decisions"] == 0 and not any(n.startswith("migrations.") for n in before)
        # a slow migration: shown while it runs
        moving = {b: 1 - o for b, o in enumerate(dep.bin_owners("per_k")) if b < 150}
        done: dict = {}
        t = threading.Thread(target=lambda: done.update(report=dep.migrate("per_k", moving, "fluid", gap_ms=40)))
        t.start()
        try:
            deadline = time.monotonic() + 30
            while not dep.migrations()["running"] and time.monotonic() < deadline:
                time.sleep(0.01)
            running = engine.metrics()["migrations"]["mq"]["running"]
            assert [(r["operator"], r["kind"], r["strategy"], r["planned_bins"]) for r in running] == \
                [("per_k", "migrate", "fluid", 150)]
            sample = _metric_samples(engine)
            assert sample["migrations.mq.per_k.running.planned_bins"] == 150
            assert 0 <= sample["migrations.mq.per_k.running.bins"] < 150
            text = _status(own_home)
            assert "migrations (1 running, 0 finished):" in text, text
            assert "running  mq.per_k: migrate (fluid), " in text and "/150 bins" in text, text
        finally:
            t.join(120)
        report = done["report"]
        assert report["bins"] == 150 and report["steps"] == 150 and report["bytes"] > 0
        # an instance manager joins: the balancer decides to give it a share of per_k
        token = auth.write(tmp_path / "token", engine.token)
        root = os.path.dirname(os.path.dirname(cep.__file__))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, *sys.path]))
        proc = subprocess.Popen([sys.executable, "-m", "sparkcep", "worker", "--listen", "127.0.0.1:0", "--name",
                                 "newcomer", "--cpus", "0", "--token-file", str(token)], stdout=subprocess.PIPE,
                                env=env)
        try:
            engine.add_instance_manager(wait_ready([Starting(proc, "newcomer")])[0]["address"])
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                decisions = engine.metrics()["balancer"]["decisions"]
                if decisions and decisions[-1]["state"] != "running":
                    break
                time.sleep(0.2)
            m = engine.metrics()
            sample = _metric_samples(engine)
            text = _status(own_home)
        finally:
            proc.kill()
            proc.wait()
            proc.stdout.close()
    # engine.metrics(): the reports and the decision with its reason
    finished = m["migrations"]["mq"]["finished"]
    assert [(r["kind"], r["operator"]) for r in finished] == [("migrate", "per_k"), ("rescale", "per_k")]
    assert finished[0] == report
    rescaled = finished[1]
    assert rescaled["bins"] == 1024 // 3 and rescaled["bytes"] > 0 and rescaled["steps"] >= 1
    (decision,) = m["balancer"]["decisions"]
    assert decision["action"] == "rescale" and decision["state"] == "done" and decision["report"] == rescaled
    assert decision["reason"].startswith("instance manager newcomer joined: per_k goes from 2 to 3 instances")
    assert set(m["balancer"]["busy"]) >= {"im-0", "im-1"}
    # $metrics: the last report's figures per operator, the balancer's counts and busy shares
    for k in ("bins", "bytes", "steps", "duration_s", "max_latency_ms", "p99_latency_ms", "latency_epochs"):
        assert sample[f"migrations.mq.per_k.last.{k}"] == rescaled[k], k
    assert sample["migrations.mq.per_k.last.finished"] == pytest.approx(rescaled["finished"])
    assert not any(".running." in name for name in sample)
    assert sample["balancer.decisions"] == 1 and sample["balancer.deciding"] == 0
    assert 0 <= sample["balancer.busy.im-0"] <= 1 and sample["balancer.queued_bytes.im-0"] >= 0
    # sparkcep status: the finished migrations and the decision, its reason and report
    assert "migrations (0 running, 2 finished):" in text, text
    assert "mq.per_k: migrate (fluid), 150 bins, " in text and "150 steps in " in text, text
    assert f"mq.per_k: rescale ({rescaled['strategy']}), {rescaled['bins']:,} bins, " in text, text
    assert "balancer (queries mq): busy im-0 " in text and "decisions (1, the last 1):" in text, text
    assert "mq.per_k rescale [done]: instance manager newcomer joined: per_k goes from 2 to 3" in text, text
    assert f"latency max {rescaled['max_latency_ms']:g} ms, p99 {rescaled['p99_latency_ms']:g} ms" in text, text


def test_instance_managers_that_do_not_answer_cost_one_wait(monkeypatch):
    """Both SIGSTOPped: metrics() asks them at once and waits METRICS_TIMEOUT_S once (it asked one after
    the other, waiting for each in turn), then names both."""
    monkeypatch.setattr("sparkcep.runtime.cluster.METRICS_TIMEOUT_S", 2.0)
    with cep.Engine.local(workers=2) as engine:
        engine.deploy(make(), parallelism=2)
        pids = [im["pid"] for im in engine.instance_managers()]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            ims = engine.metrics()["instance_managers"]
            took = time.monotonic() - t0
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
    assert 2.0 <= took < 3.5, took
    assert all(im["error"].startswith("no answer to the metrics request within 2 s") for im in ims.values())


@pytest.mark.parametrize("workers", [0, 2])
def test_counters_keep_what_retired_instances_counted(workers):
    """A rescale in (3 -> 2) retires an instance: what it counted stays in its sub-query's and operator's
    counters, which never go down (they lost it: SQ2 rows in 2,000 -> fewer)."""
    with cep.Engine.local(workers=workers) as engine:
        dep = engine.deploy(make(), parallelism=2, bins=16)
        dep.rescale("per_k", 3)
        send_all(engine, batches=4)
        before = engine.metrics()["queries"]["mq"]
        dep.rescale("per_k", 2)
        after = engine.metrics()["queries"]["mq"]
    sq2, was = after["subqueries"]["SQ2"], before["subqueries"]["SQ2"]
    assert was["instances"] == 3 and sq2["instances"] == 2
    assert sq2["rows_in"] == was["rows_in"] == after["operators"]["per_k"]["rows_in"] == 2000
    assert sq2["rows_out"] == was["rows_out"] == after["operators"]["per_k"]["rows_out"] == 20
    assert sq2["busy_s"] >= was["busy_s"] > 0 and sq2["latency_ms"] == was["latency_ms"]


def test_counters_never_go_down_while_operators_are_rescaled_and_moved_or_undeployed():
    """Sampled while a rescale or move ran, a sub-query's rows in fell to 0 (the new generation's instances
    counted from zero until they took over the old ones' counters), then came back. An instance manager's
    bytes in and out summed the channels open now: they fell at each rescale and to 0 at undeploy."""
    with cep.Engine.local(workers=2) as engine:
        dep = engine.deploy(make(), parallelism=2, bins=16)
        send_all(engine, batches=4)
        engine.collect("m_out")
        seen, stop = [], threading.Event()

        def sample():
            while not stop.is_set():
                m = engine.metrics()
                q = m["queries"]["mq"]
                seen.append(((q["subqueries"]["SQ1"]["rows_in"], q["operators"]["even"]["rows_out"],
                              q["subqueries"]["SQ2"]["rows_in"]),
                             {n: (im["bytes_in"], im["bytes_out"]) for n, im in m["instance_managers"].items()}))
        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            for _ in range(2):
                dep.rescale("per_k", 3)
                dep.move("per_k", instance=0, to=engine.instance_managers()[1]["name"])
                dep.rescale("per_k", 1)
        finally:
            stop.set()
            sampler.join(30)
        engine.undeploy("mq")
        m = engine.metrics()["instance_managers"]
    assert len(seen) > 5 and {counts for counts, _ in seen} == {(4000, 2000, 2000)}, sorted({c for c, _ in seen})
    moved = [b for _, b in seen] + [{n: (im["bytes_in"], im["bytes_out"]) for n, im in m.items()}]
    assert all(n > 0 for n in moved[0].values() for n in n)
    for name in moved[0]:
        for way in (0, 1):  # in, out
            assert [b[name][way] for b in moved] == sorted(b[name][way] for b in moved), [b[name] for b in moved]
    assert all(im["bytes_in_rate"] >= 0 and im["bytes_out_rate"] >= 0 for im in m.values())


def test_a_rebuilt_replica_does_not_restart_the_counters():
    """With replicas=2, the replica rebuilt after its instance manager died counts from its catch-up: the
    sub-query counters read half the rows sent, for good."""
    with cep.Engine.local(workers=2, standby=1) as engine:
        dep = engine.deploy(make(), replicas=2)

        def send(b):
            engine.send("m_in", {"k": [f"k{i % 5}" for i in range(1000)],
                                 "ts": pa.array(np.arange(1000) + b * 1000, pa.timestamp("us")), "v": np.arange(1000)})
        for b in range(4):
            send(b)
        dep.wait()
        victim = next(im for im in engine.instance_managers() if im.get("replica") == 0)
        os.kill(victim["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
                [r["state"] for r in dep.replicas()] == ["running", "running"]
                and dep.replicas()[0]["instance_managers"] != [victim["name"]]):
            time.sleep(0.1)
        assert dep.replicas()[0]["instance_managers"] != [victim["name"]], dep.replicas()
        for b in range(4, 8):
            send(b)
        dep.wait()
        q = engine.metrics()["queries"]["mq"]
    assert q["rows_in"] == 8000
    assert (q["subqueries"]["SQ1"]["rows_in"], q["operators"]["even"]["rows_out"]) == (8000, 4000)


def test_an_instance_manager_that_does_not_answer_is_not_shown_up(monkeypatch):
    """One SIGSTOPped: Prometheus' sparkcep_instance_manager_up is 0 for it, with no figure, and
    ``sparkcep status`` says "no answer" with its figures unknown; both showed it up, at 0 % CPU and 0 B."""
    from prometheus_client.parser import text_string_to_metric_families

    from sparkcep.control import prometheus, status

    monkeypatch.setattr("sparkcep.runtime.cluster.METRICS_TIMEOUT_S", 1.0)
    with cep.Engine.local(workers=2) as engine:
        engine.deploy(make(), parallelism=2)
        stopped, other = (im["name"] for im in engine.instance_managers())
        os.kill(engine.instance_managers()[0]["pid"], signal.SIGSTOP)
        try:
            m = engine.metrics()
        finally:
            os.kill(engine.instance_managers()[0]["pid"], signal.SIGCONT)
    samples = [s for f in text_string_to_metric_families(prometheus.exposition(lambda: m)) for s in f.samples
               if s.name.startswith("sparkcep_instance_manager_")]
    figures = {(s.name, s.labels["instance_manager"]): s.value for s in samples if not s.name.endswith("_info")}
    assert figures["sparkcep_instance_manager_up", stopped] == 0
    assert figures["sparkcep_instance_manager_up", other] == 1
    assert [k for k in figures if k[1] == stopped] == [("sparkcep_instance_manager_up", stopped)]
    assert figures["sparkcep_instance_manager_rss_bytes", other] > 10 << 20
    text = status.render({}, m)
    line = next(line for line in text.splitlines() if line.strip().startswith(f"{stopped} "))
    assert line.split()[-6:] == ["answer", "?", "?", "?", "?", "?"] and " no answer " in line, text
    assert "no answer to the metrics request within 1 s" in text
    assert next(line for line in text.splitlines() if line.strip().startswith(f"{other} ")).split()[5] == "up"
