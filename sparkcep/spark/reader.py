"""Reading engine outputs into Spark: batch and streaming readers over the output log.

Offsets are ``{"engine": run id, "deployment": id, "consumer": name, "positions":
{"<partition>": position}}``: per output partition, the position (row count
since that partition's first row) up to which rows are included, the engine
run and deployment those positions belong to, and the consumer the query
commits as. A micro-batch reads ``[start, end)`` of each partition; rows
stay in the engine until :meth:`StreamReader.commit`, so a query restarted
from its checkpoint (which holds its offsets, consumer included) re-reads
exactly the ranges it had planned but not committed. Offsets of another
engine run or deployment (the engine restarted, the query was deployed
again) and positions the engine no longer retains are refused by the engine
(``OFFSET_ENGINE``, ``OFFSET_DEPLOYMENT``, ``OFFSET_RELEASED``,
``OFFSET_RANGE``): never clamped, never skipped.

Planning (``initialOffset``, ``latestOffset``, ``partitions``, ``commit``)
runs in Spark's driver-side Python process on one long-lived reader;
``read`` runs in executor Python workers on a freshly unpickled reader, and
gets everything it needs from its :class:`LogRange`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow

from sparkcep.spark.connection import Target, call
from sparkcep.spark.options import METRICS, SourceOptions, SparkSourceError
from sparkcep.spark.types import METADATA

MAX_BATCH_ROWS = 1 << 18  # rows per Arrow batch handed to Spark when small ones are joined
SMALL_BATCH_ROWS = 1 << 13  # a range whose batches hold fewer rows than this on average is joined


@dataclass
class LogRange(InputPartition):
    """Rows ``[start, end)`` of partition ``partition`` of output ``stream`` of one deployment: one Spark task.

    ``form``: of ``$metrics``, ``long`` or ``wide`` (None: long).
    """

    target: Target
    stream: str
    engine: str
    deployment: str
    partition: int
    start: int
    end: int
    form: str | None = None


def plan_ranges(target: Target, opts: SourceOptions, state: dict, start: dict[int, int],
                end: dict[int, int]) -> list[LogRange]:
    """The tasks reading from ``start`` to ``end``: each partition's range in equal parts of at most
    ``opts.rows_per_partition``."""
    out = []
    for p in sorted(end):
        s, e = start.get(p, 0), end[p]
        parts = -(-(e - s) // opts.rows_per_partition)
        bounds = [s + (e - s) * k // parts for k in range(parts + 1)] if parts > 0 else []
        out += [LogRange(target, opts.stream, state["engine"], state["deployment"], p, lo, hi, opts.form)
                for lo, hi in zip(bounds, bounds[1:])]
    return out


def read_range(r: LogRange, schema, metadata: bool):
    """Arrow batches of ``r`` in exactly the Arrow schema Spark expects for ``schema``."""
    from pyspark.sql.pandas.types import to_arrow_schema

    target = to_arrow_schema(schema, timezone="UTC")
    table = call(r.target, lambda c: c.read(r.stream, r.partition, r.start, r.end, engine=r.engine,
                                            deployment=r.deployment, form=r.form))
    if table.num_rows != r.end - r.start:
        raise SparkSourceError(f"stream {r.stream!r} partition {r.partition}: asked rows [{r.start}, {r.end}), "
                               f"got {table.num_rows}", "SHORT_READ")
    metrics = [n for n in schema.names[1:] if n not in METADATA] if r.form == "wide" else None
    offset = r.start
    for b in spark_batches(table):
        n = b.num_rows
        cols = b.columns[:-1] if metrics is None else wide(b, metrics)  # the visible fields; __seq is last
        if metadata:
            cols += [pa.array(np.full(n, r.partition, np.int32)),
                     pa.array(np.arange(offset, offset + n, dtype=np.int64)), b.column(b.num_columns - 1)]
        yield pa.RecordBatch.from_arrays([c if c.type == f.type else c.cast(f.type) for c, f in zip(cols, target)],
                                         schema=target)
        offset += n


def wide(samples: pa.RecordBatch, metrics: list[str]) -> list[pa.Array]:
    """Metric samples (``time, names, values``) as ``time`` and a column per metric of ``metrics``,
    null where a sample lacks it."""
    names, values = samples.column("names").to_pylist(), samples.column("values").to_pylist()
    rows = [dict(zip(n, v)) for n, v in zip(names, values)]
    return [samples.column("time")] + [pa.array([r.get(m) for r in rows], pa.float64()) for m in metrics]


def spark_batches(table: pa.Table) -> list[pa.RecordBatch]:
    """The non-empty batches of ``table`` as Spark gets them: as the engine stored them, not copied,
    unless they are small on average (every batch costs Spark a fixed amount); then joined into
    batches of :data:`MAX_BATCH_ROWS`."""
    batches = [b for b in table.to_batches() if b.num_rows]
    if len(batches) > 1 and table.num_rows < len(batches) * SMALL_BATCH_ROWS:
        return table.combine_chunks().to_batches(max_chunksize=MAX_BATCH_ROWS)
    return batches


def offset_of(state: dict, positions: dict[int, int], consumer: str | None) -> dict:
    """The Spark offset of ``positions`` in the run and deployment of ``state``, read by ``consumer``."""
    return {"engine": state["engine"], "deployment": state["deployment"], "consumer": consumer,
            "positions": {str(p): int(positions[p]) for p in sorted(positions)}}


def positions_of(offset: dict, stream: str) -> dict[int, int]:
    """The positions of a Spark offset; ``OFFSET_FORMAT`` for an offset without its engine run, deployment
    and consumer."""
    if not isinstance(offset, dict) or not {"engine", "deployment", "consumer", "positions"} <= offset.keys():
        raise SparkSourceError(f"offset {offset!r} of stream {stream!r} does not name its engine run, deployment "
                               "and consumer (a checkpoint written by an earlier sparkcep?); start the query with "
                               "a new checkpointLocation", "OFFSET_FORMAT")
    return {int(p): int(v) for p, v in offset["positions"].items()}


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
    """What batch and streaming readers share: options, schema, the engine."""

    def __init__(self, target: Target, opts: SourceOptions, schema):
        self.target, self.opts, self.schema = target, opts, schema

    def _state(self, offset: dict | None = None, positions: dict[int, int] | None = None) -> dict:
        """The output's earliest/latest positions, run and deployment; ``offset``/``positions`` checked by the engine."""
        fields = {}
        if offset is not None:
            pos = positions_of(offset, self.opts.stream)
            fields = {"engine": offset["engine"], "deployment": offset["deployment"]}
            positions = pos if positions is None else positions
        if positions is not None:
            fields["positions"] = {str(p): int(v) for p, v in positions.items()}
        if self.opts.stream == METRICS:
            fields["interval"] = self.opts.metrics_interval
        return call(self.target, lambda c: c.offsets(self.opts.stream, form=self.opts.form, **fields))

    def read(self, partition):
        """Spark reads a batch query that planned no range (an output without rows yet) as one empty partition."""
        return read_range(partition, self.schema, self.opts.metadata) if isinstance(partition, LogRange) else iter(())


