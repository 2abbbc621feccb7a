"""Split a query into sub-queries and choose the balancer on every edge.

UPM-CEP §4: a new sub-query starts at every stateful operator and at every
operator with more than one input; consecutive stateless operators stay in
one sub-query (those reading a source directly share the source's first
sub-query). The balancer into a sub-query follows from its first operator:
route-key on the group-by / equi-join fields, broadcast for the second input
of a non-equi join, round-robin into stateless operators, point-to-point when
the target runs a single instance.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkcep.errors import QueryError
from sparkcep.query.operators import Aggregate, Custom, Join, Operator, Source

POINT_TO_POINT, ROUND_ROBIN, ROUTE_KEY, BROADCAST = "point-to-point", "round-robin", "route-key", "broadcast"


@dataclass
class Edge:
    """Tuples of ``src``'s output flow into input ``port`` of ``dst`` through a balancer."""

    src: Operator
    dst: Operator
    port: int
    balancer: str
    keys: list[str] = field(default_factory=list)

    def describe(self) -> str:
        return f"{self.balancer}({', '.join(self.keys)})" if self.keys else self.balancer


@dataclass
class SubQuery:
    id: int
    operators: list[Operator]
    inputs: list[Edge] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"SQ{self.id}"

    @property
    def head(self) -> Operator:
        return self.operators[0]

    @property
    def parallelizable(self) -> bool:
        """False for a global (no group-by) aggregate or custom operator: one instance only."""
        return not (isinstance(self.head, (Aggregate, Custom)) and not self.head.by)


@dataclass
class Plan:
    query: object  # the sparkcep.Query planned
    subqueries: list[SubQuery]
    sq_of: dict[str, SubQuery]  # operator name -> its sub-query (sources absent)

    def edges(self) -> list[Edge]:
        return [e for sq in self.subqueries for e in sq.inputs]

    def explain(self, placement: dict[str, list[str]] | None = None, parallelism: dict[str, int] | None = None) -> str:
        lines = [f"query {self.query.name}: {len(self.subqueries)} sub-queries"]
        for sq in self.subqueries:
            n = (parallelism or {}).get(sq.name)
            lines.append(f"  {sq.name}" + (f" x{n}" if n else "") + ": " + " -> ".join(
                f"{op.name}[{op.describe()}]" for op in sq.operators))
            for e in sq.inputs:
                src = e.src.name if isinstance(e.src, Source) else f"{self.sq_of[e.src.name].name}.{e.src.name}"
                balancer = POINT_TO_POINT if n == 1 and e.balancer != BROADCAST else e.describe()
                lines.append(f"      in {e.port}: {src} --{balancer}--> {e.dst.name}")
            for where in (placement or {}).get(sq.name, []):
                lines.append(f"      {where}")
        for out, op in self.query.outputs.items():
            lines.append(f"  output {out} <- {self.sq_of[op.name].name}.{op.name}")
        return "\n".join(lines)


def plan(query) -> Plan:
    """The sub-query plan of ``query`` (only operators that feed an output)."""
    if not query.outputs:
        raise QueryError(f"query {query.name!r} has no output; declare one with q.output(name, stream)")
    live = _feeding_outputs(query)
    subqueries: list[SubQuery] = []
    sq_of: dict[str, SubQuery] = {}
    source_sq: dict[str, SubQuery] = {}
    for op in query.operators:
        if op.name not in live or isinstance(op, Source):
            continue
        (first, *_) = op.inputs
        starts_new = op.stateful or len(op.inputs) > 1
        if not starts_new and isinstance(first, Source) and first.name in source_sq:
            sq = source_sq[first.name]
            sq.operators.append(op)
        elif not starts_new and not isinstance(first, Source):
            sq = sq_of[first.name]
            sq.operators.append(op)
        else:
            sq = SubQuery(len(subqueries) + 1, [op])
            subqueries.append(sq)
            if not starts_new:
                source_sq[first.name] = sq
        sq_of[op.name] = sq
        for port, src in enumerate(op.inputs):
            if isinstance(src, Source) or sq_of[src.name] is not sq:
                sq.inputs.append(_edge(src, op, port))
    return Plan(query, subqueries, sq_of)


def _edge(src: Operator, dst: Operator, port: int) -> Edge:
    if isinstance(dst, (Aggregate, Custom)):
        return Edge(src, dst, port, ROUTE_KEY, list(dst.by)) if dst.by else Edge(src, dst, port, POINT_TO_POINT)
    if isinstance(dst, Join):
        if dst.on:
            return Edge(src, dst, port, ROUTE_KEY, [pair[port] for pair in dst.on])
        return Edge(src, dst, port, ROUND_ROBIN if port == 0 else BROADCAST)
    return Edge(src, dst, port, ROUND_ROBIN)


def _feeding_outputs(query) -> set[str]:
    live, todo = set(), list(query.outputs.values())
    while todo:
        op = todo.pop()
        if op.name not in live:
            live.add(op.name)
            todo.extend(op.inputs)
    return live
