"""Bad migration requests: each is refused with a stable code and changes nothing.

An unknown operator, a bin out of range, an instance or an instance manager
that does not exist (or died), a second migration of an operator while one
runs, a misspelled strategy: the request fails before anything moves —
the bin table, the parallelism, the placement, the migration history and
the output stay as they were — and the query keeps taking input and gives
the output of the same sends at parallelism 1, in one process and on
instance managers. A migration under way when its query is undeployed, or
the engine closes, stops at once with UNDEPLOYED.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pytest

import sparkcep as cep
from harness import InThread
from sparkcep import auth
from sparkcep.errors import EngineError, QueryError, SparkcepError
from sparkcep.runtime.worker_start import Starting, wait_ready

T0 = 1_704_067_200_000_000
BINS = 1024
ROWS = 2_000  # per send; event time 1 ms apart, windows of 1 s


def query() -> cep.Query:
    q = cep.Query("errs")
    s = q.stream("ev", "k string, ts timestamp, v int64")
    q.output("out", s.filter(cep.col("v") % 3 != 0, name="keep")
             .aggregate(cep.TimeWindow("1s"), by=["k"], name="agg", n=cep.count(), total=cep.sum("v"),
                        last=cep.last("v")))
    return q


def chunk(i: int) -> pa.Table:
    """Send ``i``: ``ROWS`` events of 97 string keys."""
    idx = np.arange(i * ROWS, (i + 1) * ROWS, dtype=np.int64)
    return pa.table({"k": pa.array([f"key-{k}" for k in (idx * 7919) % 97]),
                     "ts": pa.array(T0 + idx * 1000, pa.timestamp("us")), "v": idx})


def rows(t: pa.Table) -> list[tuple]:
    return sorted(tuple(r.values()) for r in t.to_pylist())


def reference(sends: int) -> list[tuple]:
    with cep.Engine.local() as e:
        e.deploy(query())
        for i in range(sends):
            e.send("ev", chunk(i))
        e.end("ev")
        return rows(e.collect("out"))


class State:
    """What a refused request must leave as it was."""

    def __init__(self, engine, dep):
        self.engine, self.dep = engine, dep
        self.before = self.now()

    def now(self) -> dict:
        return {"owners": self.dep.bin_owners("agg"), "parallelism": dict(self.dep.parallelism),
                "placement": [im["instances"] for im in self.engine.instance_managers()],
                "finished": len(self.dep.migrations()["finished"]), "running": self.dep.migrations()["running"],
                "out": rows(self.engine.collect("out", timeout=60)), "sequence": self.engine.metrics()["sequence"]}

    def unchanged(self, what: str) -> None:
        assert self.now() == self.before, f"{what} changed the deployment"


def refused(state: State, code: str, call, kind=SparkcepError, match: str | None = None):
    """``call()`` raises ``kind`` with ``code`` (and ``match`` in its message), changing nothing."""
    with pytest.raises(kind) as err:
        call()
    assert err.value.code == code, f"{err.value} [{err.value.code}], expected {code}"
    if match is not None:
        assert match in str(err.value), str(err.value)
    state.unchanged(f"a request refused with {code}")
    return err.value


def start_spare(engine, tmp_path) -> tuple[subprocess.Popen, dict]:
    """A ``sparkcep worker`` started by hand with the engine's token, added to it; it hosts nothing."""
    token = auth.write(tmp_path / "token", engine.token)
    root = os.path.dirname(os.path.dirname(cep.__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, *sys.path]))
    proc = subprocess.Popen([sys.executable, "-m", "sparkcep", "worker", "--listen", "127.0.0.1:0", "--name",
                             "spare", "--cpus", "0", "--token-file", str(token)], stdout=subprocess.PIPE, env=env)
    try:
        info = wait_ready([Starting(proc, "spare worker")])[0]
        return proc, engine.add_instance_manager(info["address"])
    except BaseException:
        proc.kill()
        raise


@pytest.fixture(params=[0, 2], ids=["in-process", "workers"])
def running(request):
    """An engine (``workers``), the query deployed at parallelism 2 with its first sends in."""
    with cep.Engine.local(workers=request.param) as engine:
        dep = engine.deploy(query(), parallelism=2, bins=BINS)
        for i in range(3):
            engine.send("ev", chunk(i))
        engine.collect("out", timeout=60)
        yield engine, dep


def finish(engine, dep, sent: int, more: int = 3) -> None:
    """The query still takes input; after its end, its output is the reference's."""
    for i in range(sent, sent + more):
        engine.send("ev", chunk(i))
    engine.end("ev")
    assert rows(engine.collect("out", timeout=60)) == reference(sent + more)


