"""The data path's journal and take-over, in one process: a primary engine streams its journal to a standby
over a real authenticated connection; at a random moment the primary is dropped and the standby's copy is
replayed into a fresh engine, which takes the rest of the input.

The output logs after the take-over hold exactly what a run without failure holds: the same rows with
the same output ids at the same (partition, position), the rows published before the take-over never
twice; a send retried under its send id after the take-over is taken once; the readers' positions carry
over; an aborted send leaves no trace.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

import sparkcep as cep
from sparkcep.control.datapath.backup import Backup, replay
from sparkcep.control.datapath.journal import Journal
from sparkcep.gateway.client import EngineClient

SCHEMA = "k int64, ts timestamp, v int64"


def query() -> cep.Query:
    q = cep.Query("dq")
    s = q.stream("dq_in", SCHEMA)
    q.output("dq_win", s.aggregate(cep.TimeWindow("1s"), by="k", name="agg", n=cep.count(), total=cep.sum("v")))
    q.output("dq_all", s.filter(cep.col("v") % 3 != 0))
    return q


def batch(i: int, n: int = 50) -> pa.Table:
    r = np.random.default_rng(i)
    return pa.table({"k": r.integers(0, 7, n), "v": r.integers(0, 100, n),
                     "ts": pa.array(1_700_000_000_000_000 + i * 300_000 + np.sort(r.integers(0, 300_000, n)),
                                    pa.timestamp("us"))})


def logs(engine) -> dict:
    """Every output's retained rows per partition, with their output ids and positions."""
    out = {}
    for name, log_ in engine.outputs.items():
        parts = {}
        for p, end in log_.latest().items():
            start = log_.earliest()[p]
            rows = log_.read(p, start, end, ids=True)
            parts[p] = (start, end, pa.Table.from_batches(rows, log_.stored_schema).to_pylist() if rows else [])
        out[name] = parts
    return out


class Standby:
    """A standby in this process: a backup behind a real endpoint (the journal's link is a real client)."""

    def __init__(self):
        self.backup = Backup()
        self.engine = cep.Engine.local()
        self.engine.endpoint._ops["journal"] = lambda h, payload: (self.backup.apply(int(h["era"]), h, payload),
                                                                   ({}, b""))[1]

    def close(self):
        self.engine.close()


def primary(standby: Standby):
    engine = cep.Engine.local()
    journal = Journal(1, engine.run_id, engine.token)
    journal.token = standby.engine.token
    journal.outputs, journal.staging = engine.outputs, engine.endpoint.staging
    engine.journal = journal
    journal.attach("standby", standby.engine.endpoint.address)
    journal.mark_recorded("standby")
    return engine


@contextlib.contextmanager
def taken_over(before):
    """``before(primary)`` on a primary with a standby, then the primary gone: yields the engine the standby's
    copy was replayed into, closed after."""
    standby = Standby()
    first = primary(standby)
    try:
        before(first)
    finally:
        first.journal.close()
        first.close()
    second = cep.Engine.local()
    try:
        replay(standby.backup, second)
        yield second
    finally:
        second.close()
        standby.close()


@settings(max_examples=12)
@given(sends=st.integers(4, 14), cut=st.data(), aborted=st.booleans())
def test_a_take_over_at_any_moment_gives_the_rows_a_run_without_failure_gives(sends, cut, aborted):
    at = cut.draw(st.integers(1, sends - 1), label="sends before the primary dies")
    with cep.Engine.local(workers=0) as ref:
        ref.deploy(query(), parallelism=2)
        for i in range(sends):
            ref.send("dq_in", batch(i))
        ref.end("dq_in")
        want = logs(ref)

    standby = Standby()
    first = primary(standby)
    try:
        first.deploy(query(), parallelism=2)
        first.outputs["dq_all"].register("reader")
        for i in range(at):
            first._take("dq_in", batch(i), ("id", f"id-{i}"))
        if aborted:  # a send the engine aborts after journaling it: the standby must not replay it
            dep = first.deployments["dq"]
            dep.flush = lambda: (_ for _ in ()).throw(cep.EngineError("interrupted", "TEST_ABORT"))
            try:
                first.send("dq_in", batch(10_000))
            except cep.EngineError:
                pass
            del dep.flush
        first.outputs["dq_all"].commit({0: 1}, "reader")
        seen = logs(first)
    finally:
        first.journal.close()
        first.close()  # the primary is gone

    second = cep.Engine.local()
    try:
        replay(standby.backup, second)
        assert second.run_id == first.run_id
        after = logs(second)
        for name, parts in seen.items():  # every row a reader could see, where it was, ids included
            for p, (start, _, rows) in parts.items():
                assert after[name][p][0] == start and after[name][p][2][:len(rows)] == rows
        ids = standby.backup.sent_ids()
        assert ids.taken("dq_in", f"id-{at - 1}") == batch(at - 1).num_rows
        for i in range(at, sends):
            second.send("dq_in", batch(i))
        second.end("dq_in")
        got = logs(second)
        assert got["dq_win"] == want["dq_win"]
        assert {p: rows for p, (_, _, rows) in got["dq_all"].items()} == \
            {p: rows[1:] if p == 0 else rows for p, (_, _, rows) in want["dq_all"].items()}
    finally:
        second.close()
        standby.close()


