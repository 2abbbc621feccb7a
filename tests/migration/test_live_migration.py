"""Property: migrations at random moments — bins moved by any strategy, instances moved to other
instance managers, operators rescaled — never change a row of the output, output ids included.

Random data and queries (time and tuple windows, running aggregates, joins
and a user stateful operator, from ``core.id_queries``) run with a random
schedule of migrations between their sends, in one process, on worker
processes and on instance managers reached over the network channel; the
reference is the same input at parallelism 1 in one process, unmigrated.
"""

import os
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import pandas as pd
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import sparkcep as cep
from core.id_queries import assert_same_ids, build, id_rows, params, sends, start_at
from sparkcep import auth
from sparkcep.runtime.worker_start import Starting, wait_ready

BINS = 8


def migrations(draw, ims: list[str], at: set[int]):
    """``between(dep)``: after the sends numbered ``at``, a random migration of ``dep`` that changes
    something, checked against what was asked; returns it and the list of what it did."""
    done, sends = [], []

    def between(dep):
        sends.append(1)
        if len(sends) - 1 not in at:
            return
        keyed = sorted(dep.tables)
        stateful = [sq.head.name for sq in dep.plan.subqueries if sq.head.stateful]
        kind = draw(st.sampled_from((["migrate", "rescale"] if keyed else []) + (["move"] if stateful else [])))
        if kind == "move":
            done.append(move(dep, draw, draw(st.sampled_from(stateful)), ims))
        else:
            op = draw(st.sampled_from(keyed))
            n = dep.parallelism[dep.plan.sq_of[op].name]
            done.append(rescale(dep, draw, op, n) if kind == "rescale" or n == 1 else migrate(dep, draw, op, n))
    return between, done


def migrate(dep, draw, op: str, n: int) -> tuple:
    """Bins of ``op`` to other instances than their owners': afterwards each is where it was asked to be."""
    before = dep.bin_owners(op)
    bins = draw(st.lists(st.integers(0, BINS - 1), min_size=1, max_size=BINS, unique=True))
    moved = {b: (before[b] + draw(st.integers(1, n - 1))) % n for b in bins}
    report = dep.migrate(op, moved, strategy=draw(st.sampled_from(STRATEGIES)), batch=draw(st.integers(1, 3)))
    assert dep.bin_owners(op) == [moved.get(b, o) for b, o in enumerate(before)]
    assert report["bins"] == len(moved) and report["steps"] >= 1, report
    return "migrate", op, report["bins"], report["strategy"]


def rescale(dep, draw, op: str, n: int) -> tuple:
    """``op`` onto another number of instances: afterwards each holds as many bins as another, give or take
    one, and the report counts the bins whose owner changed (none when the instances dropped held none)."""
    before = dep.bin_owners(op)
    m = draw(st.sampled_from([k for k in (1, 2, 3) if k != n]))
    report = dep.rescale(op, m, strategy=draw(st.sampled_from(STRATEGIES)))
    after = dep.bin_owners(op)
    held = Counter(after)
    assert sorted(held) == list(range(m)) and max(held.values()) - min(held.values()) <= 1, held
    assert dep.parallelism[dep.plan.sq_of[op].name] == m
    assert report["bins"] == sum(a != b for a, b in zip(before, after)), (before, after, report)
    return "rescale", op, report["bins"], report["strategy"]


def move(dep, draw, op: str, ims: list[str]) -> tuple:
    """An instance of ``op`` onto an instance manager (another one where there are several): afterwards it
    runs there, owning the bins it owned."""
    sq = dep.plan.sq_of[op].name
    i = draw(st.integers(0, dep.parallelism[sq] - 1))
    here = dep.gen.host_of((sq, i))
    to = draw(st.sampled_from([im for im in ims if im != here] or ims))
    before = dep.bin_owners(op) if op in dep.tables else None
    report = dep.move(op, i, to)
    assert dep.gen.host_of((sq, i)) == to and report["kind"] == "move", (here, to, report)
    assert before is None or dep.bin_owners(op) == before
    assert report["bins"] == (before.count(i) if before is not None else BINS), report
    return "move", op, report["bins"], to


