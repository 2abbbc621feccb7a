"""An instance manager's membership in a cluster: ``sparkcep worker --zk ...`` joins the registry.

The worker writes an ephemeral document at ``/members/<name>`` (address,
host, pid, cpus, NUMA node): the engine host adopts it for the next
placement, and its death removes it (the session ends with the process, or
expires). After a lost session the document is written again.

A worker started again under its name right after it died (a supervisor's
restart) finds the dead one's document until its session expires: it waits
that out, up to :data:`DEAD_SESSION_S`, when the pid there has ended on this
machine; a live holder of the name is refused at once.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from sparkcep.control import tree
from sparkcep.control.registry import Registry, RegistryError
from sparkcep.runtime.wiring import machine_id

log = logging.getLogger("sparkcep")

DEAD_SESSION_S = 60.0  # longer than ZooKeeper's default longest session (20 ticks of 2 s)


class Membership:
    """Keeps ``/members/<name>`` = ``info`` in ``registry`` for as long as this object is open, in every
    session (:class:`~sparkcep.control.registry.base.Presence`). ``say(text)`` is told once a second
    while a dead predecessor's session is waited out."""

    def __init__(self, registry: Registry, name: str, info: dict, say: Callable[[str], object] = log.info):
        self.registry, self.name, self.info = registry, name, dict(info)
        path = tree.member(name)
        start, told = time.monotonic(), None
        while True:
            try:
                self.presence = registry.keep(path, self.info)
                break
            except RegistryError as e:
                if e.code != "NODE_EXISTS":
                    raise
            held = registry.get(path)
            if held is None:  # it went between the two calls
                continue
            now = time.monotonic()
            if not ended_here(held) or now - start > DEAD_SESSION_S:
                ended = f", ended, its session still open after {now - start:.0f} s" if told else ""
                raise RegistryError(f"an instance manager named {name!r} is already a member of {registry!r} (pid "
                                    f"{held.get('pid')} at {held.get('address')}{ended}); start this one with "
                                    f"another --name", "MEMBER_EXISTS", path)
            if told is None or now - told >= 1.0:
                told = now
                say(f"waiting for the ZooKeeper session of the ended instance manager {name!r} (pid "
                    f"{held.get('pid')}) to expire {now - start:.0f}s")
            time.sleep(0.05)
        log.info("instance manager %s joined %r", name, registry)

    def close(self) -> None:
        self.presence.cancel(delete=False)  # it goes with the session
        self.registry.close()


def ended_here(member: dict) -> bool:
    """Whether the process of ``member`` (a document of ``/members``) ran on this machine and has ended
    (exited, or a zombie nobody reaped)."""
    pid = member.get("pid")
    if not isinstance(pid, int) or str(member.get("host", "")).split("/", 1)[0] != machine_id():
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True
