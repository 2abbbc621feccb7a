"""``sparkcep zookeeper``: a local development ZooKeeper server, from the Debian package's jars.

A standalone server bound to loopback only (``clientPortAddress=127.0.0.1``),
without its admin web server, with a 200 ms tick so that short session
timeouts are allowed (the server clamps them to [2, 20] ticks: 0.4-4 s). It
runs in the foreground until SIGTERM or Ctrl-C, then stops its Java process
and removes its data directory if it made a temporary one. The tests start
their server with the same :class:`ZooKeeperServer`.

    sparkcep zookeeper                                  # a free port, printed
    sparkcep zookeeper --port 2181 --data-dir /var/tmp/zk
    # then: open_registry("zk://127.0.0.1:2181/sparkcep")
"""

from __future__ import annotations

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
from pathlib import Path

from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError

from sparkcep.arguments import bounded
from sparkcep.errors import EngineError

JAR_DIR = "/usr/share/java"
JARS = ("zookeeper.jar", "slf4j-simple.jar")  # zookeeper.jar's manifest names the rest of its class path
PACKAGES = "openjdk-17-jre-headless zookeeper"
MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
# the readiness probe's client: its first attempts fail while the server warms up ("Connection dropped"), as expected
_PROBE_LOG = logging.getLogger("sparkcep.zookeeper.probe")
_PROBE_LOG.setLevel(logging.ERROR)


class ZooKeeperError(EngineError):
    """The development ZooKeeper server cannot start: JAVA_NOT_FOUND, ZOOKEEPER_NOT_FOUND, ZOOKEEPER_FAILED."""

    code = "ZOOKEEPER_FAILED"


