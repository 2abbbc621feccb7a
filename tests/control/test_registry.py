"""The registry: the same assertions on a real ZooKeeper server and on the embedded backend.

``open_session`` (conftest.py) runs each test on both; the tests about a
process killed with SIGKILL, a server going away, and ``sparkcep
zookeeper`` itself need the real server. Every wait is bounded.
"""

from __future__ import annotations

import logging
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from zk_harness import ROOT, SESSION_TIMEOUT, Holder, Recorder, expire_session

from sparkcep import auth
from sparkcep.control.registry import MAX_DOCUMENT, RegistryError, State, ZkRegistry, open_registry
from sparkcep.control.zookeeper import ZooKeeperError, ZooKeeperServer, free_port

MARGIN = 1.5  # seconds beyond the session timeout for the server to notice, on 2 busy cores


def _code(call) -> str:
    with pytest.raises(RegistryError) as err:
        call()
    return err.value.code


def test_documents_round_trip(open_session):
    r = open_session()
    doc = {"name": "q1", "n": 3, "ratio": 0.25, "tags": ["a", "é"], "nested": {"ok": True, "none": None}}
    assert r.create("/deployments/d1", doc) == "/deployments/d1"
    assert r.get("/deployments/d1") == doc
    assert r.get("/deployments") == {}  # made as a parent
    assert r.get("/missing") is None
    r.set("/deployments/d1", {"name": "q1", "n": 4})
    r.set("/deployments/d2/bins", {"0": 1})  # set creates, parents too
    assert r.get("/deployments/d1") == {"name": "q1", "n": 4}
    assert r.children("/deployments") == ["d1", "d2"] and r.children("/nowhere") == []
    first = r.create("/queue/item-", {}, sequence=True)
    second = r.create("/queue/item-", {}, sequence=True)
    assert re.fullmatch(r"/queue/item-\d{10}", first) and second > first
    assert open_session().get("/deployments/d1") == {"name": "q1", "n": 4}  # another session sees it

    assert _code(lambda: r.create("/deployments/d1", {})) == "NODE_EXISTS"
    assert _code(lambda: r.delete("/deployments")) == "NOT_EMPTY"
    assert _code(lambda: r.delete("/missing")) == "NO_NODE"
    assert _code(lambda: r.delete("/missing", recursive=True)) == "NO_NODE"
    r.create("/members/im-1", {}, ephemeral=True)
    assert _code(lambda: r.create("/members/im-1/x", {})) == "EPHEMERAL_PARENT"
    for bad in ("members", "/a//b", "/a/", "/a/../b", "/a\x00b"):
        assert _code(lambda: r.get(bad)) == "BAD_PATH"
    assert _code(lambda: r.set("/x", ["not", "a", "dict"])) == "BAD_DOCUMENT"
    assert _code(lambda: r.set("/x", {"f": float("nan")})) == "BAD_DOCUMENT"
    assert _code(lambda: r.set("/x", {"blob": "x" * MAX_DOCUMENT})) == "DOCUMENT_TOO_LARGE"
    with pytest.raises(RegistryError) as err:
        r.create("/deployments/d1", {})
    assert err.value.path == "/deployments/d1" and "create /deployments/d1" in str(err.value)

    r.delete("/deployments", recursive=True)
    assert r.get("/deployments") is None and r.children("/") == ["members", "queue"]


def test_watches_fire_on_changes(open_session):
    a, b = open_session(), open_session()
    docs, kids = Recorder(), Recorder()
    watch = b.watch("/deployments/d1", docs)
    b.watch_children("/members", kids)
    assert docs.values == [None] and kids.values == [[]]  # called once at registration, node missing
    a.create("/deployments/d1", {"v": 1})
    docs.wait_for({"v": 1})
    a.set("/deployments/d1", {"v": 2})
    docs.wait_for({"v": 2})
    a.create("/members/im-1", {"cpus": [0]}, ephemeral=True)
    a.create("/members/im-2", {"cpus": [1]})
    kids.wait_for(["im-1", "im-2"])
    a.delete("/members/im-2")
    kids.wait_for(["im-1"], since=2)
    a.delete("/deployments/d1")
    docs.wait_for(None, since=1)
    a.create("/deployments/d1", {"v": 3})  # the watch survives deletion and re-creation
    docs.wait_for({"v": 3})
    a.close()  # its ephemeral member goes with it
    kids.wait_for([], since=1)
    watch.cancel()
    seen = len(docs.values)
    c = open_session()
    c.set("/deployments/d1", {"v": 4})
    time.sleep(0.3)
    assert len(docs.values) == seen and docs.last == {"v": 3}  # nothing after cancel()


