"""The output log of a query output: every batch it produced, per partition, in order.

A partition is one producing instance of the output's sub-query, so rows of
one partition keep their production order. Each row has a *position* in its
partition: 0 for the first row the partition ever produced, counting up, never
reused. Readers (the Spark source) address rows by ``(partition, position)``;
rows stay retained until every consumer that reads the log has committed past
them (:meth:`OutputLog.commit`), so a reader restarted from a checkpoint can
read again exactly what it had not committed — within the log's
:class:`Retention` (by default 256 MiB per output): past it the oldest rows
go, read or not, and a reader that asks for them gets an error saying how
many it missed; nothing is skipped silently.

Thread-safe: the engine appends from its own thread while the loopback
endpoint reads, commits and releases from connection threads.
"""

from __future__ import annotations

import bisect
import functools
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pyarrow as pa

from sparkcep.arguments import checked, integer
from sparkcep.core.columns import ID, SEQ
from sparkcep.errors import EngineError


@dataclass(frozen=True)
class Retention:
    """How much of an output its log keeps for readers: at most ``rows`` rows, ``bytes`` bytes, rows at
    most ``age_s`` seconds old (None: no bound of that kind). Past a bound the oldest rows go first,
    whether every reader has read them or not."""

    rows: int | None = None
    bytes: int | None = 256 << 20
    age_s: float | None = None

    def __post_init__(self):
        for name in ("rows", "bytes"):  # integers as operator.index takes them (numpy's too)
            if getattr(self, name) is not None:
                object.__setattr__(self, name, integer(getattr(self, name), f"Retention({name}=...)", minimum=1,
                                                       error=EngineError, code="BAD_RETENTION"))
        age = self.age_s
        if age is not None and (isinstance(age, bool) or not isinstance(age, (int, float, np.integer, np.floating)) or
                                not age > 0):
            raise EngineError(f"Retention(age_s={age!r}): expected a positive number of seconds or None",
                              "BAD_RETENTION")
        if age is not None:
            object.__setattr__(self, "age_s", float(age))


# the dataclass's own __init__, checked as every public constructor is: Retention(row=5) names 'rows'
Retention.__init__ = checked(EngineError)(Retention.__init__)

DEFAULT_RETENTION = Retention()


class NotHeld(EngineError):
    """A cluster's data path has no standby holding what a log takes now: the rows are not taken, and
    the sink offers them again later (no reader may see a row a successor would not have)."""

    code = "NOT_HELD"


class SubscriberError(EngineError):
    """A subscriber's callback raised (its error is the cause): the rows are in the log and every other
    subscriber got them; the query producing them fails (``SINK``)."""

    code = "SINK"


_callbacks = threading.local()  # .running: this thread is in a subscriber's callback or on_error


def refuse_in_callback(call: str) -> None:
    """Raise IN_CALLBACK when a subscriber's callback makes ``call``: the engine is publishing an output
    meanwhile, so a call waiting for its outputs, instance managers or state would wait for itself (20 s
    for metrics(), 120 s for a migration, with workers) and a send would run inside another."""
    if getattr(_callbacks, "running", False):
        raise EngineError(f"{call} was called from a subscriber's callback, which runs while the engine publishes "
                          "an output and cannot wait for it: hand the work to another thread (put the batch in "
                          "a queue.Queue that thread reads)", "IN_CALLBACK")


def outside_callbacks(method):
    """Decorate an engine call that a subscriber's callback may not make (:func:`refuse_in_callback`)."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        refuse_in_callback(f"{method.__name__}()")
        return method(self, *args, **kwargs)
    return call


def _call_back(fn, value) -> None:
    _callbacks.running = True
    try:
        fn(value)
    finally:
        _callbacks.running = False


def extend_logs(logs: dict, per_log: dict[str, list], epoch: int) -> SubscriberError | None:
    """One epoch's rows into their logs (``{output: [(partition, batch)]}``), every log taking its own
    even when a subscriber of another raises; returns the first :class:`SubscriberError`."""
    failed = None
    for out, batches in per_log.items():
        try:
            logs[out].extend(batches, epoch)
        except SubscriberError as e:
            failed = failed or e
    return failed


@dataclass
class _Partition:
    """Retained batches of one partition; ``starts[i]`` is the position of ``batches[i]``'s first row."""

    base: int = 0  # position of the first retained row
    end: int = 0  # position after the last row produced
    dropped: int = 0  # rows before this position were dropped by the retention
    starts: list[int] = field(default_factory=list)
    batches: list[pa.RecordBatch] = field(default_factory=list)  # visible fields + SEQ + ID


