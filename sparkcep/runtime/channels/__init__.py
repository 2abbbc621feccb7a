"""Channels: how batches, progress and control records travel from one producer to one consumer.

The interface and the messages are in :mod:`.base`; the implementations:
:class:`LocalChannel` (both ends in one process), :mod:`.ring` (shared
memory between processes of one host) and :mod:`.tcp` (between hosts). A
channel is named by an address, and :func:`producer` / :func:`consumer` open
its ends from it:

* ``shm:<path>`` — a ring file the consumer created (:func:`create_ring`).
"""

from __future__ import annotations

from sparkcep.errors import EngineError
from sparkcep.runtime.channels.base import (Abort, ChannelClosed, Configure, Consumer, Control, Data, LocalChannel,
                                            Producer, Progress)
from sparkcep.runtime.channels.ring import (DEFAULT_CAPACITY, Doorbell, RingConsumer, RingProducer, create_ring,
                                            unlink_quietly)

__all__ = ["Abort", "ChannelClosed", "Configure", "Consumer", "Control", "Data", "LocalChannel", "Producer",
           "Progress", "DEFAULT_CAPACITY", "Doorbell", "RingConsumer", "RingProducer", "create_ring",
           "unlink_quietly", "producer", "consumer"]


def producer(address: str, bell: Doorbell | None = None, batches_stay: bool = False) -> Producer:
    """The producer end of the channel at ``address``; ``bell``: this process's doorbell."""
    kind, _, where = address.partition(":")
    if kind == "shm":
        return RingProducer(where, bell, batches_stay=batches_stay)
    raise EngineError(f"unknown channel address {address!r}; expected shm:<path>", "CHANNEL")


def consumer(address: str, bell: Doorbell | None = None, copy: bool = True) -> Consumer:
    """The consumer end of the channel at ``address``; ``bell``: the doorbell this process sleeps on."""
    kind, _, where = address.partition(":")
    if kind == "shm":
        return RingConsumer(where, bell, copy=copy)
    raise EngineError(f"unknown channel address {address!r}; expected shm:<path>", "CHANNEL")