def test_transaction_is_all_or_nothing(open_session):
    r = open_session()
    with r.transaction() as t:
        t.create("/deployments/d1", {"query": "q1"})
        t.create("/deployments/d1/placement/sq0-0", {"member": "im-1"})
        t.create("/deployments/d1/placement/sq0-", {"member": "im-2"}, sequence=True)
        t.set("/bins/d1", {"table": [0, 1]})
    assert t.paths[:2] == ["/deployments/d1", "/deployments/d1/placement/sq0-0"]
    assert re.fullmatch(r"/deployments/d1/placement/sq0-\d{10}", t.paths[2])
    assert r.children("/deployments/d1/placement") == sorted(["sq0-0", t.paths[2].rsplit("/", 1)[1]])
    assert r.get("/bins/d1") == {"table": [0, 1]}

    failing = [("create", "/deployments/d1", "NODE_EXISTS"),  # last operation fails
               ("delete", "/deployments/d9", "NO_NODE"),
               ("create", "/members/e/child", "EPHEMERAL_PARENT")]
    r.create("/members/e", {}, ephemeral=True)
    for kind, path, code in failing:
        t = r.transaction().create("/deployments/d2", {"query": "q2"}).create("/fresh/parent/node", {})
        t.set("/bins/d1", {"table": [1, 0]}).delete("/deployments/d1/placement/sq0-0")
        getattr(t, kind)(*([path, {}] if kind == "create" else [path]))
        with pytest.raises(RegistryError) as err:
            t.commit()
        assert err.value.code == code and err.value.path == path
        assert r.get("/deployments/d2") is None and r.get("/fresh") is None  # nor the parents it made
        assert r.get("/bins/d1") == {"table": [0, 1]} and r.get("/deployments/d1/placement/sq0-0") is not None
    with pytest.raises(ZeroDivisionError):
        with r.transaction() as t:
            t.create("/deployments/d3", {})
            1 / 0  # an exception inside the block commits nothing
    assert r.get("/deployments/d3") is None


def test_ephemeral_nodes_vanish_when_their_session_closes(open_session):
    a, b = open_session(), open_session()
    kids = Recorder()
    a.create("/members/im-1", {"pid": os.getpid()}, ephemeral=True)
    a.create("/members/im-2", {})
    b.watch_children("/members", kids)
    assert kids.values == [["im-1", "im-2"]]
    closed = time.monotonic()
    a.close()
    kids.wait_for(["im-2"], timeout=5)
    assert time.monotonic() - closed < 1.5  # at once, not after the session timeout (2 s)
    assert b.get("/members/im-1") is None and b.get("/members/im-2") == {}
    assert _code(lambda: a.get("/members")) == "REGISTRY_CLOSED"
    assert a.state is State.LOST


def test_ephemeral_node_vanishes_when_its_process_is_killed(zookeeper):
    root = f"/tests/kill-{os.getpid()}-{time.monotonic_ns()}"
    with ZkRegistry(zookeeper, root, session_timeout=SESSION_TIMEOUT) as r, Holder(zookeeper, root, "member") as holder:
        kids = Recorder()
        r.watch_children("/members", kids)
        assert kids.values == [["child"]]
        killed = holder.kill()
        kids.wait_for([], timeout=SESSION_TIMEOUT + MARGIN + 5)
        gone = time.monotonic() - killed
        print(f"ephemeral node removed {gone:.2f} s after SIGKILL (session timeout {SESSION_TIMEOUT} s)")
        assert SESSION_TIMEOUT * 0.5 < gone < SESSION_TIMEOUT + MARGIN


def _leaders(leases) -> list:
    return [lease for lease in leases if lease.is_leader]


def test_lease_has_one_holder_and_passes_on_when_it_closes(open_session):
    sessions = [open_session() for _ in range(3)]
    gained = [Recorder() for _ in sessions]
    leases = [s.lease("orchestrator", f"orch-{i}") for i, s in enumerate(sessions)]
    assert sessions[0].leader("orchestrator") is None
    for lease, recorder in zip(leases, gained):
        lease.contend(on_gained=recorder)
    gained[0].wait_for(None, timeout=5)
    time.sleep(0.2)
    assert _leaders(leases) == [leases[0]] and [len(g.values) for g in gained] == [1, 0, 0]
    assert sessions[2].leader("orchestrator") == "orch-0"

    started = time.monotonic()
    sessions[0].close()  # the holder goes: the next contender takes the lease
    gained[1].wait_for(None, timeout=5)
    print(f"lease handed over {time.monotonic() - started:.3f} s after its holder closed")
    assert time.monotonic() - started < 5
    assert _leaders(leases) == [leases[1]] and sessions[2].leader("orchestrator") == "orch-1"
    leases[1].release()  # a release hands it on too
    gained[2].wait_for(None, timeout=5)
    assert _leaders(leases) == [leases[2]] and sessions[1].leader("orchestrator") == "orch-2"
    with pytest.raises(RegistryError) as err:
        leases[1].acquire(timeout=0.3)
    assert err.value.code == "LEASE_TIMEOUT" and "orch-2" in str(err.value)
    assert len(sessions[1].children("/leases/orchestrator")) == 1  # the timed-out contender left the queue


