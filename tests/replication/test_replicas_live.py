"""A replicated deployment changing while it runs, on worker processes with 64 KiB rings.

* Live migration: ``replicas=2`` on four worker processes (two a replica), under a steady input: bins
  migrate, an instance moves (State Transfer), the operator rescales from 2 to 3 instances, each begun
  while a send is under way. The rows of the windows that closed next come from the replica that delivers first; then
  an instance manager of that replica is killed, and the rows of the windows still open (1 s sliding
  windows: they hold the changes) come from the other replica's migrated state. Output equal, per key,
  to the unreplicated run in one process; both replicas run after; ``bin_owners`` as asked.
* A replica that loses an instance manager in the middle of a rescale is left out of its remaining
  steps; the rescale completes on the other, and the lost one is rebuilt in the new layout (then it
  carries the query alone, exactly).
* A replica that loses every instance manager just before a rescale adds instances: the rescale goes on
  without it. A standby a move put to use takes no other replica's rebuild.
* A slow catch-up: while a lost replica's state travels, its rebuilt instances hold the input that
  arrives in their channels, bounded, so the sources wait instead of memory growing.
"""

import itertools
import os
import re
import signal
import threading
import time

import numpy as np
import pyarrow as pa
import pytest
from sender import Sender

import sparkcep as cep
from harness import plain, wait
from reference import assert_same_rows
from sparkcep.migration import megaphone
from sparkcep.runtime.cluster import Cluster

T0 = 1_704_067_200_000_000
BINS = 16
LIMIT_S = 60
RING_BYTES = 64 << 10  # the smallest ring: a few sends fill it
SLOW_S = 2.0  # how long a catch-up's state is held back on its way


def query(name: str) -> cep.Query:
    q = cep.Query(name)
    s = q.stream(f"{name}_in", "k int64, ts timestamp, v int64")
    q.output(f"{name}_out", s.aggregate(cep.TimeWindow("1s", advance="100ms"), by="k", name="agg",
                                        n=cep.count(), total=cep.sum("v"), last=cep.last("v")))
    return q


def events(i: int) -> pa.Table:
    """Send ``i``: 400 rows over 300 keys, 10 ms of event time."""
    rng = np.random.default_rng(i)
    return pa.table({"k": rng.integers(0, 300, 400),
                     "ts": pa.array(T0 + i * 10_000 + np.sort(rng.integers(0, 10_000, 400)), pa.timestamp("us")),
                     "v": rng.integers(0, 1_000, 400)})


def reference(name: str, sent: list[int]) -> pa.Table:
    with cep.Engine.local(workers=0) as e:
        e.deploy(query(name))
        for i in sent:
            e.send(f"{name}_in", events(i))
        e.end(f"{name}_in")
        return e.collect(f"{name}_out")


@pytest.fixture(scope="module")
def engine():
    with cep.Engine.local(workers=4, ring_bytes=RING_BYTES) as e:
        yield e


def sending(engine, stream: str, pace_s: float) -> tuple[Sender, list[int]]:
    """A started :class:`Sender` of ``events(0), events(1), ...`` to ``stream``, and the list of the sends
    it made (for the reference run)."""
    sent: list[int] = []

    def send(i):
        engine.send(stream, events(i))
        sent.append(i)
    return Sender(send, itertools.count(), pace_s=pace_s).start(), sent


def placement(dep) -> list[dict[int, str]]:
    """Per replica, instance -> the instance manager it runs on (from ``explain()``, which shows every replica)."""
    out: list[dict[int, str]] = [{}, {}]
    for r, i, im in re.findall(r"replica (\d) \(\S+\) instance (\d+): instance manager (\S+)", dep.explain()):
        out[int(r)][int(i)] = im
    return out


