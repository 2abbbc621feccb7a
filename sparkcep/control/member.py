"""An instance manager's membership in a cluster: ``sparkcep worker --zk ...`` joins the registry.

The worker writes an ephemeral document at ``/members/<name>`` (address,
host, pid, cpus, NUMA node): the engine host adopts it for the next
placement, and its death removes it (the session ends with the process, or
expires). After a lost session the document is written again.
"""

from __future__ import annotations

import logging

from sparkcep.control import tree
from sparkcep.control.registry import Registry, RegistryError, State

log = logging.getLogger("sparkcep")


class Membership:
    """Keeps ``/members/<name>`` = ``info`` in ``registry`` for as long as this object is open."""

    def __init__(self, registry: Registry, name: str, info: dict):
        self.registry, self.name, self.info = registry, name, dict(info)
        self._join()
        registry.add_listener(self._on_state)

    def _join(self) -> None:
        path = tree.member(self.name)
        try:
            self.registry.create(path, self.info, ephemeral=True)
        except RegistryError as e:
            if e.code != "NODE_EXISTS":
                raise
            held = self.registry.get(path) or {}
            if held.get("pid") != self.info.get("pid") or held.get("address") != self.info.get("address"):
                raise RegistryError(f"an instance manager named {self.name!r} is already a member of "
                                    f"{self.registry!r} (pid {held.get('pid')} at {held.get('address')}); "
                                    "start this one with another --name", "MEMBER_EXISTS", path) from None
        log.info("instance manager %s joined %r", self.name, self.registry)

    def _on_state(self, state: State) -> None:
        if state is State.CONNECTED and self.registry.get(tree.member(self.name)) is None:
            self.registry.call_soon(self._join)  # a new session after a lost one

    def close(self) -> None:
        self.registry.remove_listener(self._on_state)
        self.registry.close()