def test_lease_passes_on_when_its_holders_process_is_killed(zookeeper):
    root = f"/tests/lease-kill-{os.getpid()}-{time.monotonic_ns()}"
    with ZkRegistry(zookeeper, root, session_timeout=SESSION_TIMEOUT) as r, Holder(zookeeper, root, "lease") as holder:
        assert r.leader("orchestrator") == "child"
        gained = Recorder()
        lease = r.lease("orchestrator", "standby")
        lease.contend(on_gained=gained)
        time.sleep(0.2)
        assert not lease.is_leader and not gained.values
        killed = holder.kill()
        gained.wait_for(None, timeout=10)
        took = time.monotonic() - killed
        print(f"lease taken over {took:.2f} s after its holder's SIGKILL (session timeout {SESSION_TIMEOUT} s)")
        assert took < 5 and lease.is_leader and r.leader("orchestrator") == "standby"


def test_expired_session_tells_its_owner_and_drops_its_lease(open_session):
    a, b = open_session(), open_session()
    states, lost, gained = Recorder(), Recorder(), Recorder()
    a.add_listener(states)
    lease = a.lease("orchestrator", "a", on_lost=lost).acquire(timeout=5)
    a.create("/members/a", {}, ephemeral=True)
    standby = b.lease("orchestrator", "b")
    standby.contend(on_gained=gained)
    assert lease.is_leader and not standby.is_leader

    expire_session(a)
    lost.wait_for(None, timeout=5)
    gained.wait_for(None, timeout=5)
    assert not lease.is_leader and standby.is_leader and b.leader("orchestrator") == "b"
    states.wait_for(State.CONNECTED)
    assert states.values[states.values.index(State.LOST):] == [State.LOST, State.CONNECTED]
    assert b.get("/members/a") is None  # its ephemeral node went with it
    a.create("/members/a", {}, ephemeral=True)  # the new session works: the owner re-registers
    lease.contend()
    assert b.leader("orchestrator") == "b" and len(b.children("/leases/orchestrator")) == 2


def test_sealed_documents_are_refused_when_tampered(open_session):
    token, other = auth.generate(), auth.generate()
    r = open_session()
    spec = {"query": "q1", "plan": "gASVAAAA", "parallelism": 2, "ratio": 0.1, "name": "é"}
    r.set("/deployments/d1", auth.seal(spec, token))
    stored = r.get("/deployments/d1")
    assert token not in str(stored) and auth.unseal(stored, token, "deployment d1") == spec

    flipped = stored[auth.SEAL][:-1] + ("1" if stored[auth.SEAL].endswith("0") else "0")
    for doc, why in [({**stored, "parallelism": 3}, "seal does not match"),
                     ({**stored, "extra": 1}, "seal does not match"),
                     (spec, "not sealed"),
                     ({**stored, auth.SEAL: flipped}, "seal does not match"),
                     ({**stored, auth.SEAL: None}, "not sealed")]:
        r.set("/deployments/d2", doc)
        with pytest.raises(auth.AuthError) as err:
            auth.unseal(r.get("/deployments/d2"), token, "deployment d2")
        assert err.value.code == "UNAUTHENTICATED" and why in str(err.value) and "deployment d2" in str(err.value)
    with pytest.raises(auth.AuthError) as err:
        auth.unseal(stored, other)  # sealed with another cluster's token
    assert err.value.code == "UNAUTHENTICATED"
    with pytest.raises(auth.AuthError) as err:
        auth.seal({"leak": token}, token)
    assert err.value.code == "TOKEN_IN_DOCUMENT"
    assert auth.unseal(auth.seal(stored, other), other) == spec  # resealing replaces the seal


