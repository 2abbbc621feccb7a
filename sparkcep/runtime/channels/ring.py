"""Channels: how batches and progress travel from one producer to one consumer.

A channel carries, in order, three kinds of message:

* :class:`Data` — a batch for input ``port`` of the consumer, stamped with the
  *epoch* it belongs to (one epoch per engine progress point) plus that
  epoch's frontier and arrival time;
* :class:`Progress` — the producer has sent everything of ``epoch``; its
  output watermark is ``watermark``;
* :class:`Abort` — ``epoch`` is void: the engine could not take the whole of
  the ``send`` it belonged to, so every consumer drops its data of that epoch
  (stashed rows, staged output rows) and passes the abort on.

The interface is what a consumer and a producer call (``send_data``,
``send_progress``, ``abort``, ``flush``, ``receive``); the implementations:

* :class:`LocalChannel` — a queue inside one process (``workers=0``);
* :class:`RingWriter` / :class:`RingReader` — the two ends of a bounded
  shared-memory ring between processes. Batches travel as Arrow IPC record
  batch messages (the schema once per port), written by Arrow straight into
  the ring (serialised into a buffer first only when they must wait in the
  backlog); a reader built with
  ``copy=False`` hands out batches that point into the ring itself (zero
  copy), valid until its next ``receive``. A full ring never drops anything:
  a writer keeps what does not fit in its *backlog* (already serialised) and
  the owner decides whether to wait (:meth:`RingWriter.flush_blocking`, the
  engine's ``send``) or to stop reading its own inputs until the backlog
  drains (instance managers). That is the back-pressure. Data never takes
  the last ``CONTROL_RESERVE`` bytes of a ring: progress and aborts always
  fit, so an epoch whose data is in can always be closed. A record larger
  than half the ring (one huge row) travels in fragments.

A process sleeping on its channels waits on its :class:`Doorbell` (a FIFO): a
short spin, then the wait; peers ring it only when the ring's header says
the other side sleeps. (A TCP channel between hosts implements the same
interface; it comes with the control-plane work.)

Memory order: the ring relies on x86 total store order (a header position
is stored after the bytes it publishes); sleeps are bounded by a timeout, so
a missed wake-up costs at most that long.
"""

from __future__ import annotations

import errno
import mmap
import os
import select
import struct
import time
from collections import deque

import numpy as np
import pyarrow as pa

from sparkcep.errors import EngineError

DATA, PROGRESS, SCHEMA, WRAP, ABORT, FRAGMENT = 1, 2, 3, 4, 5, 6
HEADER_BYTES = 256
_W, _R, _READER_SLEEPS, _WRITER_SLEEPS, _CAP = 0, 8, 16, 24, 4  # int64 slots of the header
_REC = struct.Struct("<ii")            # record: length (bytes, incl. this, padded to 8), kind
_DATA = struct.Struct("<qqqiiii")      # epoch, frontier, arrival ns, port, body length, bytes before the body, 0
_PROGRESS = struct.Struct("<qqqq")     # epoch, frontier, watermark, arrival ns
_SCHEMA = struct.Struct("<ii")         # port, body length
_ABORT = struct.Struct("<q")           # epoch
_FRAGMENT = struct.Struct("<ii")       # 1 on the last fragment of a record, 0
CONTROL_RESERVE = 4096  # bytes of every ring that data never takes (progress and aborts always fit)
DEFAULT_CAPACITY = 16 << 20  # a message takes up to 1/4 of it: ~20K HiBench records, so per-message costs stay small


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
    """``epoch`` is void: drop its data and pass the abort on (see the module docstring)."""

    __slots__ = ("epoch",)

    def __init__(self, epoch: int):
        self.epoch = epoch


class Channel:
    """One producer -> one consumer, messages in order, nothing lost."""

    def send_data(self, port: int, stamp: tuple[int, int, int], batch: pa.RecordBatch) -> None:
        """Queue ``batch`` for input ``port``; ``stamp`` is (epoch, frontier, arrival ns)."""
        raise NotImplementedError

    def send_progress(self, epoch: int, frontier: int, watermark: int, arrival: int) -> None:
        raise NotImplementedError

    def abort(self, epoch: int) -> None:
        """Void ``epoch``: what of it still waits here is dropped, the consumer gets :class:`Abort`."""
        raise NotImplementedError

    def flush(self) -> bool:
        """Move backlog into the channel; True when nothing is left waiting."""
        return True

    @property
    def backlog_bytes(self) -> int:
        """Bytes the producer holds because the channel was full."""
        return 0

    def receive(self) -> Data | Progress | Abort | None:
        """The next message, or None when there is none yet."""
        raise NotImplementedError

    @property
    def queued_bytes(self) -> int:
        """Bytes sent and not yet received."""
        return 0