def test_a_standby_refuses_an_older_era_and_everything_once_fenced():
    standby = Standby()
    try:
        with EngineClient(standby.engine.endpoint.address, token=standby.engine.token) as c:
            c.request("journal", era=3, kind="begin", run="r")
            for era, fenced in ((2, False), (3, True)):
                standby.backup.fenced = fenced
                try:
                    c.request("journal", era=era, kind="ready")
                    raise AssertionError("accepted")
                except cep.EngineError as e:
                    assert e.code == "FENCED"
    finally:
        standby.close()


def want_windows(sends: int) -> dict:
    """``dq_win`` of a run without failure of ``sends`` batches."""
    with cep.Engine.local(workers=0) as ref:
        ref.deploy(query(), parallelism=2)
        for i in range(sends):
            ref.send("dq_in", batch(i))
        ref.end("dq_in")
        return logs(ref)["dq_win"]


def test_no_reader_sees_a_row_the_standby_does_not_hold():
    """The primary's standby is fenced (it took over, or was dropped): the rows the primary's queries produce
    from then on are not shown to readers until a new standby, named in the registry, holds them. Before,
    a reader saw them, and the successor, without them, refused its position (``OFFSET_RANGE``) or gave
    other rows there."""
    first_standby, second_standby = Standby(), Standby()
    engine = primary(first_standby)
    try:
        engine.deploy(query(), parallelism=2)
        dep_id = engine.deployments["dq"].id

        def held(standby):
            return {name: standby.backup.logs[dep_id][name].latest() for name in engine.outputs}

        def shown():
            return {name: log_.latest() for name, log_ in engine.outputs.items()}
        for i in range(3):
            engine.send("dq_in", batch(i))
        assert shown() == held(first_standby) and sum(shown()["dq_all"].values()) > 0
        first_standby.backup.fenced = True  # its next entry fails: it is dropped
        for i in range(3, 6):
            engine.send("dq_in", batch(i))
        assert shown() == held(first_standby)  # nothing more for readers
        engine.journal.token = second_standby.engine.token
        engine.journal.attach("second", second_standby.engine.endpoint.address)
        engine.send("dq_in", batch(6))
        assert shown() == held(first_standby)  # synced, but not named in the registry yet
        engine.journal.mark_recorded("second")
        engine.end("dq_in")  # the sink offers the rows again: the second standby takes them
        assert shown() == held(second_standby) and shown() != held(first_standby)
        assert logs(engine)["dq_win"] == want_windows(7)
    finally:
        engine.journal.close()
        engine.close()
        first_standby.close()
        second_standby.close()


def test_a_query_deployed_again_after_a_take_over_gets_a_new_deployment_id():
    """Deployed (dq#1), undeployed, then deployed again on the primary that took over: it was dq#1 again (the
    journal forgets an undeployed query), so a reader's positions of the first deployment were taken for the
    second one's rows. The number goes on, for a standby synced later too."""
    standby = Standby()
    first = primary(standby)
    try:
        assert first.deploy(query()).id == "dq#1"
        first.send("dq_in", batch(0))
        first.undeploy("dq")
    finally:
        first.journal.close()
        first.close()
    second, later = cep.Engine.local(), Standby()
    try:
        replay(standby.backup, second)  # then serves as the host does, a standby synced from it
        journal = Journal(2, second.run_id, second.token, standby.backup.entries, standby.backup.last_deployment)
        journal.token = later.engine.token
        journal.outputs, journal.staging = second.outputs, second.endpoint.staging
        second.journal = journal
        journal.attach("later", later.engine.endpoint.address)
        assert second.deploy(query()).id == "dq#2"
        second.undeploy("dq")
        journal.close()
        third = cep.Engine.local()
        try:
            replay(later.backup, third)
            assert third.deploy(query()).id == "dq#3"
        finally:
            third.close()
    finally:
        second.close()
        later.close()
        standby.close()


def test_a_deployment_that_failed_fails_again_after_a_take_over():
    """A replicas=1 query failed (WORKER_DIED) on the primary came back running after a take-over: the
    replay deployed it on live workers again and nothing said it had failed. It is failed again, with its
    error, and refuses sends as before."""
    def before(first):
        first.deploy(query())
        first.send("dq_in", batch(0))
        first.deployments["dq"].fail(cep.EngineError("instance manager w1 is gone", "WORKER_DIED"))
    with taken_over(before) as second:
        assert [r["state"] for r in second.deployment("dq").replicas()] == ["failed"]
        with pytest.raises(cep.EngineError, match="instance manager w1 is gone") as e:
            second.send("dq_in", batch(1))
        assert e.value.code == "WORKER_DIED"


def test_the_migrations_history_and_the_layout_carry_over_a_take_over():
    """After a fail-over the new primary had the layout but no report: ``migrations()`` said none had
    finished, and the Prometheus series of migrations went away."""
    seen = {}

    def before(first):
        dep = first.deploy(query(), parallelism=2, bins=16)
        first.send("dq_in", batch(0))
        dep.rescale("agg", 3)
        dep.migrate("agg", {0: 2, 1: 2})
        first.send("dq_in", batch(1))
        seen.update(reports=dep.migrations()["finished"], owners=dep.bin_owners("agg"))
    with taken_over(before) as second:
        after = second.deployment("dq")
        assert [r["kind"] for r in seen["reports"]] == ["rescale", "migrate"]
        assert after.migrations()["finished"] == seen["reports"] and after.bin_owners("agg") == seen["owners"]
        assert second.metrics()["migrations"]["dq"]["finished"] == seen["reports"]
