"""How a deployment's instances are wired to their channels — written once, for every host.

:func:`plan_channels` decides, for every (producer, consumer) pair of a
layout, the transport (a shared-memory ring between processes of one host,
the network between hosts) and which side opens its end first: the consumer
creates a ring; between hosts the instance manager's side listens (the
consumer's when both are instance managers), so the engine only ever
connects. A deployment is then set up in two steps on every process that
hosts a part of it, the engine included: *deploy* opens the ends that come
first (and reports ring addresses), *start* opens the others.
:func:`host_runners` builds the instances a process runs over its ends.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from functools import cache

from sparkcep.runtime.balancers import Router, bin_tables
from sparkcep.runtime.channels import (Doorbell, LocalChannel, RingConsumer, RingProducer, create_ring, tcp,
                                       unlink_quietly)
from sparkcep.runtime.channels import consumer as open_consumer
from sparkcep.runtime.channels import producer as open_producer
from sparkcep.runtime.handoff import Handoffs
from sparkcep.runtime.instance import InstanceRunner
from sparkcep.runtime.layout import ENGINE, Endpoint, Layout
from sparkcep.runtime.metrics import EpochClock

SHM, TCP = "shm", "tcp"


@dataclass
class ChannelPlan:
    """One channel of a deployment: ``transport``, the endpoint whose process opens its end
    first (``first``), and its address once known."""

    transport: str
    first: Endpoint
    address: str | None = None


@cache
def machine_id() -> str:
    """This machine's identity (two processes share memory only on the same one)."""
    for path in ("/etc/machine-id", "/proc/sys/kernel/random/boot_id"):
        try:
            with open(path) as f:
                if text := f.read().strip():
                    return text
        except OSError:
            pass
    return socket.gethostname()


def host_key(ip: str) -> str:
    """The host of a process serving on ``ip`` of this machine: processes of one host share rings.

    Each loopback address is a host of its own (127.0.0.2 and 127.0.0.3 talk
    over the network channel), so multi-host deployments can be tried on one machine.
    """
    return f"{machine_id()}/{ip}"


def plan_channels(layout: Layout, host_of: dict[Endpoint, str], address_of: dict[Endpoint, str | None],
                  deployment: str) -> dict[tuple[Endpoint, Endpoint], ChannelPlan]:
    """The plan of every channel of ``layout``.

    ``host_of``: the host key of every endpoint (ENGINE included);
    ``address_of``: the listening address of the instance manager running an
    endpoint (None for the engine, which never listens).
    """
    out = {}
    for p, c in layout.channels():
        if host_of[p] == host_of[c]:
            out[(p, c)] = ChannelPlan(SHM, c)
            continue
        listener = c if c != ENGINE else p
        out[(p, c)] = ChannelPlan(TCP, listener, f"tcp:{address_of[listener]}/{deployment}/{_name(p)}>{_name(c)}")
    return out


def _name(ep: Endpoint) -> str:
    return f"{ep[0]}.{ep[1]}"


