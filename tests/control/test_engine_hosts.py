"""The orchestrators keep three engine hosts (a primary, its standby and a spare), no more for long, and
the last one to leave stops them.

A ZooKeeper pause ends every session; the engine hosts register again one
by one once it answers, and the leading orchestrator, counting them
meanwhile, may find one missing and start another (one run in two here).
Each pause then left one more idle spare running. The first test makes that
surplus without the race: a fourth engine host started beside the three,
as an orchestrator does in it. Asserted: one spare stops (neither the
primary nor its standby), three stay, as processes and in the registry.

The second stops ZooKeeper past every session and starts it again with its
data: the leading orchestrator, leading again, counted the engine hosts
before they registered again and started three more (stopped as spares
seconds later). Asserted: it starts none that did not stop.

The third connects a client right after the primary was killed, while
the registry still names it: ``Engine.connect`` (and every command built on
it) said ENGINE_NOT_FOUND at once. Asserted: it connects to the new
primary. These three share one cluster.

The last stops the last orchestrator right after the other one was
killed, as the chaos test's last fault did: the dead one stays registered
until its session ends (2 s), and the leaving one, looking once, saw it and
left the engine hosts running (they stop by themselves 60 s later).
Asserted: they stop within seconds.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from chaos_harness import Cluster

import sparkcep as cep
from harness import wait
from sparkcep.control import host as engine_host
from sparkcep.control import tree
from sparkcep.control.orchestrator import REFRESH_S, REGISTER_AGAIN_S

SETTLE_S = 60.0  # for the cluster to start, and to be back to three engine hosts
STOPS_S = 10.0  # the engine hosts stop within this long of the last orchestrator's SIGTERM
STAYS_S = 6.0  # three of the orchestrator's counts: no engine host is started or stopped meanwhile


def whole(cluster: Cluster) -> bool:
    """A primary with a standby of its era, and three engine hosts, registered and running."""
    engine, standby = cluster.primary(), cluster.standby()
    return bool(engine and standby and standby.get("role") == "standby" and standby.get("era") == engine.get("era")
                and len(cluster.registry.children(tree.HOSTS)) == 3 and len(cluster.engine_host_pids()) == 3)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One cluster for the tests that leave it whole (the spare stops; a fail-over is one more era)."""
    cluster = Cluster(tmp_path_factory.mktemp("hosts"), workers=0)
    try:
        yield cluster
    finally:
        left = cluster.stop()
    assert not left["processes"] and not left["shm"], left


def test_an_engine_host_beyond_three_is_a_spare_that_stops(shared):
    cluster, extra = shared, None
    try:
        wait(lambda: whole(cluster), "three engine hosts", timeout=SETTLE_S, every=0.2)
        primary, standby = cluster.primary()["pid"], cluster.standby()["pid"]
        extra = engine_host.spawn(cluster.zk, str(cluster.token_file), "h-extra")
        wait(lambda: len(cluster.registry.children(tree.HOSTS)) == 4, "a fourth engine host", timeout=SETTLE_S)
        try:
            wait(lambda: whole(cluster), "three engine hosts again", timeout=SETTLE_S, every=0.2)
        except AssertionError as e:
            raise AssertionError(f"{e}: registered {cluster.registry.children(tree.HOSTS)}\n{cluster.story(40)}") from None
        hosts = cluster.engine_host_pids()
        assert {primary, standby} <= hosts
        deadline = time.monotonic() + STAYS_S
        while time.monotonic() < deadline:
            assert whole(cluster) and cluster.engine_host_pids() == hosts, cluster.story(40)
            time.sleep(0.2)
    finally:
        if extra is not None:
            extra.kill()
            extra.wait(10)


def test_after_a_zookeeper_outage_the_leader_starts_no_engine_host_anew(shared):
    cluster = shared
    wait(lambda: whole(cluster), "three engine hosts", timeout=SETTLE_S, every=0.2)
    hosts, starts, leads = cluster.engine_host_pids(), said(cluster, "registered: starting"), said(cluster, " leads ")
    cluster.fault("outage")
    wait(lambda: said(cluster, " leads ") > leads, "an orchestrator to lead again", timeout=SETTLE_S)
    time.sleep(REGISTER_AGAIN_S + 2 * REFRESH_S)  # its first counts of the engine hosts
    wait(lambda: whole(cluster), "three engine hosts after the outage", timeout=SETTLE_S, every=0.2)
    started, stopped = said(cluster, "registered: starting") - starts, hosts - cluster.engine_host_pids()
    assert started <= len(stopped), (started, stopped, cluster.story(40))


def said(cluster: Cluster, text: str) -> int:
    """How many lines of the orchestrators' logs say ``text``."""
    return sum(line.count(text) for log in cluster.work.glob("o*.log")
               for line in log.read_text(errors="replace").splitlines())


def test_a_client_connecting_during_a_fail_over_reaches_the_new_primary(shared):
    cluster = shared
    wait(lambda: whole(cluster), "three engine hosts", timeout=SETTLE_S, every=0.2)
    era = cluster.primary()["era"]
    killed = cluster.fault("primary")
    assert cluster.primary()["name"] in killed  # still named: its registry session lasts 2 s more
    with cep.Engine.connect(cluster.zk, token_file=str(cluster.token_file)) as engine:
        assert engine.instance_managers() == []  # answered by the new primary
    now = cluster.primary()
    assert now["name"] not in killed and now["era"] == era + 1, (killed, now)


def test_the_last_orchestrator_stops_the_engine_hosts_right_after_the_leader_was_killed(tmp_path):
    cluster = Cluster(tmp_path, workers=0)
    try:
        wait(lambda: whole(cluster), "three engine hosts", timeout=SETTLE_S, every=0.2)
        hosts = cluster.engine_host_pids()
        leader = cluster.leader()
        cluster.procs[leader].kill()
        cluster.procs[leader].wait(10)
        last = next(name for name in cluster.procs if name.startswith("o") and name != leader)
        cluster.procs[last].terminate()
        assert cluster.procs[last].wait(STOPS_S) == 0
        try:
            wait(lambda: not cluster.engine_host_pids() & hosts, "the engine hosts to stop", timeout=STOPS_S)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{cluster.story(20)}") from None
    finally:
        left = cluster.stop()
    assert not left["processes"] and not left["shm"], left


def test_the_last_orchestrator_stops_an_engine_host_it_started_that_has_not_registered_yet(tmp_path):
    """Stopped while a replacement engine host was starting, the last orchestrator told the registered ones
    to stop; the starting one registered after, founded a data path of its own and ran on for 60 s."""
    cluster = Cluster(tmp_path, workers=0)
    try:
        wait(lambda: whole(cluster), "three engine hosts", timeout=SETTLE_S, every=0.2)
        hosts = cluster.engine_host_pids()
        spare = next(d for n in cluster.registry.children(tree.HOSTS)
                     if (d := cluster.host(n)) and d.get("role") == "spare")
        os.kill(spare["pid"], signal.SIGKILL)
        wait(lambda: cluster.engine_host_pids() - hosts, "a replacement engine host to start", timeout=SETTLE_S,
             every=0.02)
        assert len(cluster.registry.children(tree.HOSTS)) < 3  # it has not registered yet
        for name, process in cluster.procs.items():
            if name.startswith("o"):
                process.terminate()
        try:
            wait(lambda: not cluster.engine_host_pids(), "the engine hosts to stop", timeout=STOPS_S)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{cluster.story(20)}") from None
    finally:
        left = cluster.stop()
    assert not left["processes"] and not left["shm"], left
