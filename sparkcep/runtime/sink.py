"""The engine's end of a deployment's outputs: output channels into the output logs, one epoch at a time."""

from __future__ import annotations

import time

from sparkcep.core import columns
from sparkcep.runtime.channels import Abort, Consumer, Data, Progress
from sparkcep.runtime.layout import ENGINE, Endpoint, Layout
from sparkcep.runtime.metrics import EpochClock, Histogram, record_latency
from sparkcep.runtime.output_log import OutputLog


class Sink:
    """The engine's end of a deployment's outputs: fills the output logs, knows which epochs are out.

    Rows are staged per epoch and reach the logs (and subscribers) only once
    every producer has closed that epoch, in epoch order: an epoch that
    failed half-way, or was aborted, never shows. Partition of an output log
    = index of the producing instance.
    """

    def __init__(self, layout: Layout, logs: dict[str, OutputLog], clock: EpochClock,
                 channels: dict[Endpoint, Consumer]):
        self.layout, self.logs, self.clock = layout, logs, clock
        self.channels = [(p, channels[p]) for p in layout.producers(ENGINE)]
        self.epochs = {p: 0 for p, _ in self.channels}
        self.staged: dict[int, list[tuple[int, Data]]] = {}  # epoch -> (partition, message), in arrival order
        self.aborted: set[int] = set()
        self.published = 0  # every epoch up to this one is in the logs (or was aborted)
        self.latency: dict[str, Histogram] = {}
        self.rows: dict[str, int] = {}

    def poll(self) -> int:
        done = 0
        for producer, ch in self.channels:
            while (msg := ch.receive()) is not None:
                done += 1
                kind = type(msg)
                if kind is Data:
                    self.staged.setdefault(msg.epoch, []).append((producer[1], msg))
                elif kind is Progress or kind is Abort:
                    self.epochs[producer] = msg.epoch
                    if kind is Abort:
                        self.aborted.add(msg.epoch)
        closed = min(self.epochs.values()) if self.epochs else 0
        if closed > self.published:
            self._publish(closed)
        return done

    def _publish(self, upto: int) -> None:
        for epoch in sorted(e for e in self.staged if e <= upto):
            messages = self.staged.pop(epoch)
            if epoch not in self.aborted:
                self._deliver(messages)
        self.aborted = {e for e in self.aborted if e > upto}
        self.published = upto

    def _deliver(self, messages: list[tuple[int, Data]]) -> None:
        """One epoch's rows into the logs, each log taking all of them at once."""
        now = time.monotonic_ns()
        per_log: dict[str, list] = {}
        for partition, msg in messages:
            seq = msg.batch.column(columns.SEQ).to_numpy()
            for out in self.layout.output_names(msg.port):
                record_latency(self.latency.setdefault(out, Histogram()), self.clock, seq, now)
                self.rows[out] = self.rows.get(out, 0) + msg.batch.num_rows
                per_log.setdefault(out, []).append((partition, msg.batch))
        for out, batches in per_log.items():
            self.logs[out].extend(batches)

    @property
    def done_epoch(self) -> int:
        """Every epoch up to this one has fully reached the output logs."""
        return self.published
