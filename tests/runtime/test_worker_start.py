"""Starting workers: one still compiling kernels is waited for, one stuck or dead is named within seconds."""

import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

import sparkcep as cep
from sparkcep import auth
from sparkcep.control import tree
from sparkcep.control.registry import ZkRegistry
from sparkcep.runtime import worker_start
from sparkcep.runtime.wiring import machine_id
from sparkcep.runtime.worker_start import Starting, wait_ready


def fake(script: str) -> subprocess.Popen:
    """A process that speaks a starting worker's stdout protocol as ``script`` says."""
    return subprocess.Popen([sys.executable, "-c", "import sys, time\n" + script], stdout=subprocess.PIPE)


def ctrl_c_delivered() -> None:
    """In the child, before exec: SIGINT as in a terminal's foreground process (a test run in the background
    has it ignored, and an ignored SIGINT is inherited)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_worker_compiling_kernels_says_so_every_second_and_stops_within_seconds_of_sigterm_or_ctrl_c(
        tmp_path, sig):
    """With numba's cache cold the warm-up compiles for a minute or more: the worker says it is alive every
    second meanwhile. A signal was only noted until the warm-up ended (README: a worker told to stop stops
    within seconds)."""
    token = auth.write(tmp_path / "token", auth.generate())
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cold-cache"))
    p = subprocess.Popen([sys.executable, "-m", "sparkcep", "worker", "--token-file", str(token)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, preexec_fn=ctrl_c_delivered)
    try:
        s = Starting(p, "im-cold")
        deadline = time.monotonic() + 60
        while not s.doing.startswith("warming up kernels step 1/") and time.monotonic() < deadline:
            worker_start._hear(s)
        lines, compiling = [s.doing], time.monotonic() + 3.5  # into numba's compiling
        while time.monotonic() < compiling:
            worker_start._hear(s)
            if s.doing not in lines:
                lines.append(s.doing)
        assert s.info is None, "the cold warm-up ended early: the cache was not cold"
        assert len(lines) >= 3 and all(line.startswith("warming up kernels") for line in lines), lines
        p.send_signal(sig)
        t0 = time.monotonic()
        code = p.wait(30)
        took, err = time.monotonic() - t0, p.stderr.read().decode()
        assert code == 128 + sig and took < 5 and "Traceback" not in err, (code, took, err)
    finally:
        p.kill()
        p.wait()


def free_port() -> int:
    """A loopback port where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
