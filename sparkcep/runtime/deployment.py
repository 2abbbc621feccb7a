"""A deployed query: sub-query instances, the balancers between them, progress.

This is the in-process driver of a deployment (``Engine.local(workers=0)``):
every instance lives in the calling process and batches move by function
call. Instances only ever see batches and progress points, so the same
instances run unchanged inside instance-manager processes.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from sparkcep.core.operators import WM_END, WM_NONE
from sparkcep.core.subquery import SubQueryInstance
from sparkcep.errors import QueryError
from sparkcep.query.operators import Source
from sparkcep.query.planner import BROADCAST, Edge, Plan, plan
from sparkcep.query.query import Query
from sparkcep.runtime.balancers import Balancer, balancer_for
from sparkcep.runtime.output_log import OutputLog


@dataclass
class SourceState:
    """What the engine knows of one input stream: its event-time watermark and whether it ended."""

    max_ts: int = WM_NONE
    ended: bool = False

    @property
    def watermark(self) -> int:
        return WM_END if self.ended else self.max_ts


def parallelism_of(p: Plan, parallelism) -> dict[str, int]:
    """Instances per sub-query from an int or a dict {operator name: instances}."""
    if isinstance(parallelism, int):
        if parallelism < 1:
            raise QueryError(f"parallelism must be >= 1, got {parallelism}")
        out = {sq.name: parallelism if sq.parallelizable else 1 for sq in p.subqueries}
    elif isinstance(parallelism, dict):
        out = {sq.name: 1 for sq in p.subqueries}
        for name, n in parallelism.items():
            if name not in p.sq_of:
                raise QueryError(f"parallelism names operator {name!r}, which query {p.query.name!r} "
                                 f"does not have; operators: {sorted(p.sq_of)}")
            sq = p.sq_of[name]
            if not isinstance(n, int) or n < 1:
                raise QueryError(f"parallelism of {name!r} must be an int >= 1, got {n!r}")
            if n > 1 and not sq.parallelizable:
                raise QueryError(f"{name!r} is a global aggregate (no by=): it runs as one instance")
            out[sq.name] = n
    else:
        raise QueryError(f"parallelism must be an int or a dict {{operator name: instances}}, got {parallelism!r}")
    return out


class Deployment:
    """A query running in this process; made by :meth:`sparkcep.Engine.deploy`."""

    def __init__(self, query: Query, parallelism=1, bins: int = 128):
        if bins < 1 or bins & (bins - 1):
            raise QueryError(f"bins must be a power of two, got {bins}")
        self.query, self.bins = query, bins
        self.plan = plan(query)
        self.parallelism = parallelism_of(self.plan, parallelism)
        self.instances: dict[str, list[SubQueryInstance]] = {
            sq.name: [SubQueryInstance(self.plan, sq, i, bins) for i in range(self.parallelism[sq.name])]
            for sq in self.plan.subqueries}
        self.balancers: dict[int, Balancer] = {}
        self.edges_from: dict[str, list[Edge]] = {}
        for sq in self.plan.subqueries:
            for e in sq.inputs:
                self.balancers[id(e)] = balancer_for(e, self.parallelism[sq.name], bins)
                self.edges_from.setdefault(e.src.name, []).append(e)
        self.outputs_of: dict[str, list[str]] = {}
        for out, op in query.outputs.items():
            self.outputs_of.setdefault(op.name, []).append(out)
        self.logs: dict[str, OutputLog] = {}
        self.sources: dict[str, SourceState] = {name: SourceState() for name in query.sources}
        self.out_watermark: dict[str, int] = {}

    def explain(self) -> str:
        """The plan with the number of instances of each sub-query."""
        where = {sq.name: [f"instance {i}: in this process" for i in range(self.parallelism[sq.name])]
                 for sq in self.plan.subqueries}
        return self.plan.explain(where, self.parallelism)

    # --- data ------------------------------------------------------------------
    def push(self, stream: str, batch: pa.RecordBatch, max_ts: int) -> None:
        """Route a stamped source batch into the instances reading ``stream``."""
        self.sources[stream].max_ts = max(self.sources[stream].max_ts, max_ts)
        self._route(stream, batch, 0)

    def progress(self, frontier: int) -> None:
        """Every source row up to ``frontier`` is in: stateful instances consume and fire."""
        for sq in self.plan.subqueries:
            wm = min(self._watermark_of(e.src) for e in sq.inputs)
            for inst in self.instances[sq.name]:
                for name, b in inst.advance(frontier, wm):
                    self._route(name, b, inst.index)
            self.out_watermark[sq.name] = self.instances[sq.name][0].output_watermark(wm)

    def end(self, stream: str, frontier: int) -> None:
        self.sources[stream].ended = True
        self.progress(frontier)

    def _watermark_of(self, src) -> int:
        if isinstance(src, Source):
            return self.sources[src.name].watermark
        return self.out_watermark.get(self.plan.sq_of[src.name].name, WM_NONE)

    def _route(self, src_name: str, batch: pa.RecordBatch, partition: int) -> None:
        """Deliver a batch produced by ``src_name`` (in instance ``partition``) to its consumers."""
        for out in self.outputs_of.get(src_name, ()):
            self.logs[out].append(partition, batch)
        for e in self.edges_from.get(src_name, ()):
            instances = self.instances[self.plan.sq_of[e.dst.name].name]
            for i, part in self.balancers[id(e)].split(batch):
                for name, b in instances[i].process(e, part):
                    self._route(name, b, i)

    # --- state -----------------------------------------------------------------
    def late_tuples(self) -> dict[str, int]:
        """Late tuples per stateful operator (summed over instances)."""
        out: dict[str, int] = {}
        for sq in self.plan.subqueries:
            broadcast = [e.port for e in sq.inputs if e.balancer == BROADCAST]
            for i, inst in enumerate(self.instances[sq.name]):
                op = inst.stateful
                if op is not None and hasattr(op, "late"):
                    n = op.late
                    if i and broadcast:  # every instance sees a broadcast input: count its tuples once
                        n -= sum(op.late_by_port[p] for p in broadcast)
                    out[sq.head.name] = out.get(sq.head.name, 0) + n
        return out
