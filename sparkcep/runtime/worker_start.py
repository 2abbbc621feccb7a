"""Starting ``sparkcep worker`` processes and waiting for their READY line: what the engine
(:class:`~sparkcep.runtime.cluster.Cluster`) and the Spark executor launcher
(:mod:`sparkcep.spark.executor`) do to run instance managers of their own.

A starting worker prints ``STARTING <what it does>`` every second, then
``READY <its description>`` (or ``FAILED <why>``); :func:`wait_ready` waits
as long as it keeps talking and names one that stops, dies or fails.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import sparkcep
from sparkcep.errors import EngineError

log = logging.getLogger("sparkcep")

FIRST_WORD_S = 60.0  # a started worker says what it does within this long (Python's imports, on a busy machine)
STALL_S = 10.0  # then it is stuck when it says nothing for this long
START_LIMIT_S = 900.0  # and one still starting after this long (compiling every kernel takes 1-2 min)
TELL_EVERY_S = 5.0  # how often the engine says what it waits for while workers start
COMPILING_AFTER_S = 20.0  # kernels loaded from numba's cache take a few seconds, even for many workers at once
COMPILING = (" (numba compiles the engine's kernels on a machine's first run; `sparkcep warm-up`, which the "
             "install runs, leaves them in its cache)")


def start_worker(name: str, cpu: int, listen: str, token_file: str, zk: str | None = None) -> subprocess.Popen:
    """Start ``sparkcep worker --once`` pinned to ``cpu``, listening on ``listen`` (``host:port``) — or,
    with ``zk``, a member of that cluster's registry (``--zk``, no ``--once``: it serves whichever engine
    host adopts it).

    It imports what this process imports (the same sparkcep, and the modules
    of the query's functions), gets SIGTERM when this process dies, and
    prints its READY line on the pipe :func:`wait_ready` reads. The Spark
    executor launcher starts its instance managers so; an engine forks its own
    from a template (:mod:`sparkcep.runtime.template`).
    """
    return subprocess.Popen([sys.executable, "-m", "sparkcep", "worker", *worker_args(name, cpu, listen, token_file, zk)],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env=worker_env(),
                            preexec_fn=die_with_parent)


def worker_args(name: str, cpu: int, listen: str, token_file: str, zk: str | None = None) -> list[str]:
    """The arguments of ``sparkcep worker`` for :func:`start_worker`."""
    return ["--listen", listen, "--cpus", str(cpu), "--name", name, "--token-file", token_file,
            *(["--zk", zk] if zk else ["--once"])]


def worker_env() -> dict[str, str]:
    """This process's environment, with a ``PYTHONPATH`` that finds this sparkcep and the modules this
    process imports."""
    root = os.path.dirname(os.path.dirname(sparkcep.__file__))
    paths = [root] + [p for p in sys.path if p and os.path.isdir(p)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}


def die_with_parent() -> None:
    """In a started instance manager, before it runs: SIGTERM when the process that started it dies
    (Linux); Ctrl-C ignored (it reaches the whole process group: the process that started the worker
    stops it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@dataclass
class Starting:
    """A worker process this process started, until it printed its READY line."""

    process: subprocess.Popen
    what: str  # how errors and waits name it: "instance manager im-0 (cpu 0)"
    doing: str = "starting"  # what it said last
    heard: float | None = None  # when it said it
    buf: bytes = b""
    info: dict | None = None  # its READY description


def wait_ready(starting: list[Starting], tell=log.warning) -> list[dict]:
    """The READY descriptions of ``starting`` workers, in order.

    A starting worker prints a ``STARTING <what it does>`` line every second
    (:func:`~sparkcep.runtime.warmup.heartbeat`): it is waited for as long as
    it does, and ``tell(message)`` says what for when that takes a while (numba
    compiling kernels on a machine's first run). One that exits or prints
    ``FAILED`` is named at once; one silent for ``STALL_S`` (``FIRST_WORD_S``
    before its first line) or still starting after ``START_LIMIT_S`` is killed
    and named (EngineError ``WORKER_START`` / ``WORKER_STUCK``); the caller
    stops the others.
    """
    t0 = told = time.monotonic()
    while True:
        waiting = [s for s in starting if s.info is None]
        if not waiting:
            return [s.info for s in starting]
        now = time.monotonic()
        for s in waiting:
            silent = now - (t0 if s.heard is None else s.heard)
            if silent > (FIRST_WORD_S if s.heard is None else STALL_S):
                s.process.kill()
                raise EngineError(f"{s.what} said nothing for {silent:.0f} s while {s.doing}: it is stuck "
                                  f"(pid {s.process.pid})", "WORKER_STUCK")
            if now - t0 > START_LIMIT_S:
                s.process.kill()
                raise EngineError(f"{s.what} did not start within {START_LIMIT_S:.0f} s ({s.doing})", "WORKER_START")
        if now - told > TELL_EVERY_S:
            told = now
            tell("waiting for %s to start: %s%s", ", ".join(s.what for s in waiting), waiting[0].doing,
                 COMPILING if now - t0 > COMPILING_AFTER_S else "")
        ready, _, _ = select.select([s.process.stdout for s in waiting], [], [], 0.2)
        for s in waiting:
            if s.process.stdout in ready:
                _hear(s)


def _hear(s: Starting) -> None:
    chunk = os.read(s.process.stdout.fileno(), 4096)
    if not chunk:
        code = s.process.wait(5)
        raise EngineError(f"{s.what} exited at start with code {code} (its error is above)", "WORKER_START")
    s.buf += chunk
    *lines, s.buf = s.buf.split(b"\n")
    for raw in lines:
        text = raw.decode(errors="replace").strip()
        s.heard = time.monotonic()
        if text.startswith("STARTING "):
            s.doing = text[len("STARTING "):]
        elif text.startswith("READY "):
            s.info = json.loads(text[len("READY "):])
        elif text.startswith("FAILED "):
            s.process.kill()  # it is exiting anyway
            raise EngineError(f"{s.what} failed to start: {text[len('FAILED '):]}", "WORKER_START")
        elif text:
            s.process.kill()
            raise EngineError(f"{s.what} printed {text!r} instead of its READY line", "WORKER_START")
