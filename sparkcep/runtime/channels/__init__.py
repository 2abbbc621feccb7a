"""Channels: how batches, progress and control records travel from one producer to one consumer.

The interface and the messages are in :mod:`.base`; the implementations:
:class:`LocalChannel` (both ends in one process), :mod:`.ring` (shared
memory between processes of one host) and :mod:`.tcp` (between hosts). A
channel is named by an address, and :func:`producer` / :func:`consumer` open
its ends from it:

* ``shm:<path>`` — a ring file the consumer created (:func:`create_ring`);
* ``tcp:HOST:PORT/CHANNEL_ID`` — channel CHANNEL_ID of the service listening
  on HOST:PORT; this end connects and presents ``token`` (:func:`.tcp.connect`).
"""

from __future__ import annotations

from sparkcep.errors import EngineError
from sparkcep.runtime.channels import hello, tcp
from sparkcep.runtime.channels.base import (Abort, ChannelClosed, Configure, Consumer, Control, Data, Export,
                                            Import, LocalChannel, Producer, Progress, Retire)
from sparkcep.runtime.channels.ring import (DEFAULT_CAPACITY, Doorbell, RingConsumer, RingProducer, create_ring,
                                            unlink_quietly)
from sparkcep.runtime.channels.tcp import Gate, Hello, TcpConsumer, TcpProducer

__all__ = ["Abort", "ChannelClosed", "Configure", "Consumer", "Control", "Data", "Export", "Import", "LocalChannel",
           "Producer", "Progress", "Retire", "DEFAULT_CAPACITY", "Doorbell", "RingConsumer", "RingProducer", "create_ring",
           "unlink_quietly", "Gate", "Hello", "TcpConsumer", "TcpProducer", "hello", "tcp", "producer", "consumer"]

ADDRESSES = "shm:<path> or tcp:HOST:PORT/CHANNEL_ID"


def producer(address: str, bell: Doorbell | None = None, batches_stay: bool = False, *, token: str | None = None,
             capacity: int = tcp.DEFAULT_CAPACITY) -> Producer:
    """The producer end of the channel at ``address``.

    Rings: ``bell`` is this process's doorbell, ``batches_stay`` see
    :class:`RingProducer`. Network channels: ``token`` is the engine's,
    ``capacity`` the bytes in flight at most.
    """
    kind, _, where = address.partition(":")
    if kind == "shm":
        return RingProducer(where, bell, batches_stay=batches_stay)
    if kind == "tcp":
        return tcp.connect(address, "producer", _token(address, token), capacity=capacity)
    raise EngineError(f"unknown channel address {address!r}; expected {ADDRESSES}", "CHANNEL")


def consumer(address: str, bell: Doorbell | None = None, copy: bool = True, *, token: str | None = None) -> Consumer:
    """The consumer end of the channel at ``address``.

    Rings: ``bell`` is the doorbell this process sleeps on. Both: with
    ``copy`` a batch owns its memory (see :class:`RingConsumer`,
    :class:`TcpConsumer`). Network channels: ``token`` is the engine's.
    """
    kind, _, where = address.partition(":")
    if kind == "shm":
        return RingConsumer(where, bell, copy=copy)
    if kind == "tcp":
        return tcp.connect(address, "consumer", _token(address, token), copy=copy)
    raise EngineError(f"unknown channel address {address!r}; expected {ADDRESSES}", "CHANNEL")


def _token(address: str, token: str | None) -> str:
    if not token:
        raise EngineError(f"channel {address}: a network channel needs the engine's token", "CHANNEL")
    return token
