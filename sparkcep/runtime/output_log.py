"""The output log of a query output: every batch it produced, per partition, in order.

A partition is one producing instance of the output's sub-query, so rows of
one partition keep their production order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import pyarrow as pa


@dataclass
class OutputLog:
    schema: pa.Schema
    partitions: dict[int, list[pa.RecordBatch]] = field(default_factory=dict)
    subscribers: list[Callable[[pa.RecordBatch], None]] = field(default_factory=list)
    rows: int = 0

    def append(self, partition: int, batch: pa.RecordBatch) -> None:
        visible = batch.select(self.schema.names)
        self.partitions.setdefault(partition, []).append(visible)
        self.rows += batch.num_rows
        for fn in self.subscribers:
            fn(visible)

    def table(self) -> pa.Table:
        """Every retained row, partition after partition."""
        return pa.Table.from_batches([b for p in sorted(self.partitions) for b in self.partitions[p]],
                                     schema=self.schema)
