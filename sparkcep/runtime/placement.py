"""Placement: which core each instance manager gets, and which instance manager each instance.

* :func:`im_slots`: instance managers take cores node by node, starting at
  node 0 and moving to the nearest node once one is full (wrapping around,
  several per core, when there are more instance managers than cores).
* :func:`place`: sub-queries that exchange the most data go on the same NUMA
  node — sub-queries are merged along their heaviest edges while the group
  still fits a node, and each group goes to the node that minimises traffic
  x distance to the groups already placed — and the instances of one
  sub-query spread over distinct cores (instance managers) of that node.

``traffic`` weighs the edges between sub-queries: ``{(from sq, to sq):
weight}`` — measured bytes once metrics exist, 1 per edge by default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sparkcep.query.operators import Source
from sparkcep.runtime.layout import Endpoint, Layout
from sparkcep.runtime.topology import Topology


@dataclass(frozen=True)
class Slot:
    """Instance manager ``index`` runs on ``cpu`` of NUMA ``node``."""

    index: int
    cpu: int
    node: int


def im_slots(topology: Topology, n: int, first_node: int = 0) -> list[Slot]:
    """Cores for ``n`` instance managers: fill the nearest nodes first."""
    order = [c for node in topology.by_distance(first_node) for c in topology.nodes[node]]
    if not order:
        raise ValueError(f"topology {topology.source} has no CPUs")
    return [Slot(i, order[i % len(order)], topology.node_of(order[i % len(order)])) for i in range(n)]


def default_traffic(layout: Layout) -> dict[tuple[str, str], float]:
    """1 per edge between two sub-queries (summed over parallel edges)."""
    out: dict[tuple[str, str], float] = {}
    for e in layout.edges:
        if isinstance(e.src, Source):
            continue
        key = (layout.sq_of(e.src).name, layout.sq_of(e.dst).name)
        out[key] = out.get(key, 0.0) + 1.0
    return out


def place(layout: Layout, slots: list[Slot], topology: Topology,
          traffic: dict[tuple[str, str], float] | None = None,
          load: dict[int, int] | None = None) -> dict[Endpoint, int]:
    """Instance manager (slot index) of every instance of the deployment.

    ``load``: instances already on each slot (from other deployments).
    """
    traffic = default_traffic(layout) if traffic is None else traffic
    sizes = {sq: n for sq, n in layout.parallelism.items()}
    load = dict.fromkeys((s.index for s in slots), 0) | (load or {})
    total = sum(sizes.values()) + sum(load.values())
    cap = max(1, math.ceil(total / len(slots)))  # instances per instance manager
    by_node: dict[int, list[Slot]] = {}
    for s in slots:
        by_node.setdefault(s.node, []).append(s)
    free = {node: sum(cap - load[s.index] for s in ss) for node, ss in by_node.items()}
    room = max(len(ss) for ss in by_node.values()) * cap

    # 1. groups: merge sub-queries along the heaviest edges while a group fits one node
    group = {sq: sq for sq in sizes}

    def find(sq):
        while group[sq] != sq:
            sq = group[sq]
        return sq

    for (a, b), w in sorted(traffic.items(), key=lambda kv: (-kv[1], kv[0])):
        ga, gb = find(a), find(b)
        if ga != gb and _size(ga, group, sizes, find) + _size(gb, group, sizes, find) <= room:
            group[gb] = ga
    groups: dict[str, list[str]] = {}
    for sq in sizes:
        groups.setdefault(find(sq), []).append(sq)

    # 2. nodes: heaviest groups first, each where traffic x distance to placed partners is least
    node_of: dict[str, int] = {}

    def weight(members):
        inner = sum(w for (a, b), w in traffic.items() if a in members and b in members)
        return (-inner, -sum(sizes[m] for m in members), min(layout.sq[m].id for m in members))

    def cost(node, members):
        c = 0.0
        for (a, b), w in traffic.items():
            for x, y in ((a, b), (b, a)):
                if x in members and y in node_of:
                    c += w * topology.distance(node, node_of[y])
        return c

    for members in sorted(groups.values(), key=weight):
        need = sum(sizes[m] for m in members)
        fits = [n for n in by_node if free[n] >= need]
        if fits:
            node = min(fits, key=lambda n: (cost(n, members), -free[n], n))
            for m in members:
                node_of[m] = node
            free[node] -= need
            continue
        for m in sorted(members, key=lambda m: layout.sq[m].id):  # too big for one node: sub-query by sub-query
            node = min(by_node, key=lambda n: (free[n] < sizes[m], cost(n, [m]), -free[n], n))
            node_of[m] = node
            free[node] -= sizes[m]

    # 3. cores: spread each sub-query's instances over distinct instance managers of its node,
    #    spilling to the nearest nodes when its node is full
    out: dict[Endpoint, int] = {}
    for sq in sorted(sizes, key=lambda m: layout.sq[m].id):
        used: dict[int, int] = {}
        for i in range(sizes[sq]):
            best = None
            for node in topology.by_distance(node_of[sq]):
                cands = [s for s in by_node.get(node, ()) if load[s.index] < cap]
                if cands:
                    best = min(cands, key=lambda s: (used.get(s.index, 0), load[s.index], s.index))
                    break
            if best is None:  # every instance manager is at capacity: least loaded anywhere
                best = min(slots, key=lambda s: (used.get(s.index, 0), load[s.index], s.index))
            out[(sq, i)] = best.index
            used[best.index] = used.get(best.index, 0) + 1
            load[best.index] += 1
    return out


def _size(root, group, sizes, find) -> int:
    return sum(n for sq, n in sizes.items() if find(sq) == root)


def extend(assignment: dict[Endpoint, int], layout: Layout, slots: list[Slot],
           load: dict[int, int]) -> dict[Endpoint, int]:
    """``assignment`` plus a slot for every instance of ``layout`` it lacks (new instances of a rescaled
    sub-query): the live slot with the fewest instances of that sub-query, then the least loaded."""
    out = dict(assignment)
    load = dict.fromkeys((s.index for s in slots), 0) | dict(load)
    for ep in layout.instances():
        if ep in out:
            continue
        same = {i: sum(1 for e, at in out.items() if e[0] == ep[0] and at == i) for i in load}
        best = min(slots, key=lambda s: (same[s.index], load[s.index], s.index))
        out[ep] = best.index
        load[best.index] += 1
    return out
