"""Who sends to whom in one deployment: endpoints, ports and channels.

An *endpoint* is the engine (``ENGINE``: it hosts the sources and the output
logs) or one sub-query instance ``(sub-query name, index)``. There is one
channel per (producer, consumer) pair that an edge or an output connects;
each message on it names its *port*: an edge of the plan (its index in
:attr:`Layout.edges`), or an output operator (ports after the edges, see
:meth:`Layout.output_names`). The engine process and every instance manager
compute the same layout from the same plan and parallelism, so only names
and numbers cross process boundaries.
"""

from __future__ import annotations

from sparkcep.query.operators import Source
from sparkcep.query.planner import Edge, Plan, SubQuery

ENGINE = ("engine", 0)
Endpoint = tuple[str, int]


class Layout:
    def __init__(self, plan: Plan, parallelism: dict[str, int]):
        self.plan, self.parallelism = plan, parallelism
        self.edges: list[Edge] = plan.edges()
        self.port_of = {id(e): i for i, e in enumerate(self.edges)}
        self.out_ops: list[str] = list(dict.fromkeys(op.name for op in plan.query.outputs.values()))
        self.out_port = {name: len(self.edges) + j for j, name in enumerate(self.out_ops)}
        self.outputs_of: dict[str, list[str]] = {}  # output operator -> output stream names
        for out, op in plan.query.outputs.items():
            self.outputs_of.setdefault(op.name, []).append(out)
        self.edges_from: dict[str, list[Edge]] = {}
        for e in self.edges:
            self.edges_from.setdefault(e.src.name, []).append(e)
        self.sq = {sq.name: sq for sq in plan.subqueries}

    # --- endpoints -------------------------------------------------------------------------
    def instances(self) -> list[Endpoint]:
        return [(sq.name, i) for sq in self.plan.subqueries for i in range(self.parallelism[sq.name])]

    def sq_of(self, op) -> SubQuery:
        return self.plan.sq_of[op.name]

    def sources_of(self, sq: SubQuery) -> list[str]:
        """Input streams read directly by ``sq``."""
        return list(dict.fromkeys(e.src.name for e in sq.inputs if isinstance(e.src, Source)))

    def producers(self, consumer: Endpoint) -> list[Endpoint]:
        """Endpoints sending to ``consumer``, in the order their data is fed to it (engine first)."""
        if consumer == ENGINE:
            return [(sq.name, i) for sq in self.plan.subqueries if self._has_outputs(sq)
                    for i in range(self.parallelism[sq.name])]
        sq = self.sq[consumer[0]]
        out = [ENGINE] if self.sources_of(sq) else []
        ups = list(dict.fromkeys(self.sq_of(e.src).name for e in sq.inputs if not isinstance(e.src, Source)))
        ups.sort(key=lambda name: self.sq[name].id)
        out += [(u, i) for u in ups for i in range(self.parallelism[u])]
        return out

    def consumers(self, producer: Endpoint) -> list[Endpoint]:
        """Endpoints ``producer`` sends to (the engine last when it has outputs)."""
        if producer == ENGINE:
            return [(sq.name, i) for sq in self.plan.subqueries if self.sources_of(sq)
                    for i in range(self.parallelism[sq.name])]
        sq = self.sq[producer[0]]
        downs = list(dict.fromkeys(self.sq_of(e.dst).name for op in sq.operators
                                   for e in self.edges_from.get(op.name, ())))
        downs.sort(key=lambda name: self.sq[name].id)
        out = [(d, i) for d in downs for i in range(self.parallelism[d])]
        return out + ([ENGINE] if self._has_outputs(sq) else [])

    def channels(self) -> list[tuple[Endpoint, Endpoint]]:
        """Every (producer, consumer) pair of the deployment."""
        return [(p, c) for c in self.instances() + [ENGINE] for p in self.producers(c)]

    def _has_outputs(self, sq: SubQuery) -> bool:
        return any(op.name in self.outputs_of for op in sq.operators)

    # --- ports -----------------------------------------------------------------------------
    def routes(self, producer: Endpoint) -> dict[str, list[tuple[int, Edge | None, list[Endpoint]]]]:
        """For each operator whose batches leave ``producer``: (port, edge or None for an output, targets)."""
        names = self.layout_exits(producer)
        out: dict[str, list] = {}
        for name in names:
            routes = []
            if name in self.out_port:
                routes.append((self.out_port[name], None, [ENGINE]))
            for e in self.edges_from.get(name, ()):
                dst = self.sq_of(e.dst).name
                routes.append((self.port_of[id(e)], e, [(dst, j) for j in range(self.parallelism[dst])]))
            out[name] = routes
        return out

    def layout_exits(self, producer: Endpoint) -> list[str]:
        if producer == ENGINE:
            return list(self.plan.query.sources)
        sq = self.sq[producer[0]]
        return [op.name for op in sq.operators if op.name in self.out_port or op.name in self.edges_from]

    def output_names(self, port: int) -> list[str]:
        return self.outputs_of[self.out_ops[port - len(self.edges)]]
