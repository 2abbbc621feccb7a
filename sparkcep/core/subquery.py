"""One instance of a sub-query: its operators wired together in one process."""

from __future__ import annotations

from typing import Iterator

import pyarrow as pa

from sparkcep.core.operators import PhysicalOperator, StatefulOp, physical
from sparkcep.errors import OperatorError
from sparkcep.query.operators import LateRows
from sparkcep.query.planner import Edge, Plan, SubQuery


class SubQueryInstance:
    """Runs the operators of ``sq``; returns what leaves it, per exiting operator name.

    ``exits`` are the operators whose output another sub-query or a query
    output consumes. Whatever an operator raises comes out as an
    :class:`~sparkcep.errors.OperatorError` naming the operator and its query.
    """

    def __init__(self, plan: Plan, sq: SubQuery, index: int, bins: int):
        self.sq, self.index = sq, index
        self.ops: dict[str, PhysicalOperator] = {op.name: physical(op, bins) for op in sq.operators}
        mine = set(self.ops)
        self.consumers: dict[str, list[tuple[str, int]]] = {name: [] for name in mine}
        for op in sq.operators:
            if isinstance(op, LateRows):  # fed by its aggregate's late tuples, not by its output
                continue
            for port, src in enumerate(op.inputs):
                if src.name in mine:
                    self.consumers[src.name].append((op.name, port))
        self.exits = {e.src.name for e in plan.edges() if e.src.name in mine}
        self.exits |= {op.name for op in plan.query.outputs.values() if op.name in mine}

    @property
    def head(self) -> PhysicalOperator:
        return self.ops[self.sq.head.name]

    def process(self, edge: Edge, batch: pa.RecordBatch) -> list[tuple[str, pa.RecordBatch]]:
        """Feed a batch arriving on ``edge``; returns (exiting operator, batch) pairs."""
        out: list[tuple[str, pa.RecordBatch]] = []
        self._push(edge.dst.name, edge.port, batch, out)
        return out

    def advance(self, frontier: int, watermark: int) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Progress to (``frontier``, ``watermark``); a stateful head consumes and fires.

        Yields (exiting operator, batch) pairs as they are produced.
        """
        name = self.sq.head.name
        batches = iter(self.head.advance(frontier, watermark))
        while True:
            try:
                b = next(batches)
            except StopIteration:
                yield from self._late()
                return
            except OperatorError:
                raise
            except Exception as e:
                raise self._failed(name, e) from e
            out: list[tuple[str, pa.RecordBatch]] = []
            self._emit(name, b, out)
            yield from out
            yield from self._late()

    def settle(self) -> None:
        """Let a stateful head consume what its last advance left for after the results were out. Failing
        here fails the deployment after that epoch's results are out, which do not read these rows."""
        if self.stateful is not None:
            try:
                self.stateful.settle()
            except Exception as e:
                raise self._failed(self.sq.head.name, e) from e

    def _late(self) -> Iterator[tuple[str, pa.RecordBatch]]:
        """The late tuples the head put aside, as the output of its LateRows operator."""
        head = self.head
        late = getattr(head.op, "late_output", None)
        while getattr(head, "late_batches", None):
            batch = head.late_batches.pop(0)
            if late is not None and late.name in self.ops:
                out: list[tuple[str, pa.RecordBatch]] = []
                self._emit(late.name, batch, out)
                yield from out

    def output_watermark(self, watermark: int) -> int:
        return self.head.output_watermark(watermark)

    @property
    def stateful(self) -> StatefulOp | None:
        return self.head if isinstance(self.head, StatefulOp) else None

    def _push(self, name: str, port: int, batch: pa.RecordBatch, out) -> None:
        try:
            produced = self.ops[name].process(port, batch)
        except OperatorError:
            raise
        except Exception as e:
            raise self._failed(name, e) from e
        for b in produced:
            self._emit(name, b, out)

    def _failed(self, name: str, e: Exception) -> OperatorError:
        op = self.ops[name].op
        return OperatorError(f"query {op.query.name}: operator {name!r} ({op.describe()}) of {self.sq.name}"
                             f"[{self.index}] failed: {type(e).__name__}: {e}")

    def _emit(self, name: str, batch: pa.RecordBatch, out) -> None:
        if batch.num_rows == 0:
            return
        if name in self.exits:
            out.append((name, batch))
        for consumer, port in self.consumers[name]:
            self._push(consumer, port, batch, out)
