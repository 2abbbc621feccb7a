"""The control plane's registry: shared documents, membership, leases (DESIGN.md §6).

One interface (:class:`Registry`, semantics in :mod:`.base`), two backends:
:class:`ZkRegistry` (ZooKeeper through kazoo) and :class:`EmbeddedRegistry`
(in-process); :func:`open_registry` picks one by address.

Suggested layout under the root (sealed: :func:`sparkcep.auth.seal`):

* ``/members/<member-id>``: ephemeral, one per live instance manager
  (address, host, NUMA nodes, pid); watch the children for membership.
* ``/orchestrators/<id>``: ephemeral, one per running orchestrator.
* ``/leases/orchestrator``: the orchestrator lease
  (``lease("orchestrator", id)``; ``leader("orchestrator")`` reads the holder).
* ``/deployments/<deployment-id>``: the deployment record, sealed; under it
  ``placement/<subquery>-<instance>`` (member, NUMA node) and ``bins``
  (bin -> instance), written together in one transaction.
"""

from __future__ import annotations

import re

from sparkcep.control.registry.base import Registry, Transaction, Watch
from sparkcep.control.registry.embedded import EmbeddedRegistry, Store
from sparkcep.control.registry.lease import Lease
from sparkcep.control.registry.nodes import MAX_DOCUMENT, RegistryError, State
from sparkcep.control.registry.zk import ZkRegistry

__all__ = ["MAX_DOCUMENT", "EmbeddedRegistry", "Lease", "Registry", "RegistryError", "State", "Store",
           "Transaction", "Watch", "ZkRegistry", "open_registry"]

_HOST = r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?:\d{1,5}"
_ZK = re.compile(rf"zk://({_HOST}(?:,{_HOST})*)(/.*)?")
FORMS = "zk://HOST:PORT[,HOST:PORT...]/PATH (e.g. zk://127.0.0.1:2181/sparkcep) or embedded"


def open_registry(address: str, **options) -> Registry:
    """A registry session at ``address``: ``zk://HOST:PORT[,HOST:PORT...][/PATH]`` (root PATH, default
    ``/sparkcep``) or ``embedded`` (a new in-process store). ``options`` go to the backend
    (``session_timeout``, ``timeout`` and ``token`` — the cluster's, to write — are ZkRegistry's; the embedded
    one ignores them). BAD_ADDRESS naming the expected form otherwise."""
    if address == "embedded":  # nothing to time out or to authenticate in-process
        return EmbeddedRegistry(**{k: v for k, v in options.items()
                                   if k not in ("session_timeout", "timeout", "token")})
    match = _ZK.fullmatch(address) if isinstance(address, str) else None
    if match is None or any(not 0 < int(h.rpartition(":")[2]) < 65536 for h in match[1].split(",")):
        raise RegistryError(f"bad registry address {address!r}: expected {FORMS}", "BAD_ADDRESS")
    return ZkRegistry(match[1], match[2] or "/sparkcep", **options)
