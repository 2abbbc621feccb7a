"""Writing Spark data into an engine input stream: a micro-batch is one engine send, taken once.

Each task *stages* its rows in the engine under ``(writer, batch,
partition)`` -- the streaming query's id (stable across restarts from a
checkpoint) or a batch job's id, Spark's batch id, the task's partition --
in chunks of a few MiB (:mod:`sparkcep.gateway.staging`); nothing is visible
yet. When every task succeeded, ``commit`` on the driver makes the engine
send all staged partitions as one batch, in (partition, row) order: one
epoch, so the order in which Spark ran its tasks cannot make an event late,
and either every row of the micro-batch is taken or none is. ``abort``
drops the staged rows.

Exactly once: a retried task restages its partition from scratch; a batch
id at or before the query's last committed one (Spark replays the last
batch after a restart when its commit was not recorded) takes nothing; a
commit finding a partition not staged as its task reported (the engine
restarted in between) fails with ``STAGE_MISSING`` and Spark writes the
batch again after a restart.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from sparkcep.gateway.protocol import chunk_bytes, chunks
from sparkcep.spark.connection import Target, call
from sparkcep.spark.options import SparkSourceError


@dataclass
class Staged(WriterCommitMessage):
    """What one task staged: its key, its attempt, the rows it counted, the engine run that holds them and
    where it was reached (the task's :class:`Target` address)."""

    writer: str
    batch: int
    partition: int
    attempt: str
    rows: int
    engine: str
    address: str


def stage_partition(target: Target, stream: str, columns: list[str], batches, writer: str, batch: int,
                    partition: int, attempt: str) -> Staged:
    """Stage one task's Arrow batches (the stream's ``columns``) in chunks; runs in an executor Python worker.

    Spark hands the writer batches of 10,000 rows; each chunk of them goes
    as one record batch, joined here, beside Spark's other tasks: the
    engine's commit costs per batch (2M HiBench records: 0.91 s in 10K-row
    batches, 0.66 s in chunks of 8 MiB).
    """
    rows, engine = 0, ""
    selected = (b.select(columns) for b in batches)
    for k, group in enumerate(chunks(selected, chunk_bytes())):
        group = pa.Table.from_batches(group).combine_chunks().to_batches()  # see the docstring
        reply = call(target, lambda c: c.stage(stream, writer, batch, partition, attempt, k, group))
        rows += sum(b.num_rows for b in group)
        engine = reply["engine"]
        if not reply["duplicate"] and reply["rows"] != rows:
            raise SparkSourceError(f"writer {writer} batch {batch} partition {partition}: staged {rows} rows, the "
                                   f"engine holds {reply['rows']}", "STAGE_MISSING")
    return Staged(writer, batch, partition, attempt, rows, engine, target.address)


def commit_batch(target: Target, stream: str, messages, batch: int) -> None:
    """The driver's commit: one engine send of every staged partition of ``batch``."""
    staged = [m for m in messages if isinstance(m, Staged)]
    elsewhere = sorted({m.address for m in staged} - {target.address})
    if elsewhere:  # engine unset and another engine published itself as this machine's since the query began
        raise SparkSourceError(f"batch {batch}: its tasks wrote to the engine at {', '.join(elsewhere)}, its commit "
                               f"goes to the engine at {target.address}: the local engine changed while the query "
                               "ran (an engine started or closed on this machine); name one with "
                               ".option('engine', 'host:port')", "ENGINE_CHANGED")
    if staged:
        parts = [(m.partition, m.attempt, m.rows, m.engine) for m in staged]
        call(target, lambda c: c.commit_stage(stream, staged[0].writer, batch, parts))


def abort_batch(target: Target, messages, batch: int, writer: str | None = None) -> None:
    """The driver's abort: drop what the batch's tasks staged (of ``writer``, else of the writers in ``messages``)."""
    writers = {writer} if writer else {m.writer for m in messages if isinstance(m, Staged)}
    for w in writers:
        call(target, lambda c: c.abort_stage(w, batch))


class StreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("upmcep")``: each micro-batch into the input stream as one send, once.

    Spark creates one on the driver for every micro-batch, and again for its
    commit or abort: it holds nothing but its target.
    """

    def __init__(self, target: Target, stream: str, columns: list[str]):
        self.target, self.stream, self.columns = target, stream, columns

    def write(self, iterator) -> Staged:
        """Runs in an executor Python worker, once per task of each micro-batch: stages the task's rows."""
        from pyspark import TaskContext

        tc = TaskContext.get()
        return stage_partition(self.target, self.stream, self.columns, iterator,
                               tc.getLocalProperty("sql.streaming.queryId"),
                               int(tc.getLocalProperty("streaming.sql.batchId")), tc.partitionId(),
                               str(tc.taskAttemptId()))

    def commit(self, messages, batchId: int) -> None:
        """Runs on the driver when every task of micro-batch ``batchId`` succeeded."""
        commit_batch(self.target, self.stream, messages, batchId)

    def abort(self, messages, batchId: int) -> None:
        """Runs on the driver when a task or the commit failed: the staged rows go.

        Messages of failed tasks are None; when every task failed the query
        id is unknown here, and the rows stay staged until the query commits
        a later batch (or replays this one, which restages every partition).
        """
        abort_batch(self.target, messages, batchId)


class BatchWriter(DataSourceArrowWriter):
    """``df.write.format("upmcep").mode("append")``: one job's rows into the input stream as one send."""

    def __init__(self, target: Target, stream: str, columns: list[str]):
        self.target, self.stream, self.columns = target, stream, columns
        self.job = f"batch-{uuid.uuid4().hex}"

    def write(self, iterator) -> Staged:
        from pyspark import TaskContext

        tc = TaskContext.get()
        return stage_partition(self.target, self.stream, self.columns, iterator, self.job, 0, tc.partitionId(),
                               str(tc.taskAttemptId()))

    def commit(self, messages) -> None:
        commit_batch(self.target, self.stream, messages, 0)

    def abort(self, messages) -> None:
        abort_batch(self.target, messages, 0, self.job)