class OutputLog:
    """Every retained row of one output stream, per partition.

    ``collect()`` on the engine returns :meth:`table`: every *retained* row.
    Rows are released when every consumer committed past them (the Spark
    source does at ``commit(end)``) or when the :class:`Retention` drops them
    (``retain=True``: :data:`DEFAULT_RETENTION`; or a ``Retention``). With
    ``retain=False`` it keeps nothing: rows go to the subscribers only
    (positions still count up), for long runs whose results are consumed as
    they come.
    """

    def __init__(self, schema: pa.Schema, name: str = "", retain: "bool | Retention" = True,
                 deployment: str = ""):
        if not isinstance(retain, (bool, Retention)):
            raise EngineError(f"retain={retain!r}: expected True, False or a cep.Retention", "BAD_RETENTION")
        self.retention = DEFAULT_RETENTION if retain is True else retain or None
        self.schema, self.name, self.retain = schema, name, self.retention is not None
        self.deployment = deployment  # id of the deployment producing it: positions belong to it
        self.subscribers: list[Callable[[pa.RecordBatch], None]] = []
        self.on_error: list[Callable[[Exception], None]] = []  # told once when the producing query fails
        self.error: Exception | None = None
        self.rows = 0  # rows produced since the start, retained or not
        self.held_rows = self.held_bytes = 0  # what the retained batches hold
        self.dropped = 0  # rows the retention dropped
        self._order: deque = deque()  # (time, partition, position, rows, bytes) of each batch kept, oldest first
        self._parts: dict[int, _Partition] = {}
        self._consumers: dict[str, dict[int, int]] = {}
        self._lock = threading.Lock()
        self.epoch = 0  # the last epoch whose rows it took
        self.journal = None  # a cluster data path's journal: told of rows and consumers before they count
        self._with_seq = schema.names + [SEQ]
        self._stored = pa.schema(list(schema) + [pa.field(SEQ, pa.int64()), pa.field(ID, pa.int64())])

    # --- producing -----------------------------------------------------------------
    def append(self, partition: int, batch: pa.RecordBatch) -> None:
        """Add ``batch`` (produced by instance ``partition``) at the end of that partition."""
        self.extend([(partition, batch)])

    def extend(self, batches: list[tuple[int, pa.RecordBatch]], epoch: int | None = None) -> None:
        """Add ``(partition, batch)`` pairs, in order, at once: a reader sees all of them or none
        (the sink adds an epoch's rows so), then hand them to the subscribers.

        ``epoch``: the epoch whose rows these are. A log takes an epoch once:
        one at or before the last it took is left out (a cluster's data path
        replaying its input after a fail-over, the log already holding the
        rows it published before). With a :attr:`journal` (a cluster's data
        path), the rows reach its standby before any reader sees them; while
        no standby holds them, :class:`NotHeld` and the log is unchanged.
        A subscriber that raises: :class:`SubscriberError`, once every subscriber got the rows.
        """
        if epoch is not None and epoch <= self.epoch:
            return
        visible = [(p, b, b.select(self.schema.names)) for p, b in batches if b.num_rows]
        stored = [self._stored_batch(b, v) if self.retain else None for _, b, v in visible]
        if self.journal is not None and visible:  # raises NotHeld while no standby would hold them
            self.journal.published(self, epoch, [(p, kept if kept is not None else b.num_rows)
                                                 for (p, b, _), kept in zip(visible, stored)])
        if epoch is not None:
            self.epoch = epoch
        with self._lock:
            for (partition, batch, _), kept in zip(visible, stored):
                part = self._parts.setdefault(partition, _Partition())
                if kept is not None:
                    part.starts.append(part.end)
                    part.batches.append(kept)
                    self._order.append((time.monotonic(), partition, part.end, kept.num_rows, kept.nbytes))
                    self.held_rows += kept.num_rows
                    self.held_bytes += kept.nbytes
                part.end += batch.num_rows
                if kept is None:
                    part.base = part.end
                self.rows += batch.num_rows
            if self.retention is not None:
                self._retain()
        failed = None
        for _, _, v in visible:
            for fn in list(self.subscribers):
                try:
                    _call_back(fn, v)
                except Exception as e:  # the others still get the rows: they are in the log
                    if failed is None:
                        failed = SubscriberError(f"a subscriber of output {self.name!r} raised {type(e).__name__}: {e}")
                        failed.__cause__ = e
        if failed is not None:
            raise failed

    def _stored_batch(self, batch: pa.RecordBatch, visible: pa.RecordBatch) -> pa.RecordBatch:
        """The visible fields plus each row's output id: sequence number and id (-1 where there are
        none, e.g. metrics)."""
        cols, names = list(visible.columns), batch.schema.names
        for c in (SEQ, ID):
            cols.append(batch.column(c) if c in names else pa.array(np.full(batch.num_rows, -1, np.int64)))
        return pa.RecordBatch.from_arrays(cols, schema=self._stored)

    def _retain(self) -> None:
        """Drop the oldest batches while the retention is exceeded (holding the lock). A batch counts
        until it leaves the front of the order, so commits releasing out of order make the log drop a
        little early, never hold more."""
        r, now = self.retention, time.monotonic()
        while self._order and ((r.bytes is not None and self.held_bytes > r.bytes) or
                               (r.rows is not None and self.held_rows > r.rows) or
                               (r.age_s is not None and now - self._order[0][0] > r.age_s)):
            _, partition, position, rows, _ = self._order[0]
            part = self._parts[partition]
            if part.base < position + rows:  # not released by commits already
                part.dropped = position + rows
                self.dropped += position + rows - max(part.base, position)
                self._release(part, position + rows)
            else:
                self._forget_oldest()

    def _forget_oldest(self) -> None:
        _, _, _, rows, nbytes = self._order.popleft()
        self.held_rows -= rows
        self.held_bytes -= nbytes

    def subscribe(self, callback: Callable[[pa.RecordBatch], None],
                  on_error: Callable[[Exception], None] | None = None) -> "Subscription":
        """``callback`` gets every batch appended from now on, ``on_error`` the query's failure."""
        self.subscribers.append(callback)
        if on_error is not None:
            self.on_error.append(on_error)
        return Subscription(lambda: _discard(self.subscribers, callback) or _discard(self.on_error, on_error))

    def fail(self, error: Exception) -> None:
        """The query producing this output failed: tell the error subscribers, once."""
        if self.error is None:
            self.error = error
            for fn in self.on_error:
                _call_back(fn, error)

    # --- reading -------------------------------------------------------------------
    def table(self) -> pa.Table:
        """Every retained row, partition after partition."""
        self.check_whole()
        with self._lock:
            batches = [b for p in sorted(self._parts) for b in self._parts[p].batches]
        return pa.Table.from_batches([b.select(self.schema.names) for b in batches], schema=self.schema)

    def check_whole(self) -> None:
        """Raise NOT_RETAINED or OUTPUT_TRUNCATED unless the log holds every row its output produced
        that no reader committed."""
        if not self.retain:
            raise EngineError(f"output {self.name!r} keeps no rows (its query was deployed with retain=False); "
                              "subscribe to it to get its rows", "NOT_RETAINED")
        if self.dropped:
            raise EngineError(f"output {self.name!r} is incomplete: its retention ({self.retention}) dropped "
                              f"{self.dropped} of its {self.rows} rows; subscribe to it, read it with Spark as it "
                              f"grows, or deploy with a larger retain=cep.Retention(...)", "OUTPUT_TRUNCATED")

    @property
    def partitions(self) -> dict[int, list[pa.RecordBatch]]:
        """Retained batches per partition (visible fields only)."""
        with self._lock:
            parts = {p: list(part.batches) for p, part in self._parts.items()}
        return {p: [b.select(self.schema.names) for b in bs] for p, bs in sorted(parts.items())}

    def earliest(self) -> dict[int, int]:
        """Position of the first retained row of each partition."""
        with self._lock:
            return {p: part.base for p, part in self._parts.items()}

    def latest(self) -> dict[int, int]:
        """Position after the last row of each partition (where the next row will go)."""
        with self._lock:
            return {p: part.end for p, part in self._parts.items()}

    @property
    def retained(self) -> int:
        """Rows currently retained, over all partitions."""
        with self._lock:
            return sum(part.end - part.base for part in self._parts.values())

    def read(self, partition: int, start: int, end: int, seq: bool = False,
             ids: bool = False) -> list[pa.RecordBatch]:
        """Rows at positions ``[start, end)`` of ``partition``, as zero-copy slices.

        With ``seq=True`` the batches carry the engine sequence number column
        ``__seq`` after the visible fields; with ``ids=True`` the whole output
        id, ``__seq`` then ``__id`` (:mod:`sparkcep.core.ids`), after them.
        Raises EngineError ``OFFSET_RELEASED``
        when part of the range was already released by a commit, and
        ``OFFSET_RANGE`` when it reaches past what the partition produced.
        """
        with self._lock:
            part = self._parts.get(partition, _Partition())
            if start < part.dropped:
                raise EngineError(f"rows {start}..{part.dropped} of partition {partition} of output {self.name!r} "
                                  f"were dropped by its retention ({self.retention}) before they were read: "
                                  f"{part.dropped - start} rows missed; the first retained row is at {part.base}",
                                  "OFFSET_RELEASED")
            if start < part.base:
                raise EngineError(f"rows {start}..{min(end, part.base)} of partition {partition} were released "
                                  f"(committed by every consumer); the first retained row is at {part.base}",
                                  "OFFSET_RELEASED")
            if end > part.end or start > end:
                raise EngineError(f"cannot read rows [{start}, {end}) of partition {partition}: it has rows "
                                  f"[{part.base}, {part.end})", "OFFSET_RANGE")
            starts, batches = part.starts, part.batches
            i = max(bisect.bisect_right(starts, start) - 1, 0)
            out = []
            while i < len(batches) and starts[i] < end:
                b, s = batches[i], starts[i]
                lo, hi = max(start - s, 0), min(end - s, b.num_rows)
                if hi > lo:
                    out.append(b if (lo, hi) == (0, b.num_rows) else b.slice(lo, hi - lo))
                i += 1
        if ids:
            return out
        return [b.select(self._with_seq if seq else self.schema.names) for b in out]

    # --- retention -----------------------------------------------------------------
    def release(self, partition: int, upto: int) -> None:
        """Drop the rows of ``partition`` before position ``upto``."""
        with self._lock:
            part = self._parts.get(partition)
            if part is not None and upto > part.base:
                self._release(part, min(upto, part.end))

    @staticmethod
    def _release(part: _Partition, upto: int) -> None:
        k = bisect.bisect_right(part.starts, upto) - 1  # batch holding position upto (or the last one)
        if k >= 0 and part.starts[k] + part.batches[k].num_rows <= upto:
            k += 1  # batches[k] ends at or before upto: drop it whole
        if k > 0:
            del part.starts[:k], part.batches[:k]
        if part.batches and part.starts[0] < upto:
            cut = upto - part.starts[0]
            part.batches[0] = part.batches[0].slice(cut)
            part.starts[0] = upto
        part.base = upto

    def register(self, consumer: str, positions: dict[int, int] | None = None) -> None:
        """Hold rows for ``consumer`` from ``positions`` (default: the earliest retained) on.

        A consumer registered before it reads keeps other consumers' commits
        from releasing rows it has not read yet. Registering again moves it
        only forward, like :meth:`commit`.
        """
        if self.journal is not None:
            self.journal.consumed(self, "register", consumer, positions)
        with self._lock:
            mine = self._consumers.setdefault(consumer, {})
            start = {p: part.base for p, part in self._parts.items()}
            start.update(_positions(positions or {}))
            for p, pos in start.items():
                mine[p] = max(mine.get(p, 0), pos)

    def commit(self, positions: dict[int, int], consumer: str = "default") -> None:
        """``consumer`` has processed every row before ``positions[p]`` in each partition ``p``.

        Rows are released once *every* consumer that ever committed on this
        log has passed them; positions never move back.
        """
        if self.journal is not None:
            self.journal.consumed(self, "commit", consumer, positions)
        with self._lock:
            mine = self._consumers.setdefault(consumer, {})
            for p, pos in _positions(positions).items():
                mine[p] = max(mine.get(p, 0), pos)
            parts = list(self._parts)
            lows = {p: min(c.get(p, 0) for c in self._consumers.values()) for p in parts}
        for p, low in lows.items():
            self.release(p, low)


    # --- a cluster's standby data path ------------------------------------------------
    @property
    def stored_schema(self) -> pa.Schema:
        """The schema of what the log keeps: the visible fields, then ``__seq`` and ``__id``."""
        return self._stored

    def bases(self) -> dict[int, tuple[int, int]]:
        """Per partition: the first retained position and where the retention's drops end."""
        with self._lock:
            return {p: (part.base, part.dropped) for p, part in self._parts.items()}

    def rebase(self, bases: dict[int, tuple[int, int]]) -> None:
        """Release what the primary's log released (``bases`` of it), as a standby's copy does."""
        for p, (base, dropped) in bases.items():
            with self._lock:
                part = self._parts.setdefault(int(p), _Partition())
                if dropped > part.dropped:
                    self.dropped += dropped - max(part.dropped, part.base)
                    part.dropped = dropped
            self.release(int(p), base)

    def append_stored(self, epoch: int, batches: list[tuple[int, "pa.RecordBatch | int"]]) -> None:
        """Take an epoch the primary published: ``(partition, stored batch)`` pairs, or ``(partition, rows)``
        for a log that keeps no rows. Nothing is told to subscribers (a standby has none)."""
        if epoch is not None and epoch <= self.epoch:
            return
        self.epoch = epoch or self.epoch
        with self._lock:
            for partition, kept in batches:
                part = self._parts.setdefault(int(partition), _Partition())
                rows = kept if isinstance(kept, int) else kept.num_rows
                if not isinstance(kept, int):
                    part.starts.append(part.end)
                    part.batches.append(kept)
                    self._order.append((time.monotonic(), int(partition), part.end, rows, kept.nbytes))
                    self.held_rows += rows
                    self.held_bytes += kept.nbytes
                part.end += rows
                if isinstance(kept, int):
                    part.base = part.end
                self.rows += rows

    def snapshot(self) -> dict:
        """Everything a standby needs to hold the same log: per partition its positions and retained
        (stored) batches, the consumers' positions, the last epoch taken."""
        with self._lock:
            return {"epoch": self.epoch, "rows": self.rows, "dropped": self.dropped,
                    "consumers": {c: dict(ps) for c, ps in self._consumers.items()},
                    "parts": {p: (part.base, part.end, part.dropped, list(zip(part.starts, part.batches)))
                              for p, part in self._parts.items()}}

    def restore(self, snap: dict) -> None:
        """Hold what :meth:`snapshot` described (a new standby being synced)."""
        with self._lock:
            self.epoch, self.rows, self.dropped = snap["epoch"], snap["rows"], snap["dropped"]
            self._consumers = {c: {int(p): v for p, v in ps.items()} for c, ps in snap["consumers"].items()}
            self._parts, self._order = {}, deque()
            self.held_rows = self.held_bytes = 0
            for p, (base, end, dropped, batches) in snap["parts"].items():
                part = self._parts[int(p)] = _Partition(base, end, dropped)
                for start, batch in batches:
                    part.starts.append(start)
                    part.batches.append(batch)
                    self._order.append((time.monotonic(), int(p), start, batch.num_rows, batch.nbytes))
                    self.held_rows += batch.num_rows
                    self.held_bytes += batch.nbytes

    def adopt(self, other: "OutputLog") -> None:
        """Take over ``other``'s rows, positions, consumers and epoch (a standby's copy becoming the log
        of the deployment the new primary replays)."""
        self.restore(other.snapshot())


class Subscription:
    """What ``subscribe`` returns, on every engine: ``cancel()`` stops the callbacks (idempotent)."""

    def __init__(self, stop: Callable[[], object]):
        self._stop, self.cancelled = stop, False

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self._stop()


def _discard(items: list, item) -> None:
    if item in items:
        items.remove(item)


def _positions(positions) -> dict[int, int]:
    """``{partition: position}`` as integers (numpy's, or the strings JSON keys are), refusing floats and bools."""
    return {integer(int(p) if isinstance(p, str) else p, "a partition", error=EngineError, code="OFFSET_RANGE"):
            integer(v, f"the position in partition {p}", minimum=0, error=EngineError, code="OFFSET_RANGE")
            for p, v in positions.items()}
