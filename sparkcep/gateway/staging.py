"""Rows staged by writers until their batch is committed: how a Spark micro-batch becomes one engine send.

A *writer* (a Spark streaming query id, a batch write job id, or a client's
private id) writes *batches* (Spark's batch id); each batch is written by
*partitions* (Spark tasks). A task stages its rows under ``(writer, batch,
partition)`` in one or more chunks; the driver then commits the batch: the
staged rows of every partition it names, concatenated in (partition, row)
order, go into the engine as **one** :meth:`sparkcep.Engine.send` -- one
epoch, stamped with the watermark from before it, taken whole or not at all.

* A task that is retried stages its key again from chunk 0: its earlier
  rows are replaced, never added to. A chunk sent again (a retry after a
  lost reply) replaces the chunk it repeats.
* A commit checks that each partition is staged with the rows and attempt
  its task reported, else ``STAGE_MISSING`` (the engine restarted between
  the write and the commit, or the batch was aborted).
* Each writer's last committed batch is remembered (one int per writer):
  staging or committing a batch at or before it takes nothing (Spark replays
  a batch after a restart when it could not record the commit), and staged
  rows of such batches are dropped.
* ``abort`` drops a batch's staged rows.

Thread-safe: tasks stage from several endpoint connections at once.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pyarrow as pa

from sparkcep.errors import InputError


@dataclass
class _Key:
    """The rows one task attempt staged for one partition, chunk by chunk."""

    stream: str
    attempt: str
    chunks: list[pa.Table] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(t.num_rows for t in self.chunks)


class Staging:
    """Staged rows per writer, batch and partition, and each writer's last committed batch."""

    def __init__(self):
        self.committed: dict[str, int] = {}
        self._staged: dict[str, dict[int, dict[int, _Key]]] = {}  # writer -> batch -> partition -> rows
        self._lock = threading.Lock()

    def stage(self, writer: str, batch: int, partition: int, attempt: str, chunk: int, stream: str,
              table: pa.Table) -> dict:
        """Add chunk ``chunk`` of ``attempt``'s rows for a key; ``{"rows": staged so far, "duplicate"}``."""
        with self._lock:
            if batch <= self.committed.get(writer, -1):
                return {"rows": 0, "duplicate": True}
            parts = self._staged.setdefault(writer, {}).setdefault(batch, {})
            key = parts.get(partition)
            if chunk == 0:
                key = parts[partition] = _Key(stream, attempt)
            elif key is None or key.attempt != attempt or chunk not in (len(key.chunks), len(key.chunks) - 1):
                have = "nothing" if key is None else f"{len(key.chunks)} chunks of attempt {key.attempt}"
                raise InputError(f"writer {writer} batch {batch} partition {partition}: chunk {chunk} of attempt "
                                 f"{attempt} does not follow what is staged ({have}); a task stages chunks "
                                 "0, 1, ... in order", "STAGE_ORDER")
            if chunk < len(key.chunks):
                key.chunks[chunk] = table
            else:
                key.chunks.append(table)
            return {"rows": key.rows, "duplicate": False}

    def take(self, writer: str, batch: int, stream: str, parts: list[tuple[int, str, int]]) -> pa.Table | None:
        """The rows of ``batch`` as one table, in (partition, row) order; None when it was committed before.

        ``parts``: ``(partition, attempt, rows)`` as each task reported. A
        partition reporting 0 rows contributes nothing, whatever is staged.
        """
        with self._lock:
            if batch <= self.committed.get(writer, -1):
                return None
            staged = self._staged.get(writer, {}).get(batch, {})
            tables = []
            for partition, attempt, rows in sorted(parts):
                if rows == 0:
                    continue
                key = staged.get(partition)
                if key is None or key.attempt != attempt or key.rows != rows:
                    have = "nothing" if key is None else f"{key.rows} rows of attempt {key.attempt}"
                    raise InputError(f"writer {writer} batch {batch}: partition {partition} reported {rows} rows "
                                     f"staged by attempt {attempt}, but the engine holds {have} for it (was "
                                     "the batch aborted, or the engine restarted since the task wrote?); "
                                     "restart the query: Spark writes the batch again", "STAGE_MISSING")
                if key.stream != stream:
                    raise InputError(f"writer {writer} batch {batch}: partition {partition} was staged for stream "
                                     f"{key.stream!r}, the commit is for {stream!r}", "STAGE_STREAM")
                tables.extend(key.chunks)
        if not tables:
            return pa.table({})
        try:
            return pa.concat_tables(tables, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise InputError(f"writer {writer} batch {batch}: its partitions staged rows of different schemas "
                             f"for stream {stream!r}: {e}", "STAGE_SCHEMA") from None

    def settle(self, writer: str, batch: int) -> None:
        """``batch`` of ``writer`` is in the engine: drop what is staged for it and earlier batches."""
        with self._lock:
            self.committed[writer] = max(self.committed.get(writer, -1), batch)
            batches = self._staged.get(writer, {})
            for b in [b for b in batches if b <= batch]:
                del batches[b]
            if not batches:
                self._staged.pop(writer, None)

    def abort(self, writer: str, batch: int) -> int:
        """Drop what is staged for ``batch`` of ``writer``; the rows dropped."""
        with self._lock:
            parts = self._staged.get(writer, {}).pop(batch, {})
            if writer in self._staged and not self._staged[writer]:
                del self._staged[writer]
        return sum(k.rows for k in parts.values())

    def entries(self) -> list[dict]:
        """What it holds, as the journal entries that would rebuild it (a cluster's new standby is synced so):
        ``committed`` (each writer's last committed batch), then ``stage`` (each staged chunk)."""
        with self._lock:
            out = [{"kind": "committed", "writer": w, "batch": b} for w, b in self.committed.items()]
            for writer, batches in self._staged.items():
                for batch, parts in batches.items():
                    for partition, key in parts.items():
                        for chunk, table in enumerate(key.chunks):
                            out.append({"kind": "stage", "writer": writer, "batch": batch, "partition": partition,
                                        "attempt": key.attempt, "chunk": chunk, "stream": key.stream,
                                        "batches": table.to_batches() or None, "schema": table.schema})
        return out

    def staged(self, writer: str, batch: int) -> dict[int, int]:
        """Rows staged per partition for ``batch`` of ``writer`` (for tests and status)."""
        with self._lock:
            return {p: k.rows for p, k in self._staged.get(writer, {}).get(batch, {}).items()}

    @property
    def rows(self) -> int:
        """Rows staged over every writer and batch."""
        with self._lock:
            return sum(k.rows for batches in self._staged.values() for parts in batches.values()
                       for k in parts.values())