def test_open_registry_parses_its_address(zookeeper):
    for bad in ("zk:/127.0.0.1:2181", "zookeeper://h:1/x", "zk://127.0.0.1/x", "zk://h:99999/x", "zk://h:1,/x",
                "", "embeded", "zk://h:1/a//b"):
        with pytest.raises(RegistryError) as err:
            open_registry(bad)
        assert err.value.code in ("BAD_ADDRESS", "BAD_PATH"), bad
        assert "zk://HOST:PORT" in str(err.value) or err.value.code == "BAD_PATH"
    with open_registry(f"zk://{zookeeper}/tests/open", session_timeout=SESSION_TIMEOUT) as r:
        assert isinstance(r, ZkRegistry) and r.address == f"zk://{zookeeper}/tests/open"
        r.set("/x", {"ok": 1})
        assert r.get("/x") == {"ok": 1}
    with open_registry("embedded") as r:
        assert r.address == "embedded" and r.children("/") == []
    with pytest.raises(RegistryError) as err:
        open_registry("embedded", sesion_timeout=1)
    assert err.value.code == "UNKNOWN_ARGUMENT"
    started = time.monotonic()
    with pytest.raises(RegistryError) as err:
        open_registry(f"zk://127.0.0.1:{free_port()}/x", timeout=1)
    assert err.value.code == "REGISTRY_UNREACHABLE" and time.monotonic() - started < 5


def test_an_unreachable_server_is_said_once_not_per_attempt(caplog):
    """Connecting to no server raises REGISTRY_UNREACHABLE, without the ZooKeeper client's warning per
    failed attempt before it (a dozen lines a connect, printed by any program without logging set up)."""
    with caplog.at_level(logging.INFO), pytest.raises(RegistryError) as err:
        ZkRegistry(f"127.0.0.1:{free_port()}", "/x", timeout=1.5)
    assert err.value.code == "REGISTRY_UNREACHABLE"
    assert not [r for r in caplog.records if r.name.startswith("kazoo") and r.levelno >= logging.WARNING], \
        [r.getMessage() for r in caplog.records][:3]


def test_server_going_away_suspends_then_fails_naming_the_operation(tmp_path, caplog):
    """SUSPENDED: the lease is no longer assumed held; operations retry up to the timeout, then fail. The
    loss is logged once, not as the ZooKeeper client's line per reconnection attempt (a dozen in 10 s,
    printed by any program without logging set up); so is the new session started while the server stays
    away (one every 3 s here), and the reconnection names the whole outage."""
    server = ZooKeeperServer(data_dir=tmp_path / "zk")
    try:
        hosts = server.start(timeout=60)
        r = ZkRegistry(hosts, "/tests/away", session_timeout=SESSION_TIMEOUT, timeout=1.5)
        states = Recorder()
        r.add_listener(states)
        lease = r.lease("orchestrator", "me").acquire(timeout=5)
        caplog.clear()  # the server's start is logged by the client probing it
        with caplog.at_level(logging.INFO):
            server.stop()  # its data dir is the test's: kept
            stopped = time.monotonic()
            states.wait_for(State.SUSPENDED, timeout=10)
            assert not lease.is_leader
            started = time.monotonic()
            with pytest.raises(RegistryError) as err:
                r.get("/members")
            assert err.value.code == "REGISTRY_UNREACHABLE" and "get /members" in str(err.value)
            assert time.monotonic() - started < 1.5 + 3
            time.sleep(max(0.0, stopped + 3 * (SESSION_TIMEOUT + 1) - time.monotonic()))
            away = time.monotonic() - stopped
            server.start(timeout=60)
            states.wait_for(State.CONNECTED, timeout=30)
        said = [(rec.name, rec.getMessage()) for rec in caplog.records if rec.levelno >= logging.WARNING]
        assert not [m for name, m in said if name.startswith("kazoo")], said
        mine = [m for _, m in said if m.startswith(f"registry zk://{hosts}/tests/away: ")]  # no other test's
        assert [m for m in mine if "connection lost" in m] == \
            [f"registry zk://{hosts}/tests/away: connection lost (SUSPENDED); reconnecting"], said
        assert len([m for m in mine if "starting a new session" in m]) == 1, said
        again = [m for rec in caplog.records if "connected again" in (m := rec.getMessage()) and hosts in m]
        assert len(again) == 1 and float(again[0].split(" after ")[1].rstrip(" s")) >= away, again
        r.close()
    finally:
        server.stop()