def test_a_replicated_deployment_migrates_moves_and_rescales_under_input(engine):
    dep = engine.deploy(query("rm"), parallelism=2, bins=BINS, replicas=2)
    sender, sent = sending(engine, "rm_in", pace_s=0.02)
    sender.wait_done(10, LIMIT_S)

    def under_input(change) -> dict:
        """``change()`` begun while a send is under way (a move takes a few ms: less than the pace)."""
        report: list[dict] = []
        assert sender.during_send(lambda: report.append(change())), "no send was under way"
        return report[0]

    asked = {b: 1 - b % 2 for b in range(BINS)}  # even bins to instance 1, odd ones to 0
    under_input(lambda: dep.migrate("agg", asked, strategy="fluid", gap_ms=20))
    assert dep.bin_owners("agg") == [asked[b] for b in range(BINS)]

    before = placement(dep)
    to = next(im for im in dep.replicas()[0]["instance_managers"] if im != before[0][0])
    under_input(lambda: dep.move("agg", instance=0, to=to))
    assert placement(dep)[0] == {**before[0], 0: to}
    assert dep.bin_owners("agg") == [asked[b] for b in range(BINS)]

    under_input(lambda: dep.rescale("agg", instances=3))
    owners = dep.bin_owners("agg")
    assert sorted(np.bincount(owners, minlength=3)) == [5, 5, 6], owners
    assert dep.parallelism == {"SQ1": 3}
    assert [sorted(p) for p in placement(dep)] == [[0, 1, 2], [0, 1, 2]], dep.explain()

    # the rest of the output from the other replica: the replica whose rows were published loses one
    firsts = engine.metrics()["queries"]["rm"]["replication"]["dedup"]["first_copies"]
    leader = max((0, 1), key=lambda r: firsts.get(r, 0))
    own = set(placement(dep)[leader].values()) - set(placement(dep)[1 - leader].values())
    victim = next(im for im in engine.instance_managers() if im["name"] in own)
    sender.wait_done(sender.done + 20, LIMIT_S)  # windows holding the changes close (the leader's rows)
    assert sender.during_send(lambda: os.kill(victim["pid"], signal.SIGKILL))
    wait(lambda: [r["state"] for r in dep.replicas()] == ["running", "running"] and
         engine.metrics()["queries"]["rm"]["replication"]["catchups"], "the replica's catch-up", LIMIT_S)
    sender.wait_done(sender.done + 10, LIMIT_S)
    sender.stop()
    assert not sender.errors, sender.errors
    engine.end("rm_in")
    got = engine.collect("rm_out")
    rep = engine.metrics()["queries"]["rm"]["replication"]
    engine.undeploy("rm")
    assert [f["replica"] for f in rep["failovers"]] == [leader], rep["failovers"]
    assert_same_rows(plain(got), plain(reference("rm", sent)), "migrated, moved and rescaled, with replicas=2")


def test_a_move_keeps_the_replicas_on_disjoint_instance_managers(engine):
    dep = engine.deploy(query("mx"), parallelism=2, bins=BINS, replicas=2)
    try:
        before = placement(dep)
        to = next(im for im in dep.replicas()[0]["instance_managers"] if im != before[0][0])
        dep.move("agg", instance=0, to=to)
        after = placement(dep)
        assert not set(after[0].values()) & set(after[1].values()), dep.explain()
    finally:
        engine.undeploy("mx")


def test_a_rescale_goes_on_when_a_replica_loses_an_instance_manager_during_it(monkeypatch):
    """SIGKILL of an instance manager of replica 0 between two steps of a rescale from 2 to 3 instances,
    sends flowing: the rescale completes on replica 1 (before, it failed with WORKER_DIED); replica 0 is
    rebuilt from it with 3 instances. Then replica 1's instance managers die, and replica 0's rows alone
    complete the output, equal per key to the unreplicated run."""
    with cep.Engine.local(workers=4, ring_bytes=RING_BYTES) as engine:
        dep = engine.deploy(query("rk"), parallelism=2, bins=BINS, replicas=2)
        sender, sent = sending(engine, "rk_in", pace_s=0.01)
        sender.wait_done(10, LIMIT_S)
        victim = next(im for im in engine.instance_managers() if im["name"] == placement(dep)[0][0])
        steps = []
        step_records = megaphone.step_records

        def killing(rep, operator, moves):
            steps.append(rep.replica)
            if rep.replica == 0 and steps.count(0) == 2:  # replica 0's second step: its instance manager dies first
                os.kill(victim["pid"], signal.SIGKILL)
                # the engine noticed: its next step finds the replica failed
                wait(lambda: rep.error is not None, "the replica to be failed", LIMIT_S, every=0.005)
            return step_records(rep, operator, moves)
        monkeypatch.setattr(megaphone, "step_records", killing)
        report = dep.rescale("agg", instances=3, batch=2)
        assert report["bins"] == 5 and steps == [0, 1, 0, 1, 1], (report, steps)  # 3 steps of 2 bins
        assert dep.parallelism == {"SQ1": 3}
        wait(lambda: [r["state"] for r in dep.replicas()] == ["running", "running"], "both replicas to run",
             LIMIT_S)
        assert [sorted(p) for p in placement(dep)] == [[0, 1, 2], [0, 1, 2]], dep.explain()
        assert victim["name"] not in placement(dep)[0].values(), dep.explain()

        sender.wait_done(sender.done + 10, LIMIT_S)
        for im in engine.instance_managers():
            if im["name"] in placement(dep)[1].values():
                assert sender.during_send(lambda: os.kill(im["pid"], signal.SIGKILL))
        sender.wait_done(sender.done + 10, LIMIT_S)
        sender.stop()
        assert not sender.errors, sender.errors
        engine.end("rk_in")
        got = engine.collect("rk_out")
        rep = engine.metrics()["queries"]["rk"]["replication"]
    assert [f["replica"] for f in rep["failovers"]] == [0, 1], rep["failovers"]
    assert_same_rows(plain(got), plain(reference("rk", sent)), "replica 0 rebuilt after a rescale, then alone")


