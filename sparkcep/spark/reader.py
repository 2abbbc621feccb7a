"""Reading engine outputs into Spark: batch and streaming readers over the output log.

Offsets are ``{"positions": {"<partition>": position}}``: per output partition,
the position (row count since that partition's first row) up to which rows are
included. A micro-batch reads ``[start, end)`` of each partition, rows stay in
the engine until :meth:`StreamReader.commit`, so a query restarted from its
checkpoint re-reads exactly the ranges it had planned but not committed.

Planning (``initialOffset``, ``latestOffset``, ``partitions``, ``commit``)
runs in Spark's driver-side Python process on one long-lived reader;
``read`` runs in executor Python workers on a freshly unpickled reader, and
gets everything it needs from its :class:`LogRange`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow

from sparkcep.errors import SparkcepError
from sparkcep.spark import connection
from sparkcep.spark.options import SourceOptions, spark_error

MAX_BATCH_ROWS = 1 << 18  # rows per Arrow batch handed to Spark


@dataclass
class LogRange(InputPartition):
    """Rows ``[start, end)`` of partition ``partition`` of output ``stream``: one Spark task."""

    address: str
    stream: str
    partition: int
    start: int
    end: int


def plan_ranges(address: str, stream: str, start: dict[int, int], end: dict[int, int],
                rows_per_task: int) -> list[LogRange]:
    """The tasks reading from ``start`` to ``end``, each at most ``rows_per_task`` rows."""
    out = []
    for p in sorted(end):
        s, e = start.get(p, 0), end[p]
        while s < e:
            out.append(LogRange(address, stream, p, s, min(s + rows_per_task, e)))
            s = out[-1].end
    return out


def read_range(r: LogRange, schema, metadata: bool):
    """Arrow batches of ``r`` in exactly the Arrow schema Spark expects for ``schema``."""
    from pyspark.sql.pandas.types import to_arrow_schema

    target = to_arrow_schema(schema, timezone="UTC")
    try:
        table = connection.call(r.address, lambda c: c.read(r.stream, r.partition, r.start, r.end))
    except SparkcepError as e:
        raise spark_error(e) from None
    if table.num_rows != r.end - r.start:
        raise spark_error(SparkcepError(f"stream {r.stream!r} partition {r.partition}: asked rows "
                                        f"[{r.start}, {r.end}), got {table.num_rows}", "SHORT_READ"))
    table = table.combine_chunks()
    offset = r.start
    for b in table.to_batches(max_chunksize=MAX_BATCH_ROWS):
        n = b.num_rows
        cols = [b.column(i) for i in range(b.num_columns - 1)]  # the visible fields; __seq is last
        if metadata:
            cols += [pa.array(np.full(n, r.partition, np.int32)),
                     pa.array(np.arange(offset, offset + n, dtype=np.int64)), b.column(b.num_columns - 1)]
        yield pa.RecordBatch.from_arrays([c if c.type == f.type else c.cast(f.type) for c, f in zip(cols, target)],
                                         schema=target)
        offset += n


def _positions(offset: dict) -> dict[int, int]:
    return {int(p): int(v) for p, v in offset["positions"].items()}


def _offset(positions: dict[int, int]) -> dict:
    return {"positions": {str(p): int(positions[p]) for p in sorted(positions)}}


def spread(start: dict[int, int], latest: dict[int, int], max_rows: int) -> dict[int, int]:
    """End positions taking at most ``max_rows`` rows after ``start``, shared fairly over partitions."""
    avail = {p: max(latest[p] - start.get(p, 0), 0) for p in latest}
    end = {p: start.get(p, 0) for p in latest}
    remaining = max_rows
    order = sorted(avail, key=lambda p: avail[p])
    for i, p in enumerate(order):
        take = min(avail[p], remaining // (len(order) - i))
        end[p] += take
        remaining -= take
    return end


class _Reader:
    """What batch and streaming readers share: options, schema, the engine address."""

    def __init__(self, address: str, opts: SourceOptions, schema):
        self.address, self.opts, self.schema = address, opts, schema

    def _offsets(self) -> tuple[dict[int, int], dict[int, int]]:
        interval = self.opts.metrics_interval
        try:
            if self.opts.stream == "$metrics":
                h = connection.call(self.address, lambda c: c.request("offsets", stream="$metrics",
                                                                      interval=interval)[0])
                return ({int(p): v for p, v in h["earliest"].items()}, {int(p): v for p, v in h["latest"].items()})
            return connection.call(self.address, lambda c: c.offsets(self.opts.stream))
        except SparkcepError as e:
            raise spark_error(e) from None

    def read(self, partition: LogRange):
        return read_range(partition, self.schema, self.opts.metadata)


class BatchReader(_Reader, DataSourceReader):
    """``spark.read.format("upmcep")``: every row the output retains when the query is planned."""

    def partitions(self):
        earliest, latest = self._offsets()
        return plan_ranges(self.address, self.opts.stream, earliest, latest, self.opts.rows_per_partition)


class StreamReader(_Reader, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("upmcep")``: the output as it grows; see the module docstring."""

    def __init__(self, address: str, opts: SourceOptions, schema):
        super().__init__(address, opts, schema)
        self._cap: dict[int, int] | None = None

    def initialOffset(self) -> dict:
        """Called once for a query without a checkpoint: where ``startingOffsets`` says to begin."""
        earliest, latest = self._offsets()
        s = self.opts.starting
        if s == "earliest":
            return _offset(earliest)
        if s == "latest":
            return _offset(latest)
        return _offset({**earliest, **s})

    def getDefaultReadLimit(self):
        return ReadMaxRows(self.opts.max_records) if self.opts.max_records else ReadAllAvailable()

    def latestOffset(self, start: dict, limit=None) -> dict:
        """Called before each micro-batch: the end of the next one, within ``limit``."""
        begin = _positions(start)
        _, latest = self._offsets()
        latest = {p: max(v, begin.get(p, 0)) for p, v in {**begin, **latest}.items()}
        if self._cap is not None:
            latest = {p: max(min(v, self._cap.get(p, 0)), begin.get(p, 0)) for p, v in latest.items()}
        if isinstance(limit, ReadMaxRows):
            latest = spread(begin, latest, limit.max_rows)
        return _offset(latest)

    def reportLatestOffset(self):
        return _offset(self._offsets()[1])

    def prepareForTriggerAvailableNow(self) -> None:
        """``trigger(availableNow=True)``: read up to what is there now, then stop."""
        self._cap = self._offsets()[1]

    def partitions(self, start: dict, end: dict):
        return plan_ranges(self.address, self.opts.stream, _positions(start), _positions(end),
                           self.opts.rows_per_partition)

    def commit(self, end: dict) -> None:
        """Spark finished every row before ``end``: the engine may release them (for this consumer)."""
        try:
            connection.call(self.address, lambda c: c.commit(self.opts.stream, _positions(end), self.opts.consumer))
        except SparkcepError as e:
            raise spark_error(e) from None

    def stop(self) -> None:
        pass