def test_a_reconnection_as_a_new_session_starts_is_told_after_that_sessions_loss(tmp_path):
    """The watchdog starts a new session once the server has been away longer than the session timeout. A
    reconnection at that very moment (kazoo's CONNECTED, on its connection thread) is told after the new
    session's LOST, so the registry ends CONNECTED (told LOST last, its owners would wait for a CONNECTED
    that had come), and the watchdog does not go on starting sessions for an outage that is over."""
    server = ZooKeeperServer(data_dir=tmp_path / "zk")
    try:
        hosts = server.start(timeout=60)
        r = ZkRegistry(hosts, "/tests/race", session_timeout=SESSION_TIMEOUT, timeout=1.5)
        states, reconnections = Recorder(), []
        r.add_listener(states)
        tell = r._set_state

        def slow_to_tell(state):  # the window the race needs, made wide
            if state is State.LOST:
                time.sleep(0.3)
            tell(state)

        class ReconnectAtNewSession(logging.Handler):
            def emit(self, record):
                if "starting a new session" in record.getMessage():
                    kazoo = threading.Thread(target=r._on_kazoo_state, args=("CONNECTED",))
                    kazoo.start()
                    kazoo.join(0.5)
                    reconnections.append(kazoo)

        r._set_state = slow_to_tell
        handler = ReconnectAtNewSession()
        logger = logging.getLogger("sparkcep.control.registry")
        logger.addHandler(handler)
        try:
            server.stop()
            states.wait_for(State.LOST, timeout=SESSION_TIMEOUT + 10)
            reconnections[0].join(5)
            time.sleep(SESSION_TIMEOUT + 2)  # the watchdog, counting on, would start another session by now
            assert r.state is State.CONNECTED and states.values[-2:] == [State.LOST, State.CONNECTED], states.values
            assert len(reconnections) == 1
        finally:
            logger.removeHandler(handler)
            r.close()
    finally:
        server.stop()


def _read_line(stream, timeout: float) -> str:
    ready, _, _ = select.select([stream], [], [], timeout)
    return stream.readline() if ready else ""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead
        return f.read().split(") ")[1][0] != "Z"


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _pid_alive(pid)


def _start_command() -> tuple[subprocess.Popen, str, int, str]:
    """``sparkcep zookeeper`` as a process: it, the address it prints, its Java pid and data dir."""
    process = subprocess.Popen([sys.executable, "-m", "sparkcep", "zookeeper"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=ROOT)
    line = _read_line(process.stdout, 60)
    match = re.search(r"zk://(127\.0\.0\.1:\d+) \(Java pid (\d+); data (\S+),", line)
    if not match:
        process.kill()
        raise AssertionError(f"no address printed: {line!r} {process.stderr.read()[-2000:]}")
    return process, match[1], int(match[2]), match[3]


def test_zookeeper_command_serves_and_stops_cleanly_on_sigterm():
    process, address, java, data = _start_command()
    try:
        assert os.path.isdir(data) and _pid_alive(java)
        with ZkRegistry(address, "/tests/command", session_timeout=SESSION_TIMEOUT) as r:
            r.set("/hello", {"from": "test"})
            assert r.get("/hello") == {"from": "test"}
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=20)
        assert process.returncode == 0 and "stopping" in out
        assert err == ""  # its readiness probe's failed first attempts are not the user's concern
        assert not _pid_alive(java) and not os.path.exists(data)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


@pytest.mark.parametrize("argv, says", [(["--port", "99999"], "argument --port: must be from 0 to 65,535, got 99999"),
                                         (["--tick-ms", "0"], "argument --tick-ms: must be from 1 to 60,000, got 0")])
def test_zookeeper_command_refuses_a_port_or_tick_it_cannot_use(argv, says, capsys):
    """``--port 99999`` ended in an OverflowError traceback from bind(); ``--tick-ms 0`` in the JVM's exit."""
    from sparkcep import cli
    with pytest.raises(SystemExit) as done:
        cli.main(["zookeeper", *argv])
    assert done.value.code == 2 and says in capsys.readouterr().err


def test_zookeeper_command_killed_leaves_no_java_behind():
    process, _, java, _ = _start_command()
    try:
        process.kill()
        process.wait(10)
        assert _wait_gone(java, 15), "the Java server outlived its killed parent"
    finally:
        if _pid_alive(java):
            os.kill(java, signal.SIGKILL)


def test_zookeeper_server_refuses_clearly(tmp_path):
    with pytest.raises(ZooKeeperError) as err:
        ZooKeeperServer(java=str(tmp_path / "no-java")).start()
    assert err.value.code == "JAVA_NOT_FOUND" and "openjdk-17-jre-headless" in str(err.value)
    with pytest.raises(ZooKeeperError) as err:
        ZooKeeperServer(jar_dir=str(tmp_path)).start()
    assert err.value.code == "ZOOKEEPER_NOT_FOUND" and "apt-get install zookeeper" in str(err.value)
    assert "zookeeper.jar" in str(err.value)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ZooKeeperError) as err:
            ZooKeeperServer(port=taken.getsockname()[1]).start()
        assert err.value.code == "ZOOKEEPER_FAILED" and "in use" in str(err.value)