def free_port() -> int:
    """A TCP port of 127.0.0.1 free at the time of asking."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(port: int) -> bool:
    """Whether a server could listen on 127.0.0.1:``port`` now."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server's socket does
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def answers(port: int) -> bool:
    """Whether a ZooKeeper server on 127.0.0.1:``port`` answers ``ruok`` with ``imok``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"ruok")
            return s.recv(4) == b"imok"
    except OSError:
        return False


class ZooKeeperServer:
    """A standalone ZooKeeper server on 127.0.0.1: a child Java process, from :meth:`start` to :meth:`stop`.

    ``port`` 0 picks a free port. Without ``data_dir`` a temporary directory
    holds the data, the config and the server's log, and is removed at stop.
    On Linux the server is also stopped if the thread that started it ends
    (``setpriv --pdeathsig``), so a killed parent leaves no Java behind.
    """

    def __init__(self, port: int = 0, data_dir: str | os.PathLike | None = None, tick_ms: int = 200,
                 java: str | None = None, jar_dir: str = JAR_DIR):
        self.port, self.tick_ms, self.jar_dir = port, tick_ms, jar_dir
        self.java = java or shutil.which("java")
        self.temporary = data_dir is None
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.process: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "zookeeper.log"

    def start(self, timeout: float = 30.0) -> str:
        """Start the server and wait until it answers; its address ``127.0.0.1:PORT``."""
        command = self._command()
        auto = self.port == 0
        if not auto and not port_free(self.port):  # else another server's answers would pass for ours
            raise ZooKeeperError(f"port {self.port} of 127.0.0.1 is in use (omit --port to pick a free one)",
                                 "ZOOKEEPER_FAILED")
        if self.temporary:
            self.data_dir = Path(tempfile.mkdtemp(prefix="sparkcep-zookeeper-"))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(3 if auto else 1):  # a port picked free may be taken before the server binds it
            if auto:
                self.port = free_port()
            self._write_config()
            with open(self.log_file, "ab") as log:
                self.process = subprocess.Popen(command + [str(self.data_dir / "zoo.cfg")], stdin=subprocess.DEVNULL,
                                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            if self._wait_ready(timeout):
                return self.address
            if not (auto and "Address already in use" in self.log_tail()):
                break
        status, tail = self.process.poll(), self.log_tail()
        self.stop()
        what = f"exited with status {status}" if status is not None else f"did not answer within {timeout} s"
        raise ZooKeeperError(f"the ZooKeeper server on {self.address} {what}; its log ends with:\n{tail}",
                             "ZOOKEEPER_FAILED")

    def _command(self) -> list[str]:
        """The command line, or the error naming what to install."""
        if not self.java or not os.access(self.java, os.X_OK):
            raise ZooKeeperError(f"no Java runtime found ({self.java or 'java not on PATH'}): install the Debian "
                                 f"packages {PACKAGES} (apt-get install {PACKAGES})", "JAVA_NOT_FOUND")
        jars = [os.path.join(self.jar_dir, jar) for jar in JARS]
        missing = [jar for jar in jars if not os.path.isfile(jar)]
        if missing:
            raise ZooKeeperError(f"ZooKeeper's jars are missing ({', '.join(missing)}): install the Debian "
                                 f"package zookeeper (apt-get install zookeeper)", "ZOOKEEPER_NOT_FOUND")
        setpriv = shutil.which("setpriv")
        prefix = [setpriv, "--pdeathsig", "TERM", "--"] if setpriv else []
        return prefix + [self.java, "-Xmx256m", "-XX:+UseSerialGC", "-Dzookeeper.forceSync=no",  # a development
                         "-cp", ":".join(jars), MAIN]  # server: no fsync per write (10-25 ms each here)

    def _write_config(self) -> None:
        (self.data_dir / "zoo.cfg").write_text(
            f"tickTime={self.tick_ms}\n"
            f"dataDir={self.data_dir}\n"
            f"clientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\n"
            "admin.enableServer=false\n"
            "maxClientCnxns=0\n"
            "4lw.commands.whitelist=ruok,srvr,stat\n")

    def _wait_ready(self, timeout: float) -> bool:
        """Whether the server came to serve sessions within ``timeout``: it answers ``ruok``, then a first
        session is opened and closed (the first one takes 0.5-0.8 s more, while the JVM warms up)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.process.poll() is None:
            if answers(self.port):
                client = KazooClient(self.address, timeout=10, logger=_PROBE_LOG)
                try:
                    client.start(timeout=max(deadline - time.monotonic(), 0.1))
                    return True
                except KazooTimeoutError:
                    break
                finally:
                    client.stop()
                    client.close()
            time.sleep(0.05)
        if self.process.poll() is None:
            self._end_process()
        return False

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def exited(self) -> int | None:
        """The server's exit status if it stopped by itself, else None."""
        return self.process.poll() if self.process is not None else None

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the Java process (SIGTERM, then SIGKILL after ``timeout``), remove a temporary data dir."""
        if self.process is not None:
            self._end_process(timeout)
        if self.temporary and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None

    def _end_process(self, timeout: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> "ZooKeeperServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def add_arguments(parser) -> None:
    parser.add_argument("--port", type=bounded(int, 0, 65535), default=0,
                        help="client port on 127.0.0.1 (default 0: a free one)")
    parser.add_argument("--data-dir", default=None,
                        help="the server's data directory (default: a temporary one, removed on exit)")
    parser.add_argument("--tick-ms", type=bounded(int, 1, 60_000), default=200,
                        help="ZooKeeper's tick; session timeouts are clamped to [2, 20] ticks (default 200)")


def run(args) -> int:
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set())  # SIGHUP: its terminal closed
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    server = ZooKeeperServer(args.port, args.data_dir, args.tick_ms)
    try:
        server.start()
        kept = "temporary, removed on exit" if server.temporary else "kept"
        print(f"sparkcep zookeeper: serving zk://{server.address} (Java pid {server.process.pid}; data "
              f"{server.data_dir}, {kept}; log {server.log_file}; session timeouts "
              f"{2 * args.tick_ms / 1000:g}-{20 * args.tick_ms / 1000:g} s). Stop with Ctrl-C or SIGTERM.",
              flush=True)
        while not stop.wait(0.2):
            if server.exited() is not None:
                print(f"sparkcep zookeeper: the server stopped by itself (status {server.exited()}); its log "
                      f"ends with:\n{server.log_tail()}", file=sys.stderr)
                return 1
        print("sparkcep zookeeper: stopping", flush=True)
        return 0
    except ZooKeeperError as e:
        print(f"sparkcep zookeeper: {e} [{e.code}]", file=sys.stderr)
        return 1
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
