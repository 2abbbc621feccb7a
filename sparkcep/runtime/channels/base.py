"""The channel interface: one producer -> one consumer, records in order, nothing lost.

A channel carries, in order:

* :class:`Data` — a batch for input ``port`` of the consumer, stamped with the
  *epoch* it belongs to (one epoch per engine ``send``) plus that epoch's
  frontier and arrival time;
* :class:`Progress` — the producer has sent everything of ``epoch``; its
  output watermark is ``watermark``;
* :class:`Abort` — ``epoch`` is void: the engine could not take the whole
  ``send`` it belonged to, so every consumer drops its data of that epoch and
  passes the abort on;
* control records (:class:`Control` subclasses such as :class:`Configure`):
  typed, numbered, applied when the consumer's frontier reaches their epoch
  (Megaphone's configuration updates), passed on like progress.

A :class:`Producer` never blocks: what the channel cannot take now waits in
its *backlog*, and its owner decides whether to wait
(:meth:`Producer.flush_blocking`, the engine's ``send``) or to stop reading
its own inputs until the backlog drains (instance managers). That is the
back-pressure: a slow consumer slows its producers, nothing is dropped.
Progress, aborts and control records always fit (each implementation keeps
room for them), so an epoch whose data is in can always be closed.

A :class:`Consumer` returns ``None`` when nothing is there yet; a process
sleeping on several consumers waits on their :meth:`Consumer.fileno` (one
per process for shared-memory rings, the socket for network channels)
after setting :meth:`Consumer.sleep_flag`. A producer that closed cleanly
leaves its consumer :attr:`Consumer.closed` once drained; one that died
makes :meth:`Consumer.receive` raise :class:`ChannelClosed`.

Implementations: :class:`LocalChannel` (both ends in one process),
:mod:`.ring` (shared memory, same host), :mod:`.tcp` (network).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field

import pyarrow as pa

from sparkcep.errors import EngineError

SPIN_S = 50e-6  # flush_blocking spins this long before it sleeps


class ChannelClosed(EngineError):
    """The other end of a channel is gone (died, or closed the connection mid-record)."""

    code = "PEER_DIED"


class Data:
    """A batch for input ``port``, part of ``epoch`` (whose frontier and arrival time it carries)."""

    __slots__ = ("port", "epoch", "frontier", "arrival", "batch")

    def __init__(self, port: int, epoch: int, frontier: int, arrival: int, batch: pa.RecordBatch):
        self.port, self.epoch, self.frontier, self.arrival, self.batch = port, epoch, frontier, arrival, batch


class Progress:
    """Everything of ``epoch`` has been sent; the producer's output watermark is ``watermark``."""

    __slots__ = ("epoch", "frontier", "watermark", "arrival")

    def __init__(self, epoch: int, frontier: int, watermark: int, arrival: int):
        self.epoch, self.frontier, self.watermark, self.arrival = epoch, frontier, watermark, arrival


class Abort:
    """``epoch`` is void: drop its data and pass the abort on."""

    __slots__ = ("epoch",)

    def __init__(self, epoch: int):
        self.epoch = epoch


@dataclass
class Control:
    """A control record: ``number`` orders it among the deployment's control records, and it takes
    effect at the start of ``epoch`` (once every record of the epochs before it was consumed)."""

    epoch: int
    number: int


@dataclass
class Configure(Control):
    """From ``epoch`` on, bin ``bins[i]`` of stateful operator ``operator`` belongs to instance ``owners[i]``;
    the other bins keep theirs. Only the bins that change travel: a step of a migration over 65,536 bins
    moves a few of them, and carrying the whole table made every step cost as much as the table."""

    operator: str
    bins: list[int] = field(default_factory=list)
    owners: list[int] = field(default_factory=list)


@dataclass
class Export(Control):
    """At ``epoch``, instances of the sub-query headed by ``operator`` hand state over.

    Each item ``[instance, ticket, host, how, bins]``: that instance hands, under
    ``ticket``, to the process ``host`` (an instance manager's name, or the
    engine's), ``how`` = ``"take"`` (the ``bins`` leave it; None: every bin it
    holds), ``"copy"`` (a copy of them, for a replica catching up) or
    ``"adopt"`` (the whole instance, to its successor in the same process).
    """

    operator: str
    items: list = field(default_factory=list)


@dataclass
class Import(Control):
    """At ``epoch``, each item's instance ``[instance, ticket]`` of the sub-query headed by ``operator``
    installs what was handed over under ``ticket`` before it consumes anything more."""

    operator: str
    items: list = field(default_factory=list)


@dataclass
class Retire(Control):
    """The producer's generation of the deployment ends here: an instance passes it on and stops, the
    engine's sink stops waiting for that producer."""


CONTROL_TYPES: dict[str, type[Control]] = {"configure": Configure, "export": Export, "import": Import,
                                           "retire": Retire}


