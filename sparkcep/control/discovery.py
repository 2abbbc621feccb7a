"""Finding the local engine: a small JSON file written when an engine starts.

``$SPARKCEP_HOME/local.json`` (default ``~/.sparkcep/local.json``) holds
``{"address": "127.0.0.1:PORT", "pid": PID, "started": UNIX_TIME}`` of the
engine started last on this machine; it is removed when that engine closes.
Processes that Spark or the CLI start find the engine through it unless they
are given an explicit ``host:port``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from sparkcep.errors import EngineError


class EngineNotFoundError(EngineError):
    """No engine could be reached at the given or published address."""

    code = "ENGINE_NOT_FOUND"


def home() -> Path:
    """The directory of sparkcep's local files: ``$SPARKCEP_HOME`` or ``~/.sparkcep``."""
    return Path(os.environ.get("SPARKCEP_HOME") or Path.home() / ".sparkcep")


def local_file() -> Path:
    return home() / "local.json"


def publish(address: str) -> Path:
    """Record ``address`` (of an engine in this process) as the local engine."""
    path = local_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".local.{os.getpid()}.{time.monotonic_ns()}.json")
    tmp.write_text(json.dumps({"address": address, "pid": os.getpid(), "started": time.time()}))
    os.replace(tmp, path)
    return path


def unpublish(address: str) -> None:
    """Remove the local-engine file if it still names ``address`` of this process."""
    path = local_file()
    try:
        info = json.loads(path.read_text())
        if info.get("address") == address and info.get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass


def local_address() -> str:
    """The address of the running local engine; EngineNotFoundError when there is none."""
    path = local_file()
    try:
        info = json.loads(path.read_text())
        address, pid = info["address"], int(info["pid"])
    except FileNotFoundError:
        raise EngineNotFoundError(f"no local engine is running: {path} does not exist. Start one with "
                                  "sparkcep.Engine.local(), or pass the engine option as host:port") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise EngineNotFoundError(f"cannot read the local engine file {path}: {e}") from None
    if not _alive(pid):
        raise EngineNotFoundError(f"the local engine file {path} names process {pid} at {address}, "
                                  "which is no longer running; start an engine with sparkcep.Engine.local()")
    return address


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
