"""The launcher the JVM plugin runs with each Spark executor: its instance managers, for the engine that is up.

``python -m sparkcep.spark.executor --executor-id ID [--instance-managers N] [--engine HOST:PORT]
[--zk zk://HOST:PORT/PATH] [--token-file PATH] [--listen loopback|host|HOST[:PORT]]``

What it does, each step logged on its stderr (the executor's stderr):

1. waits for an engine, looking every second: the one at ``--engine`` with
   the token of ``--token-file`` (default: the token file an engine of this
   machine writes), else the local engine (``$SPARKCEP_HOME/local.json``);
2. starts N ``sparkcep worker`` processes (default: one per CPU it may run
   on), each pinned to one CPU (executor k starts at CPU k*N, so executors
   of one host spread), listening on loopback, or on ``--listen``: ``host``
   (this host's address: ``$SPARK_LOCAL_IP`` or what its name resolves to)
   or ``HOST[:PORT]`` (worker i on PORT+i). An engine on another host cannot
   reach loopback: the launcher then says so and starts nothing;
3. registers each with the engine (``register_im``: the engine connects to
   it with its token and deploys to it from then on);
4. watches, every second: when the engine goes away (or another run answers
   at its address) its workers stop (they also exit by themselves when the
   engine drops them: ``--once``) and the launcher goes back to 1, so it
   serves the next engine with that engine's token; a worker that exits
   while its engine stays is started and registered again, after a pause
   that doubles up to a minute while failures repeat;
5. stops its workers (SIGTERM, SIGKILL after 5 s) and exits 0 when its
   standard input closes (the plugin's shutdown, or the executor JVM dying)
   or on SIGTERM. Workers get SIGTERM if the launcher dies (``PR_SET_PDEATHSIG``).

With ``--zk`` (``spark.sparkcep.zk``) there is no engine to wait for: its
workers join that cluster's registry themselves (``sparkcep worker --zk``,
holding the cluster's token, ``--token-file``, required) and the cluster's
engine host adopts them; steps 1, 3 and the engine watch of 4 are skipped,
a worker that exits is started again (under a new name: the engine host
adopts a name once) after the same pause, and 5 holds.

A bad option is logged and the launcher exits at once (``LISTEN``,
``OPTION``). Failures to find, reach or register with an engine are logged
(once per distinct reason while waiting) and retried. Neither touches the
executor: a misconfiguration never costs it its life.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sparkcep import auth
from sparkcep.gateway.client import EngineClient, resolve
from sparkcep.errors import EngineError, SparkcepError
from sparkcep.runtime.cluster import REPLY_TIMEOUT_S
from sparkcep.runtime.worker_start import Starting, start_worker, wait_ready

log = logging.getLogger("sparkcep.spark.executor")

POLL_S = 1.0       # how often the engine and the workers are looked at
MAX_PAUSE_S = 60.0  # longest pause between attempts that keep failing


@dataclass
class Target:
    """An engine to serve: its endpoint address, run id and token; or a cluster to join (``zk://...``, no run)."""

    address: str
    run: str
    token: str

    def __str__(self) -> str:
        if self.address.startswith("zk://"):
            return f"the cluster at {self.address}"
        return f"the engine at {self.address} (run {self.run})"


@dataclass
class Worker:
    """One ``sparkcep worker`` of this executor."""

    name: str
    cpu: int
    listen: str
    process: subprocess.Popen
    address: str = ""


def find_engine(engine: str | None, token_file: str | None, token: str | None = None) -> Target:
    """The engine named by ``engine`` (default: the local one), reachable with its token."""
    address = resolve(engine)
    with EngineClient(address, timeout=10, token=token, token_file=token_file) as client:
        run = client.hello()["engine"]
        return Target(address, run, client.token)


def listen_address(listen: str | None, index: int) -> str:
    """Where worker ``index`` listens: loopback, this host's address (``host``) or ``HOST[:PORT]``.

    EngineError ``LISTEN`` when ``listen`` is none of these, or this host has no address.
    """
    if not listen or listen == "loopback":
        return "127.0.0.1:0"
    if listen == "host":
        try:
            return f"{os.environ.get('SPARK_LOCAL_IP') or socket.gethostbyname(socket.gethostname())}:0"
        except OSError as e:
            raise EngineError(f"listen=host: this host's name {socket.gethostname()!r} has no address ({e}); "
                              "set SPARK_LOCAL_IP or spark.sparkcep.listen=HOST", "LISTEN") from None
    host, sep, port = listen.rpartition(":") if ":" in listen else (listen, ":", "0")
    if not host or not port.isdecimal() or int(port) + index > 65535:
        raise EngineError(f"listen {listen!r}: expected loopback, host or HOST[:PORT] (worker {index} listens on "
                          "PORT + its index, at most 65535)", "LISTEN")
    return f"{host}:{int(port) + index if int(port) else 0}"


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def on_this_host(host: str) -> bool:
    """Whether ``host`` is an address of this machine (loopback, or one a socket can bind here)."""
    if is_loopback(host):
        return True
    try:
        with socket.socket() as s:
            s.bind((socket.gethostbyname(host), 0))
        return True
    except OSError:
        return False


class Launcher:
    """The instance managers of one executor, serving one engine at a time, or members of the cluster ``zk``."""

    def __init__(self, executor: str, count: int | None, engine: str | None, token_file: str | None,
                 listen: str | None, zk: str | None = None):
        self.executor, self.engine, self.token_file, self.listen, self.zk = executor, engine, token_file, listen, zk
        self.cpus = sorted(os.sched_getaffinity(0))
        self.count = count or len(self.cpus)
        self.first_cpu = int(executor) * self.count if executor.isdecimal() else 0
        self.stopping = threading.Event()
        self.dir = tempfile.mkdtemp(prefix="sparkcep-executor-")  # mode 0700: the token copy lives here
        self.token_path = Path(self.dir) / "token"
        self.target: Target | None = None
        self.workers: list[Worker] = []
        self.started = 0  # workers started so far: one started again gets a name of its own
        self.pause, self.next_try = POLL_S, 0.0
        self._said = ""

    def run(self) -> None:
        """Serve engines until stopped (main thread: the workers' PR_SET_PDEATHSIG follows it)."""
        try:
            while not self.stopping.is_set():
                try:
                    if self.target is None:
                        self._serve_next()
                    else:
                        self._watch()
                except Exception as e:  # unforeseen (an OS error, a bug): logged, and the next turn starts over
                    log.exception("unexpected failure")
                    self._stop_workers()
                    self.target = None
                    self._failed(f"after {type(e).__name__}: {e}")
                self.stopping.wait(POLL_S)
        finally:
            self._stop_workers()
            shutil.rmtree(self.dir, ignore_errors=True)

    # --- engines -----------------------------------------------------------------------
    def _serve_next(self) -> None:
        if time.monotonic() < self.next_try:
            return
        target = self._find()
        if target is None:
            return
        auth.write(self.token_path, target.token)
        try:
            for i in range(self.count):
                self.workers.append(self._start(i))
            self._wait_ready(self.workers)
            self._register(target, self.workers)
        except SparkcepError as e:
            self._stop_workers()
            self._failed(f"cannot serve {target}: {e} [{e.code}]")
            return
        self.target, self.pause, self._said = target, POLL_S, ""
        log.info("serving %s with %d instance manager(s)%s: %s", target, len(self.workers),
                 " (members of its registry)" if self.zk else "",
                 ", ".join(f"{w.name} at {w.address} on cpu {w.cpu}" for w in self.workers))

    def _find(self) -> Target | None:
        """The engine to serve, or the cluster to join; None (and why, logged) while there is none."""
        try:
            if self.zk:  # nothing to wait for: the workers join the registry themselves
                return Target(self.zk, "", auth.read(self.token_file))
            target = find_engine(self.engine, self.token_file)
        except SparkcepError as e:
            self._say(f"waiting for {'the cluster token' if self.zk else 'an engine'}: {e} [{e.code}]")
            return None
        host = target.address.rpartition(":")[0]
        if is_loopback(listen_address(self.listen, 0).rpartition(":")[0]) and not on_this_host(host):
            self._say(f"the engine at {target.address} is on another host, but this executor's instance managers "
                      "would listen on loopback, which it cannot reach: set spark.sparkcep.listen=host (or an "
                      "address of this host the engine can reach) [LISTEN]", logging.ERROR)
            return None
        return target

    def _watch(self) -> None:
        if not self.zk and not self._engine_stays():
            return
        for k, w in enumerate(self.workers):
            if w.process.poll() is not None and time.monotonic() >= self.next_try:
                self._restart(k, w)

    def _engine_stays(self) -> bool:
        """Whether the engine served still answers as the same run; its workers stop when not."""
        target = self.target
        try:
            run = find_engine(target.address, None, target.token).run
        except SparkcepError:
            run = None
        if run == target.run:
            return True
        how = "is gone" if run is None else f"now answers as run {run}"
        log.info("%s %s: stopping its instance managers", target, how)
        self._stop_workers()
        self.target = None
        return False

    def _restart(self, k: int, old: Worker) -> None:
        log.warning("instance manager %s (pid %d) exited with code %s while serving %s; starting it again",
                    old.name, old.process.pid, old.process.returncode, self.target)
        _stop([old])
        self.workers[k] = w = self._start(k)
        try:
            self._wait_ready([w])
            self._register(self.target, [w])
            self.pause = POLL_S
        except SparkcepError as e:
            _stop([w])  # not serving: started again after the pause
            self._failed(f"instance manager {old.name}: {e} [{e.code}]")

    def _register(self, target: Target, workers: list[Worker]) -> None:
        if self.zk:
            return  # members: each joined the registry before its READY line, the engine host adopts it
        with EngineClient(target.address, timeout=REPLY_TIMEOUT_S, token=target.token) as client:
            for w in workers:
                client.register_im(w.address)

    # --- workers -----------------------------------------------------------------------
    def _start(self, i: int) -> Worker:
        cpu = self.cpus[(self.first_cpu + i) % len(self.cpus)]
        tag = "driver" if self.executor == "driver" else f"exec{self.executor}"
        name = f"{tag}-{i}.{os.getpid()}"  # the launcher's pid: unique among executors sharing an engine
        self.started += 1
        if self.started > self.count:
            name += f".{self.started - self.count}"  # started again: a new name (an engine host adopts one once)
        listen = listen_address(self.listen, i)
        return Worker(name, cpu, listen, start_worker(name, cpu, listen, str(self.token_path), self.zk))

    def _wait_ready(self, workers: list[Worker]) -> None:
        infos = wait_ready([Starting(w.process, f"instance manager {w.name} (cpu {w.cpu}, {w.listen})")
                            for w in workers], tell=log.info)
        for w, info in zip(workers, infos):
            w.address = info["address"]

    def _stop_workers(self) -> None:
        _stop(self.workers)
        self.workers = []

    # --- logging -----------------------------------------------------------------------
    def _say(self, message: str, level: int = logging.INFO) -> None:
        """Log ``message`` unless it is what was said last (waiting repeats itself every second)."""
        if message != self._said:
            self._said = message
            log.log(level, message)

    def _failed(self, message: str) -> None:
        log.error("%s; trying again in %.0f s", message, self.pause)
        self.next_try = time.monotonic() + self.pause
        self.pause = min(self.pause * 2, MAX_PAUSE_S)


def _stop(workers: list[Worker]) -> None:
    """SIGTERM, then SIGKILL for those still running after 5 s."""
    for w in workers:
        if w.process.poll() is None:
            w.process.terminate()
    deadline = time.monotonic() + 5
    for w in workers:
        try:
            w.process.wait(max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            w.process.kill()
            w.process.wait()
        if w.process.stdout is not None:
            w.process.stdout.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sparkcep.spark.executor", description=__doc__.split("\n")[0])
    ap.add_argument("--executor-id", default="driver", help="the Spark executor's id (\"driver\" in local mode)")
    ap.add_argument("--instance-managers", type=int, default=None,
                    help="how many (default: one per CPU this process may run on)")
    ap.add_argument("--engine", default=None, help="host:port of the engine's endpoint (default: the local engine)")
    ap.add_argument("--zk", default=None, metavar="zk://HOST:PORT/PATH",
                    help="join this cluster's registry instead of serving an engine (needs --token-file)")
    ap.add_argument("--token-file", default=None,
                    help="the engine's token (default: its file on this machine); with --zk the cluster's")
    ap.add_argument("--listen", default=None,
                    help="loopback (default), host (this host's address) or HOST[:PORT] (worker i on PORT+i)")
    args = ap.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, datefmt="%y/%m/%d %H:%M:%S",
                        format=f"%(asctime)s %(levelname)s sparkcep executor {args.executor_id} launcher "
                               f"(pid {os.getpid()}): %(message)s")
    try:
        if args.instance_managers is not None and args.instance_managers < 1:
            raise EngineError(f"--instance-managers {args.instance_managers}: expected at least 1", "OPTION")
        listen_address(args.listen, 0)
        if args.zk and args.engine:
            raise EngineError(f"--zk {args.zk} and --engine {args.engine}: serve an engine or join a cluster, "
                              "not both", "OPTION")
        if args.zk and not args.token_file:
            raise EngineError(f"--zk {args.zk}: the cluster's token file is required (--token-file, "
                              "spark.sparkcep.tokenFile), readable on this host", "OPTION")
    except EngineError as e:
        log.error("%s [%s]; this executor runs no instance managers", e, e.code)
        return 2
    zk = args.zk if not args.zk or args.zk.startswith("zk://") else f"zk://{args.zk}"
    launcher = Launcher(args.executor_id, args.instance_managers, args.engine, args.token_file, args.listen, zk)
    signal.signal(signal.SIGTERM, lambda *_: launcher.stopping.set())
    threading.Thread(target=_watch_stdin, args=(launcher.stopping,), daemon=True, name="stdin").start()
    launcher.run()
    log.info("stopped")
    return 0


def _watch_stdin(stopping: threading.Event) -> None:
    """Stop when standard input closes: the plugin's shutdown, or the executor JVM gone."""
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except OSError:
        pass
    stopping.set()


if __name__ == "__main__":
    sys.exit(main())
