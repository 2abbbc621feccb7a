"""Starting and stopping the engines of the API tests as a user does: processes of the ``sparkcep`` command
line, and the command line itself (``Api.cli``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from sparkcep.runtime.worker_start import Starting, wait_ready

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("workers0", "workers2", "addresses", "cluster")
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]))


@dataclass
class Api:
    kind: str
    engine: object  # sparkcep.Engine or sparkcep.control.connect.ConnectedEngine
    zk: str | None = None  # the cluster's registry (HOST:PORT/PATH), for the command line
    token_file: str | None = None

    def cli(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """``sparkcep *argv`` as a user runs it."""
        return subprocess.run([sys.executable, "-m", "sparkcep", *argv], env=ENV, capture_output=True, text=True,
                              timeout=timeout)


def start(*argv: str, log: Path) -> subprocess.Popen:
    """``sparkcep *argv`` in the background, its stderr into the file ``log``."""
    with open(log, "ab") as err:
        return subprocess.Popen([sys.executable, "-m", "sparkcep", *argv], env=ENV, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err)


def start_workers(*argvs: list[str], log: Path) -> tuple[list[subprocess.Popen], list[dict]]:
    """``sparkcep worker *argv`` for each of ``argvs``, their stderr into the file ``log``, once each printed its
    READY line: the processes and what they said (their ``address``)."""
    with open(log, "ab") as err:
        processes = [subprocess.Popen([sys.executable, "-m", "sparkcep", "worker", *argv], env=ENV,
                                      stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err)
                     for argv in argvs]
    try:
        return processes, wait_ready([Starting(p, f"worker {' '.join(a)}") for p, a in zip(processes, argvs)])
    except BaseException:
        stop(processes)
        raise


def stop(processes: list[subprocess.Popen]) -> None:
    """SIGTERM each (orchestrators first: the last to leave stops the engine hosts), then wait."""
    for p in processes:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        if p.stdout is not None:
            p.stdout.close()