STRATEGIES = ["fluid", "batched", "all-at-once"]


def check(engine, p, data, ims):
    q = build(p)
    assume(any(sq.head.stateful for sq in q_plan(q).subqueries))  # something to migrate
    sent = data.draw(sends(list(q.sources)))
    par = {sq.head.name: data.draw(st.integers(1, 3)) if sq.parallelizable else 1 for sq in q_plan(q).subqueries}
    start = engine.metrics()["sequence"]
    at = data.draw(st.sets(st.integers(0, len(sent) - 1), min_size=1, max_size=3))
    between, done = migrations(data.draw, ims, at)
    got = id_rows(engine, q, sent, parallelism=par, bins=BINS, between=between)
    assert len(done) == len(at), done  # every migration drawn ran
    with cep.Engine.local() as e:
        start_at(e, start)
        want = id_rows(e, build(p), sent)
    assert_same_ids(got, want, f"{p['front']} -> {p['back']} at {par}, migrations {done}")


def q_plan(q):
    from sparkcep.query.planner import plan
    return plan(q)


@settings(deadline=None)
@given(p=params(), data=st.data())
def test_migrations_in_one_process_change_no_row(p, data):
    p["name"] = "mig_local"
    with cep.Engine.local() as engine:
        check(engine, p, data, ["engine"])


