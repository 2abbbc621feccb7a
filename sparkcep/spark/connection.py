"""Engine clients inside Spark's Python processes, one per engine address and process.

Spark reuses its Python workers between tasks, so a client (one TCP
connection) made by one task serves the next ones of the same process. A
request that finds the connection broken (the worker sat idle, the engine
restarted) is retried once on a new connection: every request the data
source makes is idempotent.
"""

from __future__ import annotations

import threading

from sparkcep.control.client import EngineClient
from sparkcep.control.discovery import EngineNotFoundError

_clients: dict[str, EngineClient] = {}
_lock = threading.Lock()


def client(address: str) -> EngineClient:
    """This process's client of the engine at ``address``."""
    with _lock:
        c = _clients.get(address)
        if c is None:
            c = _clients[address] = EngineClient(address)
        return c


def call(address: str, fn):
    """``fn(client)``, retried once on a fresh connection if the engine was unreachable."""
    try:
        return fn(client(address))
    except EngineNotFoundError:
        client(address).close()
        return fn(client(address))
