"""Finding the local engine and its token: small private files written when an engine starts.

``$SPARKCEP_HOME`` (default ``~/.sparkcep``, mode 0700) holds, while an
engine of this machine runs:

* ``engine-HOST-PORT.token`` (mode 0600): the token of the engine serving
  ``HOST:PORT``, one file per running engine, removed when it closes;
* ``local.json`` (mode 0600): ``{"address", "pid", "started", "token_file"}``
  of the engine started last; removed when that engine closes.

Processes that Spark or the CLI start find the engine through ``local.json``
unless they are given an explicit ``host:port``, and the token of an engine
of this machine through its token file (see
:func:`sparkcep.gateway.client.find_token`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from sparkcep import auth
from sparkcep.errors import EngineError


class EngineNotFoundError(EngineError):
    """No engine could be reached at the given or published address."""

    code = "ENGINE_NOT_FOUND"


def home() -> Path:
    """The directory of sparkcep's local files: ``$SPARKCEP_HOME`` or ``~/.sparkcep``."""
    return Path(os.environ.get("SPARKCEP_HOME") or Path.home() / ".sparkcep")


def local_file() -> Path:
    return home() / "local.json"


def token_file(address: str) -> Path:
    """Where the engine serving ``address`` (``host:port``) keeps its token."""
    host, _, port = address.rpartition(":")
    return home() / f"engine-{host.replace(':', '_')}-{port}.token"


def publish(address: str, token_path: Path) -> Path:
    """Record ``address`` (of an engine in this process) as the local engine, with its token file."""
    info = {"address": address, "pid": os.getpid(), "started": time.time(), "token_file": str(token_path)}
    return auth.write_private(local_file(), json.dumps(info))


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
