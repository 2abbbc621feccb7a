"""An instance manager's membership in a cluster: ``sparkcep worker --zk ...`` joins the registry.

The worker writes an ephemeral document at ``/members/<name>`` (address,
host, pid, cpus, NUMA node): the engine host adopts it for the next
placement, and its death removes it (the session ends with the process, or
expires). After a lost session the document is written again.
"""

from __future__ import annotations

import logging

from sparkcep.control import tree
from sparkcep.control.registry import Registry, RegistryError

log = logging.getLogger("sparkcep")


class Membership:
    """Keeps ``/members/<name>`` = ``info`` in ``registry`` for as long as this object is open, in every
    session (:class:`~sparkcep.control.registry.base.Presence`)."""

    def __init__(self, registry: Registry, name: str, info: dict):
        self.registry, self.name, self.info = registry, name, dict(info)
        path = tree.member(name)
        try:
            self.presence = registry.keep(path, self.info)
        except RegistryError as e:
            if e.code != "NODE_EXISTS":
                raise
            held = registry.get(path) or {}
            raise RegistryError(f"an instance manager named {name!r} is already a member of {registry!r} (pid "
                                f"{held.get('pid')} at {held.get('address')}); start this one with another --name",
                                "MEMBER_EXISTS", path) from None
        log.info("instance manager %s joined %r", name, registry)

    def close(self) -> None:
        self.presence.cancel(delete=False)  # it goes with the session
        self.registry.close()