@dataclass
class ChannelEnds:
    """The channel ends one process (an instance manager, or the engine) holds for one deployment.

    ``mine``: the endpoints the process runs; ``plans``: the channels touching
    them. Rings it consumes are created in ``shm_dir`` (consumers sleep on
    ``consumer_bell``; producers wait for room on ``producer_bell``);
    ``copy_of(consumer)``: whether batches received there must own their memory.
    """

    deployment: str
    plans: dict
    mine: set
    shm_dir: str
    consumer_bell: Doorbell
    producer_bell: Doorbell
    token: str
    ring_bytes: int
    copy_of: object = None
    batches_stay: bool = False  # the engine's sources keep their batches until the channels took them
    inputs: dict = field(default_factory=dict)  # (producer, consumer) -> consumer end
    outputs: dict = field(default_factory=dict)  # (producer, consumer) -> producer end
    waiting: dict = field(default_factory=dict)  # channel id -> a network end waiting for its peer

    def open_first(self) -> dict:
        """Deploy step: create the rings this process consumes, and the network ends it listens for;
        a channel between two of its own endpoints is an in-process queue.

        Returns the addresses of the rings made, for their producers.
        """
        made = {}
        tag = "".join(ch if ch.isalnum() else "_" for ch in self.deployment)
        for n, ((p, c), cp) in enumerate(self.plans.items()):
            if cp.first not in self.mine:
                continue
            if cp.transport == SHM and p in self.mine:  # both ends here: no ring, no copy
                self.inputs[(p, c)] = self.outputs[(p, c)] = LocalChannel(keeps_batches=True)
            elif cp.transport == SHM:  # we consume: the ring is ours to create
                path = os.path.join(self.shm_dir, f"{tag}-{n}")
                create_ring(path, self.ring_bytes, self.consumer_bell.path)
                copy = True if self.copy_of is None else self.copy_of(c)
                self.inputs[(p, c)] = RingConsumer(path, self.consumer_bell, copy=copy)
                made[(p, c)] = f"shm:{path}"
            else:  # we listen: the peer connects at start
                channel = tcp.parse_address(cp.address)[2]
                if c in self.mine:
                    self.waiting[channel] = self.inputs[(p, c)] = tcp.TcpConsumer(channel, copy=True)
                else:
                    self.waiting[channel] = self.outputs[(p, c)] = tcp.TcpProducer(channel)
        return made

    def open_rest(self, addresses: dict) -> None:
        """Start step: open the producer ends of rings others made, and connect to listening peers."""
        for (p, c), cp in self.plans.items():
            if p in self.mine and (p, c) not in self.outputs:
                self.outputs[(p, c)] = open_producer(addresses.get((p, c), cp.address), self.producer_bell,
                                                     batches_stay=self.batches_stay, token=self.token)
            if c in self.mine and (p, c) not in self.inputs:  # a network channel whose producer listens
                self.inputs[(p, c)] = open_consumer(cp.address, token=self.token)
        for end in self.outputs.values():
            if isinstance(end, RingProducer):
                end.map_pages()  # the consumer touched its ring first (NUMA placement)

    def unlink(self) -> None:
        """Remove this deployment's ring files (mapped by both ends, they live on until closed)."""
        tag = "".join(ch if ch.isalnum() else "_" for ch in self.deployment)
        try:
            names = os.listdir(self.shm_dir)
        except FileNotFoundError:  # the engine closed and removed its folder, rings and all
            return
        for name in names:
            if name.startswith(tag + "-"):
                unlink_quietly(os.path.join(self.shm_dir, name))

    def close(self) -> None:
        """Close every end at once (its generation is undeployed: nothing left in a channel is wanted)."""
        for end in self.inputs.values():
            end.close()
        for end in self.outputs.values():
            end.close_now()
        self.waiting.clear()
        self.unlink()


def host_runners(layout: Layout, bins: int, owners: dict[str, list[int]] | None, endpoints: list[Endpoint],
                 inputs: dict, outputs: dict, clock: EpochClock, handoffs: Handoffs) -> list[InstanceRunner]:
    """The runners of the instances ``endpoints`` one process hosts.

    ``inputs[(p, ep)]`` is the consumer end of each channel into them,
    ``outputs[(ep, c)]`` the producer end of each channel out of them;
    ``owners``: the current bin tables (default: contiguous ranges);
    ``handoffs``: where state handed over to this process arrives.
    """
    runners = []
    for ep in endpoints:
        router = Router(layout.routes(ep), {c: outputs[(ep, c)] for c in layout.consumers(ep)},
                        bin_tables(layout, bins, owners))
        runners.append(InstanceRunner(layout, ep, bins, {p: inputs[(p, ep)] for p in layout.producers(ep)},
                                      router, clock, handoffs))
    return runners


def source_router(layout: Layout, bins: int, owners: dict[str, list[int]] | None, outputs: dict) -> Router:
    """The engine's router: source batches into the instances reading them."""
    return Router(layout.routes(ENGINE), {c: outputs[(ENGINE, c)] for c in layout.consumers(ENGINE)},
                  bin_tables(layout, bins, owners))
