"""The launcher the JVM plugin runs with each Spark executor: its instance managers, pinned and registered.

``python -m sparkcep.spark.executor --executor-id ID [--host H] [--instance-managers N] [--engine HOST:PORT]``

1. starts N instance managers (default: one per CPU this process may run on),
   each pinned to one CPU (round robin over the allowed CPUs);
2. prints one line ``READY {"executor": ..., "instance_managers": [...]}`` on stdout;
3. registers them with the engine endpoint (retrying every second until an
   engine is reachable: the engine may start after the SparkSession);
4. waits until its standard input closes (the plugin's ``shutdown``, or the
   executor JVM dying) or it gets SIGTERM; then stops the instance managers
   (SIGTERM, then SIGKILL after 5 s), deregisters them and exits 0.

Instance-manager contract (``sparkcep.runtime.instance_manager``): run as
``python -m sparkcep.runtime.instance_manager --name NAME --cpu CPU --engine ADDRESS``
(``--engine`` omitted when the local engine is meant), run until SIGTERM and
exit 0 then. The launcher pins it and arranges SIGTERM on the launcher's own
death (``PR_SET_PDEATHSIG``). Until that module exists, the launcher starts
*standby* processes (``--standby``): pinned, idle, registered with
``"kind": "standby"``, so the lifecycle is in place and visible.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from sparkcep.errors import SparkcepError

IM_MODULE = "sparkcep.runtime.instance_manager"


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the launcher dies (Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def im_command(name: str, cpu: int, engine: str | None) -> tuple[list[str], str]:
    """The command of one instance manager and its kind (``instance_manager`` or ``standby``)."""
    if importlib.util.find_spec(IM_MODULE) is not None:
        cmd = [sys.executable, "-m", IM_MODULE, "--name", name, "--cpu", str(cpu)]
        return cmd + (["--engine", engine] if engine else []), "instance_manager"
    return [sys.executable, "-m", "sparkcep.spark.executor", "--standby", "--name", name], "standby"


class Launcher:
    """The instance managers of one executor."""

    def __init__(self, executor: str, host: str, count: int | None, engine: str | None):
        self.executor, self.host, self.engine = executor, host, engine
        self.cpus = sorted(os.sched_getaffinity(0))
        self.count = count or len(self.cpus)
        self.procs: list[tuple[dict, subprocess.Popen]] = []
        self.registered_with: str | None = None
        self.stopping = threading.Event()

    def start(self) -> None:
        for i in range(self.count):
            cpu = self.cpus[i % len(self.cpus)]
            name = f"{self.executor}-{i}"
            cmd, kind = im_command(name, cpu, self.engine)
            p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
            try:
                os.sched_setaffinity(p.pid, {cpu})
            except OSError:
                pass
            info = {"id": name, "pid": p.pid, "cpu": cpu, "executor": self.executor, "host": self.host,
                    "kind": kind, "launcher_pid": os.getpid()}
            self.procs.append((info, p))
        time.sleep(0.3)
        dead = [(info, p.returncode) for info, p in self.procs if p.poll() is not None]
        if dead:
            self.stop()
            raise SparkcepError(f"instance manager {dead[0][0]['id']} exited at once with code {dead[0][1]}",
                                "IM_START")

    def register_loop(self) -> None:
        """Register every instance manager with the engine, retrying until it is reachable."""
        from sparkcep.control.client import EngineClient, resolve

        while not self.stopping.is_set():
            try:
                address = resolve(self.engine)
                with EngineClient(address, timeout=10) as c:
                    for info, _ in self.procs:
                        c.register_im(info)
                self.registered_with = address
                return
            except SparkcepError:
                self.stopping.wait(1.0)

    def stop(self) -> None:
        self.stopping.set()
        for _, p in self.procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + 5
        for _, p in self.procs:
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self.registered_with:
            from sparkcep.control.client import EngineClient

            try:
                with EngineClient(self.registered_with, timeout=5) as c:
                    for info, _ in self.procs:
                        c.deregister_im(info["id"])
            except SparkcepError:
                pass  # the engine is gone: nothing to deregister from


def _standby(name: str) -> int:
    """A placeholder instance manager: idle until SIGTERM or until its parent is gone."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    parent = os.getppid()
    while not stop.wait(0.5):
        if os.getppid() != parent:
            break
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sparkcep.spark.executor", description=__doc__.split("\n")[0])
    ap.add_argument("--executor-id", default="driver")
    ap.add_argument("--host", default=socket.gethostname())
    ap.add_argument("--instance-managers", type=int, default=None)
    ap.add_argument("--engine", default=None)
    ap.add_argument("--standby", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--name", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.standby:
        return _standby(args.name)
    launcher = Launcher(args.executor_id, args.host, args.instance_managers, args.engine)
    try:
        launcher.start()
    except SparkcepError as e:
        print(f"sparkcep launcher: {e}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: launcher.stopping.set())
    registrar = threading.Thread(target=launcher.register_loop, daemon=True)
    registrar.start()
    print("READY " + json.dumps({"executor": args.executor_id, "launcher_pid": os.getpid(),
                                 "instance_managers": [info for info, _ in launcher.procs]}), flush=True)

    def watch_stdin():
        try:
            sys.stdin.buffer.read()
        except OSError:
            pass
        launcher.stopping.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    while not launcher.stopping.wait(0.5):
        pass
    registrar.join(timeout=15)  # a registration under way finishes, so stop() deregisters it
    launcher.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