def test_bad_requests_are_refused_and_change_nothing(running):
    engine, dep = running
    st = State(engine, dep)
    ims = [im["name"] for im in engine.instance_managers()] or ["engine"]
    # unknown operators, and one without a bin table (stateless)
    e = refused(st, "UNKNOWN_OPERATOR", lambda: dep.migrate("agr", {0: 1}), QueryError)
    assert "'agg'" in str(e)  # names the operators there are
    refused(st, "UNKNOWN_OPERATOR", lambda: dep.migrate("keep", {0: 1}), QueryError, "route-key")
    refused(st, "UNKNOWN_OPERATOR", lambda: dep.move("agr", 0, ims[0]), QueryError, "did you mean 'agg'")
    refused(st, "UNKNOWN_OPERATOR", lambda: dep.rescale("nope", 3), QueryError)
    # bins out of range, or not bins at all: nothing of the request applies, its good bins neither
    refused(st, "BAD_BIN", lambda: dep.migrate("agg", {0: 1, BINS: 1}), QueryError, f"0..{BINS - 1}")
    refused(st, "BAD_BIN", lambda: dep.migrate("agg", {-1: 0}), QueryError)
    refused(st, "BAD_BIN", lambda: dep.migrate("agg", {"3": 0}), QueryError)
    refused(st, "BAD_BIN", lambda: dep.migrate("agg", [(0, 1)]), QueryError)
    # instances that do not exist
    refused(st, "BAD_INSTANCE", lambda: dep.migrate("agg", {0: 1, 1: 2}), QueryError, "instances 0..1")
    refused(st, "BAD_INSTANCE", lambda: dep.migrate("agg", {0: True}), QueryError)
    refused(st, "BAD_INSTANCE", lambda: dep.move("agg", 2, ims[0]), QueryError)
    refused(st, "BAD_INSTANCE", lambda: dep.move("keep", -1, ims[0]), QueryError)
    refused(st, "BAD_INSTANCE", lambda: dep.rescale("agg", 0), QueryError)
    # instance managers that do not exist
    e = refused(st, "UNKNOWN_INSTANCE_MANAGER", lambda: dep.move("agg", 0, "im-7"), EngineError)
    assert "im-7" in str(e)
    # bad strategies
    refused(st, "BAD_STRATEGY", lambda: dep.migrate("agg", {0: 1}, strategy="fluidd"), QueryError,
            "did you mean 'fluid'")
    refused(st, "BAD_STRATEGY", lambda: dep.rescale("agg", 3, strategy="all_at_once"), QueryError)
    refused(st, "BAD_OPTION", lambda: dep.migrate("agg", {0: 1}, strategy="batched", batch=0), QueryError)
    # still whole: a good request runs, then input goes on and the output is the reference's
    report = dep.migrate("agg", {0: 1 - dep.bin_owners("agg")[0]}, strategy="all-at-once")
    assert report["bins"] == 1 and dep.bin_owners("agg")[1:] == st.before["owners"][1:]
    finish(engine, dep, sent=3)


def test_a_second_migration_of_an_operator_while_one_runs_is_refused(running):
    """A slow fluid migration of many bins runs in a thread; migrate, move and rescale of the same operator
    meanwhile are refused (MIGRATION_RUNNING), input keeps flowing, and the first one completes as asked."""
    engine, dep = running
    owners = dep.bin_owners("agg")
    moving = {b: 1 - o for b, o in enumerate(owners) if b % 2 == 0}  # half the bins change hands
    target = [moving.get(b, o) for b, o in enumerate(owners)]
    ims = [im["name"] for im in engine.instance_managers()] or ["engine"]
    t = InThread(lambda: dep.migrate("agg", moving, strategy="fluid", gap_ms=10))
    try:
        deadline = time.monotonic() + 30
        while not any(r["bins"] >= 3 for r in dep.migrations()["running"]) and time.monotonic() < deadline:
            time.sleep(0.01)
        sent = 3
        for call in (lambda: dep.migrate("agg", {1: 1 - owners[1]}, strategy="all-at-once"),
                     lambda: dep.move("agg", 0, ims[-1]),
                     lambda: dep.rescale("agg", 3)):
            running_now = dep.migrations()["running"]
            assert [r["operator"] for r in running_now] == ["agg"] and running_now[0]["kind"] == "migrate"
            with pytest.raises(QueryError) as err:
                call()
            assert err.value.code == "MIGRATION_RUNNING" and "'agg'" in str(err.value)
            assert dep.migrations()["running"], "the first migration ended before the second was asked: too quick"
            assert dep.parallelism["SQ2"] == 2
            engine.send("ev", chunk(sent))  # the query takes input meanwhile
            sent += 1
    finally:
        t.join(120)
    assert t.error is None, t.error
    report = t.result
    assert report["bins"] == len(moving) and report["steps"] == len(moving) and report["strategy"] == "fluid"
    assert dep.bin_owners("agg") == target  # the first one's table, nothing of the refused ones
    assert dep.parallelism["SQ2"] == 2 and len(dep.migrations()["finished"]) == 1
    finish(engine, dep, sent)


