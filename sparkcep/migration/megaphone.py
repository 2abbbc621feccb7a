"""Megaphone's mechanism (§3.4) over the runtime's control records: bins move between running instances.

One step is three records sent into every replica at one epoch: ``Export``
(each old owner, once it consumed everything before the epoch, takes the
moving bins — their window and join state and the tuples still pending for
them — and hands them over), ``Configure`` (every router sends the bins'
tuples of that epoch on to their new owners) and ``Import`` (each new owner
installs the bins before it consumes anything of that epoch). The step is
over when every import is installed; the next one starts then (after
``gap_s``).
"""

from __future__ import annotations

import itertools
import time

from sparkcep.migration.plan import Move
from sparkcep.runtime.channels import Configure, Export, Import

_tickets = itertools.count(1)


def ticket(dep, operator: str, src: int, dst: int) -> str:
    """A name, unique in this process, for state of ``operator`` going from instance ``src`` to ``dst``."""
    return f"{dep.id}/{next(_tickets)}/{operator}:{src}>{dst}"


def step_records(dep, operator: str, moves: list[Move]):
    """The records of one step of ``dep`` (a replica) making ``moves``, and their tickets."""
    sq = dep.plan.sq_of[operator].name
    groups: dict[tuple[int, int], list[int]] = {}
    for b, src, dst in moves:
        groups.setdefault((src, dst), []).append(b)
    exports, imports = [], []
    for (src, dst), bins in groups.items():
        t = ticket(dep, operator, src, dst)
        exports.append([src, t, dep.host_of((sq, dst)), "take", bins])
        imports.append([dst, t])
    configure = Configure(0, 0, operator, [b for b, _, _ in moves], [dst for _, _, dst in moves])
    records = [Export(0, 0, operator, exports), configure, Import(0, 0, operator, imports)]
    return records, [t for _, t in imports]


def migrate_bins(replicas, lock, operator: str, steps: list[list[Move]], watch, each, gap_s: float = 0.0) -> None:
    """Run ``steps`` on every replica (each a runtime deployment), step after step; ``watch`` counts them.

    ``each(replicas, act)`` runs ``act`` on each replica and returns those it ran on: a replica it
    leaves out (one that failed) takes no further step.
    """
    for k, step in enumerate(steps):
        tickets = {}

        def send(dep):
            records, tickets[dep] = step_records(dep, operator, step)
            dep.control(*records)
        with lock:  # between two epochs: the same epoch in every replica
            replicas = each(replicas, send)

        def await_step(dep):
            watch.bytes += dep.await_handoffs(tickets[dep])
        replicas = each(replicas, await_step)
        watch.bins += len(step)
        watch.steps += 1
        if gap_s and k + 1 < len(steps):
            time.sleep(gap_s)