@pytest.mark.parametrize("waits_for", ["unreachable-registry", "dead-predecessors-session"])
def test_a_worker_joining_its_cluster_stops_within_seconds_of_sigterm_or_ctrl_c(request, tmp_path, sig, waits_for):
    """The signal was only noted until READY: a worker joining a registry that does not answer went on for
    10 s and exited 1, one waiting out the session of a dead worker of its name went on for up to 60 s. It
    stops as a READY one does: within seconds, exit code 0, no traceback, its member document not written."""
    token = auth.generate()
    token_file = auth.write(tmp_path / "token", token)
    registry = None
    if waits_for == "unreachable-registry":
        zk, says = f"127.0.0.1:{free_port()}/nobody", "joining the cluster"
    else:  # a session of this test holds the document of a worker of the same name that ended here
        hosts, root = request.getfixturevalue("zookeeper"), f"/joining-{uuid.uuid4().hex[:8]}"
        zk, says = f"{hosts}{root}", "waiting for the ZooKeeper session"
        registry = ZkRegistry(hosts, root, session_timeout=2.0, token=token)
        ended = subprocess.Popen([sys.executable, "-c", "pass"])
        ended.wait()
        registry.keep(tree.member("w"), {"name": "w", "pid": ended.pid, "host": machine_id()})
    p = subprocess.Popen([sys.executable, "-m", "sparkcep", "worker", "--name", "w", "--zk", zk, "--token-file",
                          str(token_file)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=ctrl_c_delivered)
    try:
        s = Starting(p, "im-joining")
        deadline = time.monotonic() + 60
        while not s.doing.startswith(says) and time.monotonic() < deadline:
            worker_start._hear(s)
        time.sleep(1)  # into the wait
        assert s.info is None and p.poll() is None, s.doing
        p.send_signal(sig)
        t0 = time.monotonic()
        try:
            code = p.wait(10)
        except subprocess.TimeoutExpired:
            code = None  # still joining
        took = time.monotonic() - t0
        assert code == 0 and took < 5, (code, took, s.doing)
        assert "Traceback" not in p.stderr.read().decode()
        if registry is not None:  # the name is still the dead one's
            assert registry.get(tree.member("w"))["pid"] == ended.pid
    finally:
        p.kill()
        p.wait()
        p.stdout.close()
        p.stderr.close()
        if registry is not None:
            registry.close()


def test_a_worker_that_keeps_talking_is_waited_for_past_the_stall_limit(monkeypatch):
    monkeypatch.setattr(worker_start, "STALL_S", 1.0)
    p = fake("for i in range(8):\n    print(f'STARTING warming up kernels step {i}/8', flush=True); time.sleep(0.4)\n"
             "print('READY {\"address\": \"127.0.0.1:1\"}', flush=True)")
    told = []
    (info,) = wait_ready([Starting(p, "instance manager im-slow")], tell=lambda *a: told.append(a))
    assert info == {"address": "127.0.0.1:1"}
    p.wait(5)


def test_the_first_run_hint_comes_only_when_starting_takes_longer_than_loading_cached_kernels(monkeypatch):
    """Loading kernels from numba's cache takes seconds when many workers start at once: that wait is told
    as it is; only a longer one (compiling, a machine's first run) adds the hint about `sparkcep warm-up`."""
    monkeypatch.setattr(worker_start, "TELL_EVERY_S", 0.3)
    monkeypatch.setattr(worker_start, "COMPILING_AFTER_S", 1.2)
    p = fake("for i in range(8):\n    print(f'STARTING warming up kernels step {i}/8', flush=True); time.sleep(0.25)\n"
             "print('READY {\"address\": \"127.0.0.1:1\"}', flush=True)")
    told = []
    wait_ready([Starting(p, "instance manager im-slow")], tell=lambda fmt, *a: told.append(fmt % a))
    p.wait(5)
    hinted = ["sparkcep warm-up" in t for t in told]
    assert all(t.startswith("waiting for instance manager im-slow to start: warming up kernels") for t in told)
    assert True in hinted and False in hinted and hinted.index(True) > 0, told


def test_a_silent_worker_is_named_as_stuck_within_seconds(monkeypatch):
    monkeypatch.setattr(worker_start, "STALL_S", 1.5)
    p = fake("print('STARTING warming up kernels step 2/8', flush=True); time.sleep(60)")
    t0 = time.monotonic()
    with pytest.raises(cep.EngineError) as e:
        wait_ready([Starting(p, "instance manager im-7 (cpu 1)")], tell=lambda *a: None)
    assert e.value.code == "WORKER_STUCK"
    assert "im-7 (cpu 1)" in str(e.value) and "step 2/8" in str(e.value)
    assert time.monotonic() - t0 < 4
    assert p.wait(5) != 0  # killed


def test_a_worker_that_dies_at_start_is_named_at_once():
    p = fake("print('STARTING warming up kernels', flush=True); sys.exit(3)")
    t0 = time.monotonic()
    with pytest.raises(cep.EngineError) as e:
        wait_ready([Starting(p, "instance manager im-3 (cpu 0)")], tell=lambda *a: None)
    assert e.value.code == "WORKER_START" and "im-3 (cpu 0)" in str(e.value) and "code 3" in str(e.value)
    assert time.monotonic() - t0 < 3


@pytest.mark.parametrize("listen", ["127.0.0.1:99999", "127.0.0.1"])
def test_a_worker_refuses_an_address_it_cannot_listen_on_in_one_line(tmp_path, listen):
    """``--listen 127.0.0.1:99999`` ended in an OverflowError traceback."""
    token = auth.write(tmp_path / "token", auth.generate())
    out = subprocess.run([sys.executable, "-m", "sparkcep", "worker", "--token-file", str(token), "--once",
                          "--listen", listen], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines() == [f"sparkcep worker: listen={listen!r}: expected HOST:PORT with a port "
                                               "0-65535 (0: any free port), e.g. '127.0.0.1:0'; other hosts reach "
                                               "it only on an explicit address such as '0.0.0.0:PORT'"]


def test_an_address_taken_is_refused_before_the_kernels_are_compiled(tmp_path):
    """With numba's cache cold a worker compiled its kernels for a minute or more, then said its address was
    taken (or malformed)."""
    token = auth.write(tmp_path / "token", auth.generate())
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cold-cache"))
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "sparkcep", "worker", "--token-file", str(token), "--once",
                              "--listen", f"127.0.0.1:{port}"], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 1 and "Address already in use" in out.stderr, out.stderr
    assert "warming up" not in out.stdout and time.monotonic() - t0 < 20, out.stdout


@pytest.mark.parametrize("cpus,says", [("abc", "expected CPUs as in 3, 0-3 or 0-1,4"), ("1-0", "each range ascending"),
                                       ("0-99999999999", "numbers up to 65,535"), (",", "at least one CPU")])
def test_a_worker_refuses_a_cpu_list_it_cannot_read_in_one_line(tmp_path, cpus, says):
    """``--cpus abc`` ended in "invalid literal for int() with base 10: 'abc'", ``--cpus 1-0`` in "cannot pin
    to cpu : [Errno 22]", and a typo'd range was expanded into a list of every number in it."""
    token = auth.write(tmp_path / "token", auth.generate())
    out = subprocess.run([sys.executable, "-m", "sparkcep", "worker", "--token-file", str(token), "--once",
                          "--cpus", cpus], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.strip().splitlines()[-1].startswith(
        "sparkcep worker: error: argument --cpus: ") and says in out.stderr, out.stderr