def test_a_migration_under_way_stops_with_undeployed_when_its_query_is_undeployed(running):
    """``undeploy`` while a slow fluid migration runs in a thread: the migration raises EngineError
    UNDEPLOYED at once (it used to wait 120 s for state that could not come, or fail with a TypeError
    from a released ring), and its report says so; no instance is left, and the query deploys again and
    runs as before."""
    engine, dep = running
    moving = {b: 1 - o for b, o in enumerate(dep.bin_owners("agg"))}
    t = InThread(lambda: dep.migrate("agg", moving, strategy="fluid", gap_ms=10))
    deadline = time.monotonic() + 30
    while not any(r["bins"] >= 3 for r in dep.migrations()["running"]) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert dep.migrations()["running"], "the migration ended before the undeploy: too quick"
    engine.undeploy("errs")
    undeployed = time.monotonic()
    t.join(30)
    assert not t.is_alive(), "the migration still runs 30 s after its query was undeployed"
    assert isinstance(t.error, EngineError) and t.error.code == "UNDEPLOYED", repr(t.error)
    assert "'errs'" in str(t.error) and t.failed_at - undeployed < 5
    assert all(not im["instances"] for im in engine.instance_managers())
    # the handle of the undeployed query: migrate({}) and rescale to the same count said they succeeded and
    # replicas() called it running on the instance managers it had left
    for call in (lambda: dep.migrate("agg", {}), lambda: dep.rescale("agg", 2), lambda: dep.move("agg", 0, "im-0")):
        with pytest.raises(EngineError, match="query 'errs' is undeployed") as e:
            call()
        assert e.value.code == "UNDEPLOYED"
    # the interrupted migration is in the history, with its error and the bins it moved before; a failed one
    # left no trace (WORKER_DIED too), though its bins had moved
    (interrupted,) = dep.migrations()["finished"]
    assert interrupted["kind"] == "migrate" and interrupted["error"].endswith("[UNDEPLOYED]"), interrupted
    assert interrupted["bins"] >= 3
    assert dep.replicas() == [{"replica": 0, "state": "undeployed", "instance_managers": []}]
    dep = engine.deploy(query(), parallelism=2, bins=BINS)
    finish(engine, dep, sent=0)


def causes(error: BaseException) -> list[str]:
    """The types of ``error`` and of every exception it was raised from or while handling."""
    out = []
    while error is not None:
        out.append(type(error).__name__)
        error = error.__cause__ or error.__context__
    return out


@pytest.mark.parametrize("delay", [0, 0.005, 0.02])
def test_a_move_under_way_stops_with_undeployed_when_the_engine_closes(delay, capfd):
    """``close()`` while a move deploys its new generation on the instance managers: the move raises
    EngineError UNDEPLOYED within seconds (it waited 30 s for replies that could not come, then raised a
    FileNotFoundError for the shared-memory folder close had removed), and no worker is left."""
    engine = cep.Engine.local(workers=2)
    try:
        dep = engine.deploy(query(), parallelism=2, bins=BINS)
        for i in range(3):
            engine.send("ev", chunk(i))
        pids = [im["pid"] for im in engine.instance_managers()]
        t = InThread(lambda: dep.move("agg", 0, "im-1"))
        time.sleep(delay)
    finally:
        engine.close()
    closed = time.monotonic()
    t.join(20)
    assert not t.is_alive(), "the move still runs 20 s after the engine closed"
    assert isinstance(t.error, EngineError) and t.error.code == "UNDEPLOYED", causes(t.error)
    assert t.failed_at - closed < 5 and "FileNotFoundError" not in causes(t.error), causes(t.error)
    assert "FileNotFoundError" not in capfd.readouterr().err
    assert not [pid for pid in pids if os.path.exists(f"/proc/{pid}")], "a worker outlived the engine"


def test_an_instance_manager_that_died_is_refused(tmp_path):
    """On an engine of its own: a worker started by hand and added, then killed (SIGKILL); a move onto it
    is refused (WORKER_DIED) and the query, which had nothing there, keeps running."""
    with cep.Engine.local(workers=2) as engine:
        dep = engine.deploy(query(), parallelism=2, bins=BINS)
        proc, spare = start_spare(engine, tmp_path)
        try:
            assert spare["name"] == "spare" and spare["instances"] == []
            for i in range(3):
                engine.send("ev", chunk(i))
            st = State(engine, dep)
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            deadline = time.monotonic() + 30
            while engine.instance_managers()[-1]["alive"] and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not engine.instance_managers()[-1]["alive"]
            st.before["placement"] = [im["instances"] for im in engine.instance_managers()]  # same, minus "alive"
            e = refused(st, "WORKER_DIED", lambda: dep.move("agg", 0, "spare"), EngineError)
            assert "spare" in str(e)
            refused(st, "WORKER_DIED", lambda: dep.move("keep", 1, "spare"), EngineError)
            refused(st, "UNKNOWN_INSTANCE_MANAGER", lambda: dep.move("agg", 0, "spar"), EngineError)
            finish(engine, dep, sent=3)
        finally:
            if proc.poll() is None:
                proc.kill()
            if proc.stdout is not None:
                proc.stdout.close()