class Producer(ABC):
    """The sending end of a channel. Never blocks: what does not fit waits in the backlog."""

    #: it holds the batches sent by reference until its consumer takes them: they must own their
    #: memory, never point into a ring the sender reads without copying
    keeps_batches: bool = False

    @abstractmethod
    def send_data(self, port: int, stamp: tuple[int, int, int], batch: pa.RecordBatch) -> None:
        """Queue ``batch`` for input ``port``; ``stamp`` is (epoch, frontier, arrival ns)."""

    @abstractmethod
    def send_progress(self, epoch: int, frontier: int, watermark: int, arrival: int) -> None:
        """Queue the end of ``epoch``."""

    @abstractmethod
    def send_control(self, record: Control) -> None:
        """Queue a control record (after everything queued before it)."""

    @abstractmethod
    def abort(self, epoch: int) -> None:
        """Void ``epoch``: what of it still waits in the backlog is dropped, the consumer gets :class:`Abort`."""

    @abstractmethod
    def flush(self) -> bool:
        """Move backlog into the channel; True when nothing is left waiting."""

    @property
    @abstractmethod
    def backlog_bytes(self) -> int:
        """Bytes the producer holds because the channel was full."""

    @abstractmethod
    def wait_writable(self, timeout: float) -> None:
        """Sleep until the consumer may have made room (or ``timeout``)."""

    def fileno(self) -> int | None:
        """A file descriptor that becomes readable when the consumer made room after :meth:`sleep_flag`
        (None: the owner's doorbell, which a ring's consumer rings)."""
        return None

    def sleep_flag(self, on: bool) -> None:
        """Say the owner is about to sleep until the consumer makes room."""

    def hold_wakes(self) -> None:
        """Until :meth:`release_wakes`, do not wake a sleeping consumer for what is written."""

    def release_wakes(self) -> None:
        """Wake the consumer once for what was written since :meth:`hold_wakes`, if it sleeps."""

    @abstractmethod
    def check_peer(self) -> None:
        """Raise :class:`ChannelClosed` if the consumer is gone."""

    @abstractmethod
    def close(self) -> None:
        """Close cleanly: the consumer sees :attr:`Consumer.closed` once it received everything."""

    def close_now(self) -> None:
        """Close without waiting for the consumer to take what is queued (its generation is undeployed:
        nothing still in the channel is wanted)."""
        self.close()

    def flush_blocking(self, timeout: float, check=None) -> None:
        """Flush the whole backlog, waiting for the consumer.

        ``check()`` runs at every wake-up (it raises to abort, e.g. the
        deployment failed); after ``timeout`` seconds in which the consumer
        took nothing, EngineError ``BACKPRESSURE_TIMEOUT``.
        """
        spin_until = time.perf_counter() + SPIN_S
        while True:  # a short spin first: the consumer is often about to make room
            if self.flush():
                return
            if time.perf_counter() > spin_until:
                break
        last, deadline = self.backlog_bytes, time.monotonic() + timeout
        while True:
            self.wait_writable(0.05)
            if self.flush():
                return
            if check is not None:
                check()
            self.check_peer()
            left = self.backlog_bytes
            if left != last:
                last, deadline = left, time.monotonic() + timeout
            elif time.monotonic() > deadline:
                raise EngineError(f"{self}: the consumer took nothing for {timeout:.0f} s", "BACKPRESSURE_TIMEOUT")


class Consumer(ABC):
    """The receiving end of a channel."""

    closed: bool = False  # the producer closed cleanly and everything it sent was received

    @abstractmethod
    def receive(self) -> Data | Progress | Abort | Control | None:
        """The next message, or None when there is none yet; ChannelClosed if the producer died."""

    @abstractmethod
    def ready(self) -> bool:
        """Is a message (or the end of the channel) waiting? False once closed."""

    @abstractmethod
    def fileno(self) -> int | None:
        """A file descriptor that becomes readable when the producer sends after :meth:`sleep_flag`
        (None while there is none yet: a network end waiting for its peer's connection)."""

    def sleep_flag(self, on: bool) -> None:
        """Say the owner is about to sleep on :meth:`fileno` (so the producer must wake it)."""

    @property
    def queued_bytes(self) -> int:
        """Bytes sent and not yet received (as far as this end knows)."""
        return 0

    @abstractmethod
    def close(self) -> None:
        """Release this end."""


class LocalChannel(Producer, Consumer):
    """Both ends of a channel inside one process: a queue of message objects, no copies, no limit.

    Between two instances of one instance manager (``keeps_batches=True``),
    its consumer is polled in the same loop as its producer, so the queue
    stays as short as one turn's output.
    """

    def __init__(self, keeps_batches: bool = False):
        self.queue: deque = deque()
        self.keeps_batches = keeps_batches

    def send_data(self, port, stamp, batch):
        self.queue.append(Data(port, stamp[0], stamp[1], stamp[2], batch))

    def send_progress(self, epoch, frontier, watermark, arrival):
        self.queue.append(Progress(epoch, frontier, watermark, arrival))

    def send_control(self, record):
        self.queue.append(record)

    def abort(self, epoch):
        self.queue.append(Abort(epoch))

    def flush(self):
        return True

    @property
    def backlog_bytes(self):
        return 0

    def wait_writable(self, timeout):
        pass

    def check_peer(self):
        pass

    def receive(self):
        return self.queue.popleft() if self.queue else None

    def ready(self):
        return bool(self.queue)

    def fileno(self):
        return None  # nothing to wait on: its producer runs in the consumer's thread

    @property
    def queued_bytes(self):
        return sum(m.batch.nbytes for m in self.queue if isinstance(m, Data))

    def close(self):
        self.queue.clear()
