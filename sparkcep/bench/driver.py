"""Open-loop input into an engine, with the timestamps latency is computed from.

A :class:`Source` makes the input: for events ``start .. start+n-1`` and
their event times, one Arrow batch per stream (HiBench: the one stream
``uservisits``; NEXMark: ``person``, ``auction`` and ``bid``, the ones the
query reads). The driver sends them chunk by chunk, a *chunk* being the
events of one interval.

Open loop: the send schedule is fixed in advance by the rate and never waits
for the engine. Chunk ``j`` holds the events created in
``[t0 + j*dt, t0 + (j+1)*dt)`` (event times spread evenly over it) and is sent
as soon as the wall clock passes the end of that interval; if the engine is
behind, the chunk goes out late and the lateness shows up as latency,
instead of silently lowering the offered rate (no coordinated omission).
Without a rate, chunks go out back to back; event times are then the
wall-clock time just before each chunk is sent (HiBench's key: the send
time), or, for a source with a ``nominal_rate`` (NEXMark), the generator's
schedule at that rate.

Every chunk is logged (wall-clock time before its first send and after its
last, first/last event time, events), and every output batch is logged with
the wall-clock time it left the engine (``engine.subscribe``);
:mod:`sparkcep.bench.metrics` turns the two logs into throughput and
latency. All times are ``time.time_ns()``.

Before the clock starts, the objects the process holds (imports, compiled
kernels, a Spark session) are frozen out of Python's cyclic garbage
collector (``gc.freeze``): a full collection over them stops the process,
sends and result delivery included, for about 100 ms. The Spark runs
(:mod:`sparkcep.bench.spark`) freeze the same way.
"""

from __future__ import annotations

import gc
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np
import pyarrow as pa

DEFAULT_BATCH_ROWS = 65_536
DEFAULT_BATCH_MS = 10.0


class Source(Protocol):
    """The input of a benchmark run (:class:`~sparkcep.bench.generator.UserVisits`,
    :class:`~sparkcep.bench.nexmark.NexmarkSource`)."""

    streams: tuple[str, ...]  # the engine streams it feeds
    ddl: dict[str, str]  # their schemas
    nominal_rate: float | None  # as fast as possible: event times at this rate (None: the send time)

    def prepare(self, events: int) -> None:
        """Render what a run of ``events`` sends, before the clock starts."""

    def batches(self, start: int, n: int, times_us: np.ndarray) -> list[tuple[str, pa.RecordBatch]]:
        """(stream, batch) of events ``start .. start+n-1`` with event times ``times_us``."""

    def flush(self, at_us: int) -> list[tuple[str, pa.RecordBatch]]:
        """(stream, batch) of one event per stream at ``at_us`` that belongs to no result: what closes
        the open windows of an engine without end of input (Spark's runs, :mod:`sparkcep.bench.spark`)."""


@dataclass
class Run:
    """What one driven run saw; times in ns since the epoch, event times in us since the epoch."""

    events: int = 0
    t_start: int = 0                 # just before the first send
    t_end: int = 0                   # just before ``engine.end`` (end of input)
    t_done: int = 0                  # ``engine.end`` returned
    send_t: list[int] = field(default_factory=list)      # before each chunk's first send
    send_done: list[int] = field(default_factory=list)   # after each chunk's last send returned
    send_first: list[int] = field(default_factory=list)  # first event time of each chunk
    send_last: list[int] = field(default_factory=list)   # last event time of each chunk
    send_rows: list[int] = field(default_factory=list)   # events of each chunk
    out_t: list[int] = field(default_factory=list)       # when each output batch left
    out: list[pa.RecordBatch] = field(default_factory=list)
    rate: float | None = None

    def arrays(self):
        """(send times, first event times, last event times, events) per chunk, as numpy arrays."""
        return (np.array(self.send_t, np.int64), np.array(self.send_first, np.int64),
                np.array(self.send_last, np.int64), np.array(self.send_rows, np.int64))

    @property
    def out_rows(self) -> int:
        return sum(b.num_rows for b in self.out)


