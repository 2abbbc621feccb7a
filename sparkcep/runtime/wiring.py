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

import socket
from dataclasses import dataclass
from functools import cache

from sparkcep.runtime.balancers import Router, bin_tables
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


def host_runners(layout: Layout, bins: int, owners: dict[str, list[int]] | None, endpoints: list[Endpoint],
                 inputs: dict, outputs: dict, clock: EpochClock) -> list[InstanceRunner]:
    """The runners of the instances ``endpoints`` one process hosts.

    ``inputs[(p, ep)]`` is the consumer end of each channel into them,
    ``outputs[(ep, c)]`` the producer end of each channel out of them;
    ``owners``: the current bin tables (default: contiguous ranges).
    """
    runners = []
    for ep in endpoints:
        router = Router(layout.routes(ep), {c: outputs[(ep, c)] for c in layout.consumers(ep)},
                        bin_tables(layout, bins, owners))
        runners.append(InstanceRunner(layout, ep, bins, {p: inputs[(p, ep)] for p in layout.producers(ep)},
                                      router, clock))
    return runners


def source_router(layout: Layout, bins: int, owners: dict[str, list[int]] | None, outputs: dict) -> Router:
    """The engine's router: source batches into the instances reading them."""
    return Router(layout.routes(ENGINE), {c: outputs[(ENGINE, c)] for c in layout.consumers(ENGINE)},
                  bin_tables(layout, bins, owners))
