"""The engine's end of a deployment's outputs: output channels into the output logs, one epoch at a time."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from sparkcep.core import columns
from sparkcep.runtime.channels import Abort, Consumer, Data, Progress, Retire
from sparkcep.runtime.layout import Endpoint, Layout
from sparkcep.runtime.metrics import EpochClock, Histogram, record_latency
from sparkcep.runtime.output_log import NotHeld, SubscriberError, extend_logs

EPOCH_LOG = 1 << 14  # epochs whose publication the sink remembers (time, epoch, latency)


@dataclass
class Feed:
    """One output channel: the producing instance's index (the output partition), its end, and the last
    epoch it closed. A feed of a generation that started at epoch E counts as having closed E - 1."""

    partition: int
    end: Consumer
    epoch: int
    retired: bool = False


class Sink:
    """The engine's end of a deployment's outputs: fills the output logs, knows which epochs are out.

    Rows are staged per epoch and reach the logs (and subscribers) only once
    every feed has closed that epoch, in epoch order: an epoch that failed
    half-way, or was aborted, never shows. Partition of an output log =
    index of the producing instance. A deployment changing generation (State
    Transfer, rescaling, a replica rebuilt) adds the new generation's feeds
    and retires the old ones when their ``Retire`` record arrives.

    ``deliver(epoch, {output: [(partition, batch)]})`` takes each epoch's rows
    and returns the error of a subscriber that raised, if one did; by default
    they go into the output logs. When a log cannot show rows yet
    (:class:`~sparkcep.runtime.output_log.NotHeld`: a cluster's data path
    without a standby), that epoch and the later ones wait for the next poll.

    ``after = (sink, epoch)``: publish nothing until ``sink`` published up to
    ``epoch`` — a replica rebuilt from epoch ``epoch + 1`` on, whose
    survivor's earlier epochs must reach the logs first.
    """

    def __init__(self, layout: Layout, logs: dict, clock: EpochClock, deliver=None):
        self.layout, self.logs, self.clock = layout, logs, clock
        self.deliver = deliver or self._into_logs
        self.feeds: list[Feed] = []
        self.staged: dict[int, list[tuple[int, Data]]] = {}  # epoch -> (partition, message), in arrival order
        self.aborted: set[int] = set()
        self.published = 0  # every epoch up to this one is in the logs (or was aborted)
        self.latency: dict[str, Histogram] = {}
        self.rows: dict[str, int] = {}
        self.epoch_log: deque = deque(maxlen=EPOCH_LOG)  # (publication time ns, epoch, latency ns)
        self.after: tuple[Sink, int] | None = None

    def add(self, channels: dict[Endpoint, Consumer], after_epoch: int) -> list[Feed]:
        """Read ``channels`` (producer -> end) from epoch ``after_epoch + 1`` on; returns their feeds."""
        feeds = [Feed(p[1], end, after_epoch) for p, end in channels.items()]
        self.feeds = self.feeds + feeds  # a new list: the collector thread may be going through the old one
        return feeds

    def drop(self, feeds: list[Feed], after_epoch: int) -> None:
        """Stop reading ``feeds`` (their generation died) and forget the epochs staged so far, which they
        left incomplete: the next generation's feeds take over after ``after_epoch``."""
        self.feeds = [f for f in self.feeds if all(f is not g for g in feeds)]
        self.staged.clear()
        self.aborted.clear()
        self.published = after_epoch

    def poll(self) -> int:
        done = 0
        for feed in self.feeds:
            ch = feed.end
            while not feed.retired and (msg := ch.receive()) is not None:
                done += 1
                kind = type(msg)
                if kind is Data:
                    self.staged.setdefault(msg.epoch, []).append((feed.partition, msg))
                elif kind is Progress or kind is Abort:
                    feed.epoch = msg.epoch
                    if kind is Abort:
                        self.aborted.add(msg.epoch)
                elif kind is Retire:
                    feed.retired = True
        if done and any(f.retired for f in self.feeds):
            self.feeds = [f for f in self.feeds if not f.retired]
        closed = min((f.epoch for f in self.feeds), default=0)
        if closed > self.published and self._behind() is None:
            self._publish(closed)
        return done

    def _behind(self) -> int | None:
        """The epoch another sink publishes first (:attr:`after`), while it has not yet."""
        if self.after is not None:
            sink, epoch = self.after
            if sink.published < epoch:
                return sink.published
            self.after = None
        return None

    def _publish(self, upto: int) -> None:
        """Publish the epochs up to ``upto``; a subscriber that raised is raised once they are out
        (:class:`~sparkcep.runtime.output_log.SubscriberError`)."""
        now, failed = time.monotonic_ns(), None
        for epoch in sorted(e for e in self.staged if e <= upto):
            if epoch not in self.aborted:
                try:
                    error = self._stage_out(epoch, self.staged[epoch], now)
                    failed = failed or error
                except NotHeld:
                    upto = epoch - 1
                    break
            del self.staged[epoch]
        for epoch in range(self.published + 1, upto + 1):
            arrival = self.clock.arrival_of(epoch)
            if arrival is not None:
                self.epoch_log.append((now, epoch, now - arrival))
        self.aborted = {e for e in self.aborted if e > upto}
        self.published = upto
        if failed is not None:
            raise failed

    def _stage_out(self, epoch: int, messages: list[tuple[int, Data]], now: int) -> SubscriberError | None:
        per_log: dict[str, list] = {}
        for partition, msg in messages:
            for out in self.layout.output_names(msg.port):
                per_log.setdefault(out, []).append((partition, msg.batch))
        failed = self.deliver(epoch, per_log)
        for out, batches in per_log.items():
            for _, batch in batches:
                seq = batch.column(columns.SEQ).to_numpy()
                record_latency(self.latency.setdefault(out, Histogram()), self.clock, seq, now)
                self.rows[out] = self.rows.get(out, 0) + batch.num_rows
        return failed

    def _into_logs(self, epoch: int, per_log: dict[str, list]) -> SubscriberError | None:
        """One epoch's rows into the logs, each log taking all of them at once."""
        return extend_logs(self.logs, per_log, epoch)

    def retired(self, feeds: list[Feed]) -> bool:
        """Have all of ``feeds`` passed their generation's ``Retire`` record?"""
        return all(all(f is not g for g in self.feeds) for f in feeds)

    @property
    def done_epoch(self) -> int:
        """Every epoch up to this one has fully reached the output logs."""
        behind = self._behind()
        return self.published if behind is None else min(self.published, behind)