def _copy(column: pa.Array) -> pa.Array:
    """A copy of ``column`` that the run keeps, in numpy's memory where it has a numpy form: copies
    kept by pyarrow's allocator grow its memory in large steps, a pause of about 5 ms every hundred
    or so 31K-row copies on this kind of machine (numpy's: at most 0.7 ms)."""
    if pa.types.is_primitive(column.type) and not pa.types.is_boolean(column.type) and not column.null_count:
        return pa.array(column.to_numpy().copy(), column.type)
    return pa.concat_arrays([column])


def plan_batches(rate: float | None, batch_rows: int | None, batch_ms: float) -> tuple[int, int]:
    """(events per chunk, interval in us per chunk; 0 = as fast as possible)."""
    if rate is None or rate <= 0:
        return batch_rows or DEFAULT_BATCH_ROWS, 0
    rows = batch_rows or max(1, min(DEFAULT_BATCH_ROWS, int(round(rate * batch_ms / 1000))))
    return rows, max(1, int(round(rows * 1e6 / rate)))


def drive(engine, source: Source, output: str, events: int, rate: float | None = None,
          batch_rows: int | None = None, batch_ms: float = DEFAULT_BATCH_MS,
          tick: Callable[[Run, int], None] | None = None, tick_s: float = 1.0,
          keep: list[str] | None = None) -> Run:
    """Send ``events`` events of ``source`` (open loop at ``rate`` events/s, or as fast as
    possible), then end its streams; returns the :class:`Run`.

    ``tick(run, sent)`` is called about every ``tick_s`` seconds (progress
    display). Output batches are kept by reference, or only copies of their
    columns ``keep`` when given (so the rest of their memory can go), made
    between sends, off the thread that delivers the outputs.
    """
    run = Run(rate=rate)
    rows, dt_us = plan_batches(rate, batch_rows, batch_ms)
    source.prepare(events)

    arrived: deque = deque()  # output batches whose columns ``keep`` are still to be copied

    def on_output(batch: pa.RecordBatch) -> None:
        run.out_t.append(time.time_ns())
        if keep is None:
            run.out.append(batch)
        else:  # copied between sends, not here: the next batch's delivery would wait for the copy
            arrived.append(batch)

    def settle() -> None:
        while arrived:  # a copy: a column of a received batch is a slice of its whole buffer
            batch = arrived.popleft()
            run.out.append(pa.RecordBatch.from_arrays([_copy(batch.column(c)) for c in keep], names=keep))

    engine.subscribe(output, on_output)
    gc.freeze()
    now = time.time_ns()
    run.t_start = now
    t0_us = now // 1000
    next_tick = now + int(tick_s * 1e9)
    sent, j, last_key = 0, 0, 0
    while sent < events:
        n = min(rows, events - sent)
        if dt_us:
            base = t0_us + j * dt_us
            keys = base + (np.arange(n, dtype=np.int64) * dt_us) // rows
            due = (base + dt_us) * 1000
            wait = due - time.time_ns()
            if wait > 0:
                time.sleep(wait / 1e9)
        elif source.nominal_rate:
            keys = t0_us + (np.arange(sent, sent + n, dtype=np.float64) * (1e6 / source.nominal_rate)).astype(np.int64)
        else:
            last_key = max(time.time_ns() // 1000, last_key + 1)
            keys = np.full(n, last_key, np.int64)
        parts = source.batches(sent, n, keys)
        run.send_t.append(time.time_ns())
        for stream, batch in parts:
            if batch.num_rows:
                engine.send(stream, batch)
        done = time.time_ns()
        settle()
        run.send_done.append(done)
        run.send_first.append(int(keys[0]))
        run.send_last.append(int(keys[-1]))
        run.send_rows.append(n)
        sent += n
        j += 1
        if tick is not None and done >= next_tick:
            tick(run, sent)
            next_tick = done + int(tick_s * 1e9)
    run.events = sent
    run.t_end = time.time_ns()
    for stream in source.streams:
        engine.end(stream)
    run.t_done = time.time_ns()
    settle()
    if tick is not None:
        tick(run, sent)
    return run