class BatchReader(_Reader, DataSourceReader):
    """``spark.read.format("upmcep")``: every row the output retains when the query is planned."""

    def partitions(self):
        state = self._state()
        return plan_ranges(self.target, self.opts, state, state["earliest"], state["latest"])


class StreamReader(_Reader, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("upmcep")``: the output as it grows; see the module docstring.

    Created when the query starts, before Spark asks for any offset. Each
    query commits as a consumer of its own unless the ``consumer`` option
    names one to share: a new query makes its consumer in
    :meth:`initialOffset`, a query restarted from its checkpoint takes the
    one its offsets name. A consumer is registered before the query reads,
    so no other consumer's commit releases rows it has not read yet.
    """

    def __init__(self, target: Target, opts: SourceOptions, schema):
        super().__init__(target, opts, schema)
        self._cap: dict[int, int] | None = None
        self.consumer = opts.consumer
        if self.consumer:
            self._register()

    def _register(self) -> None:
        call(self.target, lambda c: c.register(self.opts.stream, self.consumer, form=self.opts.form))

    def _resume(self, offset: dict) -> None:
        """A restarted query commits as the consumer of its checkpointed offsets (unless the option names one)."""
        if self.consumer is None:
            positions_of(offset, self.opts.stream)
            self.consumer = offset["consumer"]

    def initialOffset(self) -> dict:
        """Called once for a query without a checkpoint: where ``startingOffsets`` says to begin."""
        if self.consumer is None:
            self.consumer = f"spark-{uuid.uuid4().hex[:16]}"
            self._register()
        s = self.opts.starting
        if isinstance(s, dict):
            state = self._state()
            state = self._state(positions={**state["earliest"], **s})
            return offset_of(state, {**state["earliest"], **s}, self.consumer)
        state = self._state()
        return offset_of(state, state[s], self.consumer)

    def getDefaultReadLimit(self):
        return ReadMaxRows(self.opts.max_records) if self.opts.max_records else ReadAllAvailable()

    def latestOffset(self, start: dict, limit=None) -> dict:
        """Called before each micro-batch: the end of the next one, within ``limit``."""
        self._resume(start)
        state = self._state(start)  # refused if start is of another run/deployment or no longer retained
        begin = positions_of(start, self.opts.stream)
        latest = {**begin, **state["latest"]}
        if self._cap is not None:
            latest = {p: max(min(v, self._cap.get(p, 0)), begin.get(p, 0)) for p, v in latest.items()}
        if isinstance(limit, ReadMaxRows):
            latest = spread(begin, latest, limit.max_rows)
        return offset_of(state, latest, self.consumer)

    def reportLatestOffset(self):
        state = self._state()
        return offset_of(state, state["latest"], self.consumer)

    def prepareForTriggerAvailableNow(self) -> None:
        """``trigger(availableNow=True)``: read up to what is there now, then stop."""
        self._cap = self._state()["latest"]

    def partitions(self, start: dict, end: dict):
        """The tasks of one micro-batch; both offsets are checked by the engine first."""
        self._resume(start)
        self._state(start)
        state = self._state(end)
        return plan_ranges(self.target, self.opts, state, positions_of(start, self.opts.stream),
                           positions_of(end, self.opts.stream))

    def commit(self, end: dict) -> None:
        """Spark finished every row before ``end``: the engine may release them (for this consumer)."""
        self._resume(end)
        positions = positions_of(end, self.opts.stream)
        call(self.target, lambda c: c.commit(self.opts.stream, positions, self.consumer, engine=end["engine"],
                                             deployment=end["deployment"], form=self.opts.form))

    def stop(self) -> None:
        pass
