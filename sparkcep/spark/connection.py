"""Engine clients inside Spark's Python processes, one per engine endpoint and process.

Readers, writers and their tasks carry a :class:`Target` (picklable: an
address and where the token is, never the token itself) and call the engine
through :func:`call`. Spark reuses its Python workers between tasks, so a
client (one TCP connection) made by one task serves the next ones of the
same process. A request that finds the connection broken (the worker sat
idle, the engine restarted) is retried once on a new connection: every
request the data source makes is idempotent (a stage chunk sent again
replaces itself, a batch committed again is a duplicate).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from sparkcep.control.client import EngineClient
from sparkcep.control.discovery import EngineNotFoundError
from sparkcep.errors import SparkcepError
from sparkcep.spark.options import spark_error


@dataclass(frozen=True)
class Target:
    """An engine endpoint (``host:port``) and the token file to use (None: found as the client finds it)."""

    address: str
    token_file: str | None = None


_clients: dict[Target, EngineClient] = {}
_lock = threading.Lock()


def client(target: Target) -> EngineClient:
    """This process's client of the engine at ``target``."""
    with _lock:
        c = _clients.get(target)
        if c is None:
            c = _clients[target] = EngineClient(target.address, token_file=target.token_file)
        return c


def call(target: Target, fn):
    """``fn(client)``, retried once on a fresh connection if the engine was unreachable.

    Errors cross into Spark as SparkSourceError, ``[UPMCEP_<CODE>]`` first in the message.
    """
    try:
        try:
            return fn(client(target))
        except EngineNotFoundError:
            client(target).close()
            return fn(client(target))
    except SparkcepError as e:
        raise spark_error(e) from None
