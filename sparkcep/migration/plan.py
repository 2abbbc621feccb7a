"""Which bins move where, in which steps: Megaphone's strategies (§3.3) as plain functions.

A migration is a list of *moves* ``(bin, from instance, to instance)``; a
strategy cuts it into *steps*, each one configuration update applied at one
epoch:

* ``all-at-once``: every move in one step;
* ``fluid``: one bin per step, each awaited before the next;
* ``batched``: steps of at most ``batch`` bins per pair of instances, the
  pairs of one step never sharing a source or a target (their transfers
  do not queue behind each other), with a gap between steps.
"""

from __future__ import annotations

from sparkcep.arguments import did_you_mean, integer
from sparkcep.errors import QueryError

STRATEGIES = ("all-at-once", "fluid", "batched")
Move = tuple[int, int, int]  # (bin, from instance, to instance)


def check_strategy(strategy: str) -> str:
    if strategy not in STRATEGIES:
        raise QueryError(f"unknown migration strategy {strategy!r}"
                         f"{did_you_mean(strategy, STRATEGIES)}; strategies: {', '.join(STRATEGIES)}",
                         "BAD_STRATEGY")
    return strategy


def moves_between(old: list[int], new: list[int]) -> list[Move]:
    """The moves turning bin table ``old`` into ``new``, by bin."""
    return [(b, o, n) for b, (o, n) in enumerate(zip(old, new)) if o != n]


def steps(moves: list[Move], strategy: str, batch: int = 16) -> list[list[Move]]:
    """The moves cut into the steps of ``strategy``."""
    check_strategy(strategy)
    if not moves:
        return []
    if strategy == "all-at-once":
        return [list(moves)]
    if strategy == "fluid":
        return [[m] for m in moves]
    pending: dict[tuple[int, int], list[Move]] = {}
    for m in moves:
        pending.setdefault((m[1], m[2]), []).append(m)
    out = []
    while pending:
        step, sources, targets = [], set(), set()
        for (src, dst), ms in list(pending.items()):
            if src in sources or dst in targets:
                continue
            sources.add(src)
            targets.add(dst)
            step += ms[:batch]
            del ms[:batch]
            if not ms:
                del pending[(src, dst)]
        out.append(step)
    return out


def even_owners(owners: list[int], instances: int) -> list[int]:
    """A bin table over ``instances`` instances, each holding ``bins / instances`` bins (give or take
    one), that keeps every bin it can where it is: the fewest moves to even the load."""
    bins = len(owners)
    quota = [bins // instances + (1 if i < bins % instances else 0) for i in range(instances)]
    held = [0] * instances
    new = list(owners)
    loose = []
    for b, o in enumerate(owners):
        if o < instances and held[o] < quota[o]:
            held[o] += 1
        else:
            loose.append(b)
    for b in loose:
        i = min(range(instances), key=lambda k: (held[k] - quota[k], k))
        new[b] = i
        held[i] += 1
    return new


def assignment_of(assignment) -> dict[int, int]:
    """``{bin: instance}`` from any mapping of integers (numpy's too): QueryError BAD_BIN / BAD_INSTANCE."""
    if not hasattr(assignment, "items"):
        raise QueryError(f"migrate() takes {{bin: instance}}, got {type(assignment).__name__} (a list of every "
                         f"bin's owner, as bin_owners() gives, goes as dict(enumerate(owners)))", "BAD_BIN")
    out = {}
    for b, i in assignment.items():
        b = integer(b, "a bin", code="BAD_BIN")
        out[b] = integer(i, f"the instance for bin {b}", code="BAD_INSTANCE")
    return out


def table_from(owners: list[int], assignment, instances: int) -> list[int]:
    """``owners`` changed by ``assignment`` {bin: instance}, each checked (QueryError BAD_BIN / BAD_INSTANCE)."""
    new = list(owners)
    for b, i in assignment_of(assignment).items():
        if not 0 <= b < len(owners):
            raise QueryError(f"bin {b} is out of range: the operator has bins 0..{len(owners) - 1}", "BAD_BIN")
        if not 0 <= i < instances:
            raise QueryError(f"instance {i} (for bin {b}) does not exist: the operator has instances "
                             f"0..{instances - 1}", "BAD_INSTANCE")
        new[b] = i
    return new