def test_a_standby_a_move_put_to_use_takes_no_other_replica(monkeypatch):
    """Replica 0's instance 0 moved onto the standby, then replica 1's instance manager dies: replica 1 was
    rebuilt on that standby, beside replica 0 (one more death failed both). Now it has nowhere to go and
    waits; replica 0 carries the query alone, exactly."""
    monkeypatch.setattr("sparkcep.replication.catchup.ROOM_WAIT_S", 2.0)
    with cep.Engine.local(workers=2, standby=1, ring_bytes=RING_BYTES) as engine:
        dep = engine.deploy(query("sb"), parallelism=2, bins=BINS, replicas=2)
        sent = list(range(10))
        for i in sent[:5]:
            engine.send("sb_in", events(i))
        dep.move("agg", instance=0, to="im-2")
        assert [r["instance_managers"] for r in dep.replicas()] == [["im-0", "im-2"], ["im-1"]]
        assert not next(im for im in engine.instance_managers() if im["name"] == "im-2")["standby"]
        os.kill(next(im["pid"] for im in engine.instance_managers() if im["name"] == "im-1"), signal.SIGKILL)
        wait(lambda: "error" in (engine.metrics()["queries"]["sb"]["replication"]["catchups"] or [{}])[-1],
             "the rebuild to give up", LIMIT_S)
        reps = dep.replicas()
        assert [r["state"] for r in reps] == ["running", "failed"], reps
        for i in sent[5:]:
            engine.send("sb_in", events(i))
        engine.end("sb_in")
        got = engine.collect("sb_out")
    assert_same_rows(plain(got), plain(reference("sb", sent)), "replica 0 alone")


def test_a_rescale_goes_on_when_a_replica_has_lost_every_instance_manager(monkeypatch):
    """Replica 1's only instance manager dies just before the rescale adds its new instances: placing them
    raised ValueError (min() of no instance manager) and left the deployment at 3 instances with the bins
    where they were. The rescale completes on replica 0; replica 1 is rebuilt on the standby."""
    from sparkcep.migration.migrator import Migrator
    with cep.Engine.local(workers=2, standby=1, ring_bytes=RING_BYTES) as engine:
        dep = engine.deploy(query("rd"), parallelism=2, bins=BINS, replicas=2)
        sent = list(range(10))
        for i in sent[:5]:
            engine.send("rd_in", events(i))
        victim = next(im for im in engine.instance_managers() if im["name"] == "im-1")
        grown = Migrator._grown

        def dying(self, d, sq, instances):
            if d.replica == 1:
                os.kill(victim["pid"], signal.SIGKILL)
                wait(lambda: self.cluster.ims[1].dead is not None, "im-1 to be dead", LIMIT_S, every=0.005)
            return grown(self, d, sq, instances)
        monkeypatch.setattr(Migrator, "_grown", dying)
        report = dep.rescale("agg", instances=3)
        assert report["bins"] == 5 and dep.parallelism == {"SQ1": 3}  # 16 bins: the new instance takes 5
        assert sorted(set(dep.bin_owners("agg"))) == [0, 1, 2]
        wait(lambda: [r["state"] for r in dep.replicas()] == ["running", "running"], "both replicas to run",
             LIMIT_S)
        assert [r["instance_managers"] for r in dep.replicas()] == [["im-0"], ["im-2"]]
        for i in sent[5:]:
            engine.send("rd_in", events(i))
        engine.end("rd_in")
        got = engine.collect("rd_out")
    assert_same_rows(plain(got), plain(reference("rd", sent)), "rescaled on replica 0, replica 1 rebuilt")


