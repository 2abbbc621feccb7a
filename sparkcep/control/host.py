"""The engine host: a cluster's data path, in a process of its own (DESIGN §6).

The leading orchestrator starts it when the cluster has none (detached: it
outlives the orchestrator). It runs one :class:`sparkcep.Engine` — the
sources that stamp sequence numbers (one order for the whole cluster), the
output logs, the command connections to the instance managers — over the
instance managers that are members of the registry: each one that joins is
adopted for the next placement. It serves the engine on its endpoint
(clients' sends and reads, Spark's source and sink, the orchestrator's
deploys) and says where at ``/engine``. The orchestrators only decide and
record: killing one changes nothing here, and sends keep being taken.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from sparkcep import auth
from sparkcep.control import tree
from sparkcep.control.registry import Registry, RegistryError, open_registry
from sparkcep.errors import SparkcepError

log = logging.getLogger("sparkcep")
START_S = 60.0  # a started engine host announces itself within this long


class EngineHost:
    """An engine over the registry's members, announced at ``/engine``."""

    def __init__(self, registry: Registry, token: str, listen: str = "127.0.0.1:0"):
        from sparkcep.engine import Engine
        self.registry = registry
        self.engine = Engine.local(token=token, listen=listen)
        self.stopped = threading.Event()
        self.engine.endpoint.on_shutdown = self.stopped.set
        self.adopted: dict[str, str] = {}  # member name -> address
        self._lock = threading.Lock()
        try:
            registry.create(tree.ENGINE, {"address": self.engine.endpoint.address, "pid": os.getpid(),
                                          "host": socket.gethostname(), "run": self.engine.run_id}, ephemeral=True)
        except RegistryError as e:
            self.engine.close()
            if e.code == "NODE_EXISTS":
                raise RegistryError(f"{registry!r} already has an engine host: {registry.get(tree.ENGINE)}",
                                    "ENGINE_EXISTS", tree.ENGINE) from None
            raise
        registry.watch_children(tree.MEMBERS, lambda names: threading.Thread(
            target=self._adopt, args=(names,), daemon=True).start())

    def _adopt(self, names: list[str]) -> None:
        """Use every member not adopted yet (a worker that joined) for the next placements; one that left
        may come back under its name."""
        with self._lock:
            for name in set(self.adopted) - set(names):
                del self.adopted[name]
            for name in sorted(set(names) - set(self.adopted)):
                info = self.registry.get(tree.member(name))
                if not info:
                    continue
                try:
                    self.engine.add_instance_manager(info["address"])
                    self.adopted[name] = info["address"]
                    log.info("engine host: instance manager %s (%s) joined", name, info["address"])
                except SparkcepError as e:
                    log.warning("engine host: cannot use member %s at %s: %s [%s]", name, info.get("address"),
                                e, e.code)

    def close(self) -> None:
        self.engine.close()
        self.registry.close()


def spawn(zk: str, token_file: str, listen: str = "127.0.0.1:0") -> subprocess.Popen:
    """Start an engine host for the cluster at ``zk``, detached from this process (a session of its own,
    so it outlives it)."""
    cmd = [sys.executable, "-m", "sparkcep", "engine-host", "--zk", zk, "--token-file", token_file,
           "--listen", listen]
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True)


def wait_for(registry: Registry, timeout: float = START_S) -> dict:
    """The ``/engine`` document, once there is one."""
    deadline = time.monotonic() + timeout
    while (doc := registry.get(tree.ENGINE)) is None:
        if time.monotonic() > deadline:
            raise RegistryError(f"no engine host announced itself at {registry!r}/engine within {timeout:.0f} s",
                                "NO_ENGINE", tree.ENGINE)
        time.sleep(0.05)
    return doc


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--zk", required=True, metavar="zk://HOST:PORT/PATH", help="the cluster's registry")
    parser.add_argument("--token-file", required=True, help="the cluster's token")
    parser.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT",
                        help="where clients reach the engine (default: loopback, any free port)")


def run(args) -> int:
    """Body of ``sparkcep engine-host`` (started by the leading orchestrator): serve until stopped."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s engine-host %(message)s")
    zk = args.zk if args.zk.startswith("zk://") else f"zk://{args.zk}"
    try:
        host = EngineHost(open_registry(zk), auth.read(args.token_file), args.listen)
    except SparkcepError as e:
        log.error("%s [%s]", e, e.code)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: host.stopped.set())
    log.info("serving the engine of %s at %s", zk, host.engine.endpoint.address)
    try:
        host.stopped.wait()
    except KeyboardInterrupt:
        pass
    host.close()
    log.info("stopped")
    return 0
