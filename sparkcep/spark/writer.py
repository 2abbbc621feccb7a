"""Writing Spark data into an engine input stream, each Spark task's rows exactly once.

Each task sends all its rows in one idempotent request keyed by
``(writer id, batch id, partition id)``: the streaming query's id (stable
across restarts from a checkpoint) and the micro-batch id, or a random id
per batch write job. The engine ingests a key once, so a retried task or a
micro-batch replayed after a restart is not ingested twice; a request cut
short ingests nothing. ``commit`` on the driver settles the batch's keys.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from sparkcep.errors import SparkcepError
from sparkcep.spark import connection
from sparkcep.spark.options import spark_error


@dataclass
class Sent(WriterCommitMessage):
    """What one task sent: its key, the rows and whether the engine had seen the key already."""

    writer: str
    batch: int
    partition: int
    rows: int
    duplicate: bool


def send_partition(address: str, stream: str, columns: list[str], batches, writer: str, batch: int,
                   partition: int) -> Sent:
    """Send one task's Arrow batches as one idempotent request."""
    batches = [b for b in batches if b.num_rows]
    if not batches:
        return Sent(writer, batch, partition, 0, False)
    table = pa.Table.from_batches(batches).select(columns)
    try:
        reply = connection.call(address, lambda c: c.send(stream, table, key=[writer, batch, partition]))
    except SparkcepError as e:
        raise spark_error(e) from None
    return Sent(writer, batch, partition, table.num_rows, bool(reply["duplicate"]))


def _settle(address: str, messages, batch: int) -> None:
    writers = {m.writer for m in messages if isinstance(m, Sent)}
    try:
        for w in writers:
            connection.call(address, lambda c: c.commit_write(w, batch))
    except SparkcepError as e:
        raise spark_error(e) from None


class StreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("upmcep")``: each micro-batch into the input stream, once."""

    def __init__(self, address: str, stream: str, columns: list[str]):
        self.address, self.stream, self.columns = address, stream, columns

    def write(self, iterator) -> Sent:
        """Runs in an executor Python worker, once per task of each micro-batch."""
        from pyspark import TaskContext

        tc = TaskContext.get()
        batch = int(tc.getLocalProperty("streaming.sql.batchId"))
        writer = tc.getLocalProperty("sql.streaming.queryId")
        return send_partition(self.address, self.stream, self.columns, iterator, writer, batch, tc.partitionId())

    def commit(self, messages, batchId: int) -> None:
        """Runs on the driver when every task of micro-batch ``batchId`` succeeded."""
        _settle(self.address, messages, batchId)

    def abort(self, messages, batchId: int) -> None:
        """Keys of the tasks that did send stay recorded: Spark replays the batch with the same rows."""


class BatchWriter(DataSourceArrowWriter):
    """``df.write.format("upmcep").mode("append")``: one job's rows into the input stream, once."""

    def __init__(self, address: str, stream: str, columns: list[str]):
        self.address, self.stream, self.columns = address, stream, columns
        self.job = f"batch-{uuid.uuid4()}"

    def write(self, iterator) -> Sent:
        from pyspark import TaskContext

        return send_partition(self.address, self.stream, self.columns, iterator, self.job, 0,
                              TaskContext.get().partitionId())

    def commit(self, messages) -> None:
        _settle(self.address, messages, 0)