@settings(deadline=None, max_examples=max(1, settings().max_examples // 4))  # each example deploys on IMs
@given(p=params(), data=st.data())
def test_migrations_on_worker_processes_change_no_row(p, data, worker_engines):
    p["name"] = "mig_workers"
    engine = worker_engines(3)
    check(engine, p, data, [im["name"] for im in engine.instance_managers()])


@pytest.fixture(scope="module")
def network_engine(tmp_path_factory):
    """An engine whose instance managers serve on 127.0.0.2 and 127.0.0.3: every channel is TCP."""
    token_file = tmp_path_factory.mktemp("net") / "token"
    token = auth.write(token_file, auth.generate())
    root = os.path.dirname(os.path.dirname(cep.__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, *sys.path]))
    procs = [subprocess.Popen([sys.executable, "-m", "sparkcep", "worker", "--listen", f"{ip}:0", "--name",
                               f"net-{ip}", "--token-file", str(token)], stdout=subprocess.PIPE, env=env)
             for ip in ("127.0.0.2", "127.0.0.3")]
    try:
        infos = wait_ready([Starting(p, f"net worker {i}") for i, p in enumerate(procs)])
        engine = cep.Engine.local(instance_managers=[i["address"] for i in infos],
                                  token=auth.read(token_file))
        yield engine
        engine.close()
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


@settings(deadline=None, max_examples=max(1, settings().max_examples // 8))
@given(p=params(), data=st.data())
def test_migrations_over_the_network_channel_change_no_row(p, data, network_engine):
    p["name"] = "mig_net"
    check(network_engine, p, data, [im["name"] for im in network_engine.instance_managers()])


@pytest.mark.parametrize("where", ["workers", "network"])
def test_a_generation_switch_and_an_undeploy_do_not_wait_on_the_old_instances(where, request):
    """Dropping a generation (the one a State Transfer or rescale replaced, or an undeployed query) once
    stalled: the engine waited for the instance managers' replies holding the sink's lock, which the
    thread reading those replies needed (5 s, the undeploy's timeout), and each instance manager closed
    its TCP channels waiting for consumers that had stopped reading (2 s a channel)."""
    engine = request.getfixturevalue("worker_engines")(3) if where == "workers" else request.getfixturevalue(
        "network_engine")
    q = cep.Query(f"switch_{where}")
    s = q.stream(f"ev_{where}", "k int64, ts timestamp")
    q.output(f"counts_{where}", s.aggregate(cep.Running(), by="k", n=cep.count(), name="agg"))
    dep = engine.deploy(q, parallelism=2, bins=BINS)
    try:
        for i in range(3):
            engine.send(f"ev_{where}", {"k": np.arange(100), "ts": np.full(100, i, "datetime64[s]")})
        reports = [dep.rescale("agg", 3), dep.move("agg", 0, engine.instance_managers()[-1]["name"])]
        engine.send(f"ev_{where}", {"k": np.arange(100), "ts": np.full(100, 9, "datetime64[s]")})
        dep.wait()
        assert engine.outputs[f"counts_{where}"].rows == 400
    finally:
        t0 = time.monotonic()
        engine.undeploy(q.name)
        undeploy_s = time.monotonic() - t0
    assert [r["duration_s"] < 1.5 for r in reports] == [True, True], reports
    assert undeploy_s < 1.5


def test_a_rescale_down_whose_dropped_instance_holds_no_bin_moves_none():
    """Found by the property above: the bins of the instance a rescale drops may all have been migrated
    off it already; the rescale then moves no bin, reports 0, and changes no row."""
    q = cep.Query("drop_empty")
    s = q.stream("ev", "k int64, ts timestamp, v int64")
    q.output("out", s.aggregate(cep.TimeWindow("1s"), by="k", name="agg", n=cep.count(), total=cep.sum("v")))
    rows = [{"k": np.arange(i, i + 50) % 13, "ts": np.full(50, 1_000 * i, "datetime64[ms]"), "v": np.arange(50)}
            for i in range(6)]
    with cep.Engine.local() as engine:
        dep = engine.deploy(q, parallelism=3, bins=BINS)
        for i, batch in enumerate(rows):
            if i == 2:
                dep.migrate("agg", {b: b % 2 for b, o in enumerate(dep.bin_owners("agg")) if o == 2})
            if i == 4:
                owners = dep.bin_owners("agg")
                report = dep.rescale("agg", 2, strategy="fluid")
                assert (report["bins"], dep.parallelism[dep.plan.sq_of["agg"].name]) == (0, 2), report
                assert dep.bin_owners("agg") == owners
            engine.send("ev", batch)
        engine.end("ev")
        got = sorted((r["window_start"].second, r["k"], r["n"], r["total"])
                     for r in engine.collect("out", timeout=60).to_pylist())
    sent = pd.concat([pd.DataFrame(b).assign(w=i) for i, b in enumerate(rows)])
    want = sent.groupby(["w", "k"]).v.agg(["count", "sum"]).reset_index()
    assert got == sorted(map(tuple, want.to_numpy().tolist()))


def test_a_move_to_the_instance_manager_the_instance_runs_on_moves_nothing(worker_engines):
    """It switched a new generation and reported every bin of the instance moved (64 bins, 1 step, 0 bytes)."""
    engine = worker_engines(2)
    q = cep.Query("stay_put")
    s = q.stream("sp_in", "k int64, ts timestamp, v int64")
    q.output("sp_out", s.aggregate(cep.TimeWindow("1s"), by="k", name="agg", n=cep.count()))
    dep = engine.deploy(q, parallelism=2)
    try:
        engine.send("sp_in", {"k": np.arange(40) % 7, "ts": np.zeros(40, "datetime64[ms]"), "v": np.arange(40)})
        here = [im["name"] for im in engine.instance_managers() if "stay_put.SQ1[0]" in im["instances"]]
        wire = dep.gen.wire
        report = dep.move("agg", instance=0, to=here[0])
        assert (report["bins"], report["steps"]) == (0, 0), report
        assert dep.gen.wire == wire
        engine.send("sp_in", {"k": np.arange(40) % 7, "ts": np.zeros(40, "datetime64[ms]"), "v": np.arange(40)})
        engine.end("sp_in")
        got = sorted((r["k"], r["n"]) for r in engine.collect("sp_out", timeout=60).to_pylist())
        assert got == sorted((k, int((np.arange(40) % 7 == k).sum()) * 2) for k in range(7))
    finally:
        engine.undeploy("stay_put")