def test_a_migration_reports_the_latency_of_the_output_not_of_a_paused_replica():
    """Replica 0's instance manager SIGSTOPped for ``pause_s`` while a migration runs, sends flowing (rings
    large enough to hold them): replica 1 delivers every epoch meanwhile, so the output's latency stays
    low; the report gave replica 0's (about ``pause_s``). The migration itself waits for the paused one."""
    pause_s = 2.0
    with cep.Engine.local(workers=2) as engine:
        dep = engine.deploy(query("pz"), parallelism=2, bins=BINS, replicas=2)
        sender, _ = sending(engine, "pz_in", pace_s=0.02)
        sender.wait_done(5, LIMIT_S)
        pid = next(im["pid"] for im in engine.instance_managers() if im["name"] == placement(dep)[0][0])
        os.kill(pid, signal.SIGSTOP)
        resume = threading.Timer(pause_s, os.kill, (pid, signal.SIGCONT))
        resume.start()
        try:
            report = dep.migrate("agg", {b: 1 - o for b, o in enumerate(dep.bin_owners("agg"))}, strategy="fluid")
        finally:
            resume.join()
        sender.stop()
        assert not sender.errors, sender.errors
    assert report["duration_s"] > pause_s * 0.7 and report["latency_epochs"] > 10, report
    assert report["max_latency_ms"] < pause_s * 1000 / 2, report


def test_a_slow_catch_up_holds_the_sources_back(engine, monkeypatch):
    """The survivor's state reaches the rebuilt replica ``SLOW_S`` late (a slow link, as for a large state):
    meanwhile the rebuilt instance reads nothing, its rings fill, and sends wait; then they go on. Output
    equal per key to the unreplicated run."""
    dep = engine.deploy(query("bp"), parallelism=1, bins=BINS, replicas=2)
    relay = Cluster._relay

    def slow_relay(self, sender, record):
        time.sleep(SLOW_S)
        relay(self, sender, record)
    monkeypatch.setattr(Cluster, "_relay", slow_relay)
    sender, sent = sending(engine, "bp_in", pace_s=0.01)
    sender.wait_done(10, LIMIT_S)
    victim = next(im for im in engine.instance_managers() if im["name"] in placement(dep)[0].values())
    assert sender.during_send(lambda: os.kill(victim["pid"], signal.SIGKILL))
    wait(lambda: dep.replicas()[0]["state"] == "catching-up", "the catch-up to start", LIMIT_S, every=0.001)
    t0, at_start = time.monotonic(), sender.done
    wait(lambda: dep.replicas()[0]["state"] == "running", "the catch-up to end", LIMIT_S, every=0.001)
    took, during = time.monotonic() - t0, sender.done - at_start
    sender.wait_done(sender.done + 10, LIMIT_S)
    sender.stop()
    assert not sender.errors, sender.errors
    engine.end("bp_in")
    got = engine.collect("bp_out")
    engine.undeploy("bp")
    assert took >= SLOW_S and during <= 8, f"{during} sends taken in the {took:.2f} s the catch-up took"
    assert_same_rows(plain(got), plain(reference("bp", sent)), "through a slow catch-up")


def test_the_replicas_of_a_closed_engine_are_undeployed():
    """After close() had stopped every instance manager, a replicated query's handle said both replicas were
    running (one not replicated said undeployed, as after undeploy)."""
    with cep.Engine.local(workers=2) as e:
        dep = e.deploy(query("closed_replicas"), replicas=2)
        assert [r["state"] for r in dep.replicas()] == ["running", "running"]
    assert [r["state"] for r in dep.replicas()] == ["undeployed", "undeployed"]
