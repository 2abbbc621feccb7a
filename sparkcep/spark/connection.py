"""Engine clients inside Spark's Python processes, one per engine endpoint and process.

Readers, writers and their tasks carry a :class:`Target` (picklable: the
``engine`` option and where the token is, never the token itself) and call
the engine through :func:`call`. Spark reuses its Python workers between
tasks, so a client (one TCP connection) made by one task serves the next
ones of the same process. A request that finds the connection broken (the
worker sat idle, the engine restarted) is retried once on a new connection:
every request the data source makes is idempotent (a stage chunk sent again
replaces itself, a batch committed again is a duplicate). A cluster's
requests are retried so until its data path serves again (a fail-over
takes seconds), for up to ``RETRY_S`` seconds.

A cluster's engine (``engine=zk://HOST:PORT/PATH``) is its engine host, at
the address its registry holds at ``/engine``: each process looks it up once
(a registry session opened for the look-up only) and again when the address
it had stops answering.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from sparkcep.gateway.client import EngineClient, resolve
from sparkcep.control.connect import RETRY_S, engine_address, retryable
from sparkcep.errors import SparkcepError
from sparkcep.spark.options import SparkSourceError, spark_error

ZK = "zk://"


@dataclass(frozen=True)
class Target:
    """An engine endpoint (``host:port``) or a cluster's registry (``zk://...``), and the token file to
    use (None: found as the client finds it; required for a cluster)."""

    address: str
    token_file: str | None = None


def target_of(engine: str | None, token_file: str | None) -> Target:
    """The Target of the ``engine`` and ``tokenFile`` options, checked but not contacted.

    SparkSourceError ``TOKEN_NOT_FOUND`` for a cluster without ``tokenFile``;
    ``ENGINE_OPTION`` for an engine option of no known form.
    """
    engine = (engine or "").strip()
    if engine.startswith(ZK):
        if not token_file:
            raise SparkSourceError(f"engine {engine}: option tokenFile is required with a cluster: the file holding "
                                   "the cluster's token, readable on the driver and the executors' hosts",
                                   "TOKEN_NOT_FOUND")
        return Target(engine, token_file)
    return Target(resolve(engine or None), token_file)


_clients: dict[Target, EngineClient] = {}
_engine_hosts: dict[str, str] = {}  # zk:// address -> host:port of its engine host, as last looked up
_lock = threading.Lock()


def client(target: Target) -> EngineClient:
    """This process's client of the engine at ``target``."""
    with _lock:
        c = _clients.get(target)
        if c is None:
            address = target.address
            if address.startswith(ZK):
                address = _engine_hosts.get(address) or _engine_hosts.setdefault(address, engine_address(address))
            c = _clients[target] = EngineClient(address, token_file=target.token_file)
        return c


def _forget(target: Target) -> None:
    """Drop this process's client of ``target`` (and where its cluster's engine host was)."""
    with _lock:
        c = _clients.pop(target, None)
        _engine_hosts.pop(target.address, None)
    if c is not None:
        c.close()


def call(target: Target, fn):
    """``fn(client)``, retried on a fresh connection when the engine was unreachable: once for an engine
    endpoint; for a cluster (its data path looked up again each time) until :data:`RETRY_S` seconds passed,
    riding through a fail-over of its data path (every request the data source makes is idempotent).

    Errors cross into Spark as SparkSourceError, ``[UPMCEP_<CODE>]`` first in the message.
    """
    start = time.monotonic()
    tries = 0
    while True:
        tries += 1
        try:
            return fn(client(target))
        except SparkcepError as e:
            again = retryable(e) and (target.address.startswith(ZK) and time.monotonic() < start + RETRY_S
                                      or tries == 1)
            if not again:
                if tries > 1:  # each try's own limit is in its message: say how long it was tried in all
                    raise SparkSourceError(f"{e} (tried {tries} times over {time.monotonic() - start:.0f} s)",
                                           e.code) from None
                raise spark_error(e) from None
            _forget(target)
            if tries > 1:
                time.sleep(0.1)