class LocalChannel(Channel):
    """A channel inside one process: a queue of message objects (no copies)."""

    def __init__(self):
        self.queue: deque = deque()

    def send_data(self, port, stamp, batch):
        self.queue.append(Data(port, stamp[0], stamp[1], stamp[2], batch))

    def send_progress(self, epoch, frontier, watermark, arrival):
        self.queue.append(Progress(epoch, frontier, watermark, arrival))

    def abort(self, epoch):
        self.queue.append(Abort(epoch))

    def receive(self):
        return self.queue.popleft() if self.queue else None

    @property
    def queued_bytes(self) -> int:
        return sum(m.batch.nbytes for m in self.queue if isinstance(m, Data))


# --- doorbells ---------------------------------------------------------------------------------
class Doorbell:
    """Wakes one sleeping thread of one process: a named FIFO it waits on with ``select``.

    The owner creates it (:meth:`create`) and reads it; any process may ring
    it by path. Ringing is one non-blocking 1-byte write; a full FIFO or a
    gone owner is ignored (the owner is already awake, or dead).
    """

    def __init__(self, path: str):
        self.path = path
        self._rfd = self._wfd = -1

    @classmethod
    def create(cls, path: str) -> "Doorbell":
        os.mkfifo(path, 0o600)
        bell = cls(path)
        bell.fileno()
        return bell

    def fileno(self) -> int:
        """The read end (opened on first use by the owner)."""
        if self._rfd < 0:
            self._rfd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        return self._rfd

    def ring(self) -> None:
        if self._wfd < 0:
            try:
                self._wfd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # no reader (the owner is gone) or no FIFO any more
                return
        try:
            os.write(self._wfd, b"\0")
        except BlockingIOError:
            pass  # full: a wake-up is pending anyway
        except OSError:
            pass  # the owner is gone

    def drain(self) -> None:
        try:
            while os.read(self.fileno(), 4096):
                pass
        except BlockingIOError:
            pass

    def wait(self, timeout: float, also=()) -> list:
        """Sleep until rung (or one of the file objects ``also`` is readable) or ``timeout``."""
        ready, _, _ = select.select([self.fileno(), *also], [], [], timeout)
        if self._rfd in ready:
            self.drain()
        return ready

    def close(self, unlink: bool = False) -> None:
        for fd in (self._rfd, self._wfd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._rfd = self._wfd = -1
        if unlink:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


# --- shared-memory rings ---------------------------------------------------------------------------
def create_ring(path: str, capacity: int = DEFAULT_CAPACITY) -> None:
    """Create the shared-memory file of a ring of ``capacity`` bytes (a power of two)."""
    if capacity < 4096 or capacity & (capacity - 1):
        raise EngineError(f"ring capacity must be a power of two >= 4096, got {capacity}", "RING")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, HEADER_BYTES + capacity)
        mm = mmap.mmap(fd, HEADER_BYTES + capacity)
        np.frombuffer(mm, np.int64, count=HEADER_BYTES // 8)[_CAP] = capacity
        del mm
    finally:
        os.close(fd)


class _Ring:
    """The mapping of one ring, shared by its two ends."""

    def __init__(self, path: str, peer: Doorbell | None):
        self.path, self.peer = path, peer
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            self.mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.head = np.frombuffer(self.mm, np.int64, count=HEADER_BYTES // 8)
        self.capacity = int(self.head[_CAP])
        if self.capacity + HEADER_BYTES != size:
            raise EngineError(f"ring {path}: header says {self.capacity} bytes, file has {size - HEADER_BYTES}",
                              "RING")
        self.bytes = np.frombuffer(self.mm, np.uint8, count=self.capacity, offset=HEADER_BYTES)
        self.view = memoryview(self.mm)[HEADER_BYTES:]
        self.reserve = min(CONTROL_RESERVE, self.capacity // 8)  # never taken by data
        # a record this large fits wherever the ring's free space starts, padding to the end included
        self.max_record = (self.capacity - self.reserve) // 2 & ~7

    def touch(self) -> None:
        """Fault every page in from this process (first touch places it on this process's NUMA node).

        Reads only: the other end may have written already.
        """
        int(self.bytes[::4096].sum())

    def used(self) -> int:
        return int(self.head[_W] - self.head[_R])

    def close(self) -> None:
        self.view.release()
        self.head = self.bytes = None
        try:
            self.mm.close()
        except BufferError:  # zero-copy batches still point into it: the mapping goes with them
            pass


class RingWriter(Channel):
    """The producer end of a ring. Never blocks: what does not fit waits in the backlog.

    A batch waiting in the backlog is copied out first, as it may point into
    an input ring that is about to be reused; unless ``batches_stay``: the
    caller keeps its batches valid until they are flushed (the engine's
    sources, whose ``send`` returns only once the rings have taken everything).
    """

    def __init__(self, path: str, reader_bell: Doorbell | None, writer_bell: Doorbell | None = None,
                 batches_stay: bool = False):
        self.ring = _Ring(path, reader_bell)
        self.batches_stay = batches_stay
        self.writer_bell = writer_bell  # ours: the reader rings it when it frees space we wait for
        self.w = int(self.ring.head[_W])
        self.backlog: deque = deque()
        self._backlog_bytes = 0
        self.schemas: dict[int, pa.Schema] = {}
        self._skip: dict[int, int] = {}  # per port: bytes of the schema message a stream writer puts first
        self.bytes_out = 0

    # --- sending ---------------------------------------------------------------------------
    def send_data(self, port, stamp, batch):
        schema = self.schemas.get(port)
        if schema is None or (schema is not batch.schema and not schema.equals(batch.schema)):
            self.schemas[port] = batch.schema
            body = batch.schema.serialize()
            self._skip[port] = body.size
            self._put(SCHEMA, _SCHEMA.pack(port, body.size), body, body.size, None)
        limit = self.ring.max_record - 4096
        if batch.nbytes > limit // 2 and batch.num_rows > 1:  # cut into slices that fit a record
            rows = max(1, int(batch.num_rows * (limit // 2) / batch.nbytes))
            for start in range(0, batch.num_rows, rows):
                self._send_batch(port, stamp, batch.slice(start, rows), limit)
        else:
            self._send_batch(port, stamp, batch, limit)

    def _send_batch(self, port, stamp, batch, limit):
        size = pa.ipc.get_record_batch_size(batch)
        if size > limit and batch.num_rows > 1:
            half = batch.num_rows // 2
            self._send_batch(port, stamp, batch.slice(0, half), limit)
            self._send_batch(port, stamp, batch.slice(half), limit)
            return
        # written in place by an Arrow stream writer: the schema message, the batch, end of stream
        skip = self._skip[port]
        self._put(DATA, _DATA.pack(stamp[0], stamp[1], stamp[2], port, size, skip, 0), batch, skip + size + 8,
                  stamp[0])

    def send_progress(self, epoch, frontier, watermark, arrival):
        self._put(PROGRESS, _PROGRESS.pack(epoch, frontier, watermark, arrival), None, 0, None)

    def abort(self, epoch):
        """Drop the backlog's records of ``epoch`` and queue :class:`Abort` behind what stays."""
        kept = [item for item in self.backlog if item[4] != epoch]
        self.backlog = deque(kept)
        self._backlog_bytes = sum(item[3] for item in kept)
        self._put(ABORT, _ABORT.pack(epoch), None, 0, None)

    def _put(self, kind: int, head: bytes, body, body_size: int, epoch: int | None) -> None:
        """Queue a record whose ``body`` is a Buffer, a RecordBatch (written in place) or None.

        ``epoch``: the epoch whose data it carries (None for schemas and control records).
        """
        need = (_REC.size + len(head) + body_size + 7) & ~7
        if need > self.ring.max_record:
            self._put_fragments(kind, head, body, epoch)
            return
        if self.backlog or not self._try_put(kind, head, body, need):
            if isinstance(body, pa.RecordBatch) and not self.batches_stay:  # copy it out of a ring now
                head, body = self._serialized(head, body)
                need = (_REC.size + len(head) + body.size + 7) & ~7
            self.backlog.append((kind, head, body, need, epoch))
            self._backlog_bytes += need

    @staticmethod
    def _serialized(head: bytes, batch: pa.RecordBatch) -> tuple[bytes, pa.Buffer]:
        """A DATA record's header and body with the batch as one IPC message (no schema before it)."""
        epoch, frontier, arrival, port, size, _, _ = _DATA.unpack(head)
        body = batch.serialize()
        return _DATA.pack(epoch, frontier, arrival, port, body.size, 0, 0), body

    def _put_fragments(self, kind: int, head: bytes, body, epoch: int | None) -> None:
        """A record larger than half the ring, cut into FRAGMENT records the reader joins again."""
        if isinstance(body, pa.RecordBatch):
            head, body = self._serialized(head, body)
        record = bytearray(_REC.pack(0, kind) + head)
        if body is not None:
            record += memoryview(body)
        _REC.pack_into(record, 0, len(record), kind)
        piece = self.ring.max_record - _REC.size - _FRAGMENT.size - 8
        for start in range(0, len(record), piece):
            chunk = pa.py_buffer(bytes(record[start:start + piece]))
            last = int(start + piece >= len(record))
            self._put(FRAGMENT, _FRAGMENT.pack(last, 0), chunk, chunk.size, epoch)

    def _try_put(self, kind: int, head: bytes, body, need: int) -> bool:
        ring = self.ring
        cap, w = ring.capacity, self.w
        free = cap - (w - int(ring.head[_R]))
        if kind != PROGRESS and kind != ABORT:
            free -= ring.reserve
        pos = w & (cap - 1)
        if pos + need > cap:  # not contiguous: pad to the end and start over at 0
            tail = cap - pos
            if free < tail + need:
                return False
            _REC.pack_into(ring.view, pos, tail, WRAP)
            w += tail
            pos = 0
        elif free < need:
            return False
        _REC.pack_into(ring.view, pos, need, kind)
        at = pos + _REC.size
        ring.view[at:at + len(head)] = head
        at += len(head)
        if isinstance(body, pa.RecordBatch):
            self._write_batch(body, head, at, pos + need)
        elif body is not None:
            ring.bytes[at:at + body.size] = np.frombuffer(body, np.uint8)
        self.w = w + need
        ring.head[_W] = self.w
        self.bytes_out += need
        if ring.head[_READER_SLEEPS] and ring.peer is not None:
            ring.peer.ring()
        return True

    def _write_batch(self, batch: pa.RecordBatch, head: bytes, start: int, end: int) -> None:
        """Let Arrow write ``batch`` as a one-batch stream into ``ring[start:end]`` (no copy in between)."""
        sink = pa.FixedSizeBufferWriter(pa.py_buffer(self.ring.view[start:end]))
        writer = pa.ipc.new_stream(sink, batch.schema)
        writer.write_batch(batch)
        writer.close()
        _, _, _, _, size, skip, _ = _DATA.unpack(head)
        if sink.tell() != skip + size + 8:
            raise EngineError(f"ring {self.ring.path}: a batch took {sink.tell()} bytes in place, "
                              f"{skip + size + 8} expected (dictionary columns are not supported)", "RING")

    def map_pages(self) -> None:
        """Map every page of the ring in this process now, not one fault at a time while writing.

        Call it once the reader has touched them: first touch places a page
        on the toucher's NUMA node. Unmapped pages still work, a fault each.
        """
        self.ring.touch()

    def flush(self) -> bool:
        while self.backlog:
            kind, head, body, need, _ = self.backlog[0]
            if not self._try_put(kind, head, body, need):
                return False
            self.backlog.popleft()
            self._backlog_bytes -= need
        return True

    @property
    def backlog_bytes(self) -> int:
        return self._backlog_bytes

    @property
    def queued_bytes(self) -> int:
        return self.ring.used()

    def sleep_flag(self, on: bool) -> None:
        """Say (in the header) that we sleep until the reader frees space."""
        head = self.ring.head  # None once closed (maybe by another thread)
        if head is not None:
            head[_WRITER_SLEEPS] = 1 if on else 0

    def flush_blocking(self, timeout: float, check=None, spin: float = 50e-6) -> None:
        """Flush the whole backlog, waiting for the reader: a short spin, then sleeps on our doorbell.

        ``check()`` runs at every wake-up (it raises to abort, e.g. the reader
        died); after ``timeout`` seconds without progress, EngineError BACKPRESSURE_TIMEOUT.
        """
        if self.flush():
            return
        spin_until = time.perf_counter() + spin
        while time.perf_counter() < spin_until:
            if self.flush():
                return
        last, deadline = self.ring.used(), time.monotonic() + timeout
        while True:
            self.sleep_flag(True)
            if self.flush():
                self.sleep_flag(False)
                return
            if self.writer_bell is not None:
                self.writer_bell.wait(0.05)
            else:
                time.sleep(0.001)
            self.sleep_flag(False)
            if self.flush():
                return
            if check is not None:
                check()
            used = self.ring.used()
            if used != last:
                last, deadline = used, time.monotonic() + timeout
            elif time.monotonic() > deadline:
                raise EngineError(f"ring {self.ring.path}: the reader took nothing for {timeout:.0f} s",
                                  "BACKPRESSURE_TIMEOUT")

    def close(self) -> None:
        self.ring.close()


class RingReader(Channel):
    """The consumer end of a ring.

    With ``copy=False`` a received batch points into the ring and stays valid
    only until the next :meth:`receive`; with ``copy=True`` it owns its memory.
    """

    def __init__(self, path: str, writer_bell: Doorbell | None, copy: bool = True, touch: bool = True):
        self.ring = _Ring(path, writer_bell)
        if touch:
            self.ring.touch()
        self.copy = copy
        self.r = int(self.ring.head[_R])
        self._next = self.r
        self.schemas: dict[int, pa.Schema] = {}
        self._parts: list[bytes] = []  # fragments of a record larger than half the ring
        self.bytes_in = 0

    def receive(self):
        ring = self.ring
        if self._next != self.r:
            self._release()
        cap = ring.capacity
        while True:
            r = self.r
            if r == int(ring.head[_W]):
                return None
            pos = r & (cap - 1)
            length, kind = _REC.unpack_from(ring.view, pos)
            if length <= 0 or length > cap:
                raise EngineError(f"ring {ring.path}: corrupt record of length {length} at {r}", "RING")
            self._next = r + length
            self.bytes_in += length
            if kind == FRAGMENT:
                msg = self._fragment(pos + _REC.size, pos + length)
            else:
                msg = self._record(kind, ring.view, ring.bytes, pos + _REC.size, self.copy)
            if msg is None or type(msg) is not Data or self.copy:
                self._release()
            if msg is not None:
                return msg

    def _fragment(self, at: int, end: int):
        """Add one fragment; the message of the record once its last fragment is in."""
        last, _ = _FRAGMENT.unpack_from(self.ring.view, at)
        at += _FRAGMENT.size
        self._parts.append(self.ring.bytes[at:end].tobytes())
        if not last:
            return None
        record = b"".join(self._parts)
        self._parts = []
        length, kind = _REC.unpack_from(record, 0)
        data = np.frombuffer(record, np.uint8, count=length)
        return self._record(kind, memoryview(record), data, _REC.size, False)

    def _record(self, kind: int, view: memoryview, data: np.ndarray, at: int, copy: bool):
        """The message of the record whose body starts at ``at`` (None for schemas and padding)."""
        if kind == WRAP:
            return None
        if kind == PROGRESS:
            return Progress(*_PROGRESS.unpack_from(view, at))
        if kind == ABORT:
            self._parts = []  # a record cut short by the abort
            return Abort(*_ABORT.unpack_from(view, at))
        if kind == SCHEMA:
            port, size = _SCHEMA.unpack_from(view, at)
            at += _SCHEMA.size
            self.schemas[port] = pa.ipc.read_schema(pa.py_buffer(data[at:at + size].copy()))
            return None
        if kind != DATA:
            raise EngineError(f"ring {self.ring.path}: unknown record kind {kind}", "RING")
        epoch, frontier, arrival, port, size, skip, _ = _DATA.unpack_from(view, at)
        at += _DATA.size + skip
        body = data[at:at + size]
        if copy:
            body = body.copy()
        return Data(port, epoch, frontier, arrival, pa.ipc.read_record_batch(pa.py_buffer(body), self.schemas[port]))

    def _release(self) -> None:
        ring = self.ring
        self.r = self._next
        ring.head[_R] = self.r
        if ring.head[_WRITER_SLEEPS] and ring.peer is not None:
            ring.peer.ring()

    def ready(self) -> bool:
        """Is there a message not received yet? (False once closed.)"""
        head = self.ring.head
        return head is not None and self._next != int(head[_W])

    def sleep_flag(self, on: bool) -> None:
        """Say (in the header) that we sleep until the writer sends something."""
        head = self.ring.head
        if head is not None:
            head[_READER_SLEEPS] = 1 if on else 0

    @property
    def queued_bytes(self) -> int:
        return self.ring.used()

    def close(self) -> None:
        self.ring.close()


def unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError as e:
        if e.errno != errno.ENOENT:
            raise
