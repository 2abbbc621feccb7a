"""Shared-memory channels between processes of one host: a bounded ring per channel.

The consumer creates the ring file (:func:`create_ring`, with the path of
its doorbell), the producer opens it and writes its own doorbell's path and
its pid into the header; each end rings the other's doorbell only when the
header says it sleeps. Batches travel as Arrow IPC messages written by Arrow
straight into the ring (serialised first only when they must wait in the
backlog); a consumer built with ``copy=False`` hands out batches that point
into the ring itself (zero copy), valid until its next ``receive``. Data
never takes the last ``CONTROL_RESERVE`` bytes, and a record larger than half
the ring (one huge row) travels in fragments.

Header (512 bytes, int64 slots; the positions and the two sleep flags each
on a cache line of their own): write position, read position, reader
sleeps, writer sleeps, then capacity, writer pid, reader pid, and the two
doorbell paths. An end about to sleep sets its flag, then looks once more;
the other end, seeing the flag, clears it and rings; between ``hold_wakes``
and ``release_wakes`` the producer rings once, at the release (an instance
holds them over an epoch's end: its results and progress arrive together).
Memory order relies on x86 total store order (a position is stored after the
bytes it publishes); sleeps are bounded by a timeout, so a missed wake-up
costs at most that long.
"""

from __future__ import annotations

import errno
import mmap
import os
import select
import time
from collections import deque

import numpy as np
import pyarrow as pa

from sparkcep.errors import EngineError
from sparkcep.runtime.channels import records as rec
from sparkcep.runtime.channels.base import ChannelClosed, Consumer, Control, Producer

HEADER_BYTES = 512
_W, _R, _READER_SLEEPS, _WRITER_SLEEPS = 0, 8, 16, 24  # int64 slots, one cache line each
_CAP, _WRITER_PID, _READER_PID = 32, 33, 34
_READER_BELL, _WRITER_BELL, _BELL_BYTES = 320, 416, 96  # byte offsets of the doorbell paths
DEFAULT_CAPACITY = 16 << 20  # a message takes up to ~1/2 of it: ~36K HiBench records, so per-message costs stay small
CONTROL_RESERVE = 4096  # bytes of every ring that data never takes (progress and aborts always fit)
PEER_CHECK_S = 0.2  # an idle consumer looks at most this often whether its producer still lives
# made once: without options, every stream writer looks two environment variables up (a 100-row
# record sent and received took 18.7 us with them, 15 without)
IPC_OPTIONS = pa.ipc.IpcWriteOptions()
# batches of at most this many rows are serialized and copied in, larger ones written in place by a stream
# writer: 100 HiBench rows took 6 us so against 13 in place, 5,000 took 135 against 64
SMALL_BATCH_ROWS = 256


class Doorbell:
    """Wakes one sleeping thread of one process: a named FIFO it waits on with ``select``.

    The owner creates it (:meth:`create`) and reads it, holding a write end
    too so that the FIFO never reads as ended when the last ringer closes
    (``select`` would then return at once, forever); any process may ring
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
        bell._wfd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # a writer always open: no end-of-file once ringers go
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
        except OSError:
            pass  # full (a wake-up is pending anyway) or the owner is gone

    def drain(self) -> None:
        """Empty the FIFO: one read, unless it came back full (a second read that finds it empty
        raised BlockingIOError on every wake-up)."""
        try:
            while len(os.read(self.fileno(), 4096)) == 4096:
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
            unlink_quietly(self.path)


def create_ring(path: str, capacity: int = DEFAULT_CAPACITY, reader_bell: str = "") -> None:
    """Create the shared-memory file of a ring of ``capacity`` bytes (a power of two) for a
    consumer sleeping on the doorbell at ``reader_bell``."""
    if capacity < 4096 or capacity & (capacity - 1):
        raise EngineError(f"ring capacity must be a power of two >= 4096, got {capacity}", "RING")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, HEADER_BYTES + capacity)
        mm = mmap.mmap(fd, HEADER_BYTES + capacity)
        head = np.frombuffer(mm, np.int64, count=HEADER_BYTES // 8)
        head[_CAP], head[_READER_PID] = capacity, os.getpid()
        _put_path(mm, _READER_BELL, reader_bell)
        del head, mm
    finally:
        os.close(fd)


def _put_path(mm, at: int, path: str) -> None:
    raw = path.encode()
    if len(raw) >= _BELL_BYTES:
        raise EngineError(f"doorbell path {path!r} is longer than {_BELL_BYTES - 1} bytes", "RING")
    mm[at:at + _BELL_BYTES] = raw.ljust(_BELL_BYTES, b"\0")


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs. A zombie (dead, not yet reaped by its parent) does not: the engine is
    the parent of its instance managers and may look at a ring before it reaps one."""
    if pid <= 0:
        return True  # not known yet
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True  # no /proc here: the signal said it exists
    return stat[stat.rindex(b")") + 2:][:1] not in (b"Z", b"X")  # the state follows "(command) "


class _Ring:
    """The mapping of one ring, shared by its two ends."""

    def __init__(self, path: str):
        self.path = path
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
        self._peer: Doorbell | None = None

    def peer(self, at: int) -> Doorbell | None:
        """The other end's doorbell (its path read from the header at byte ``at`` on first use)."""
        if self._peer is None:
            path = bytes(self.mm[at:at + _BELL_BYTES]).rstrip(b"\0").decode()
            if path:
                self._peer = Doorbell(path)
        return self._peer

    def touch(self) -> None:
        """Fault every page in from this process (first touch places it on this process's NUMA node).

        Reads only: the other end may have written already.
        """
        int(self.bytes[::4096].sum())

    def used(self) -> int:
        return int(self.head[_W] - self.head[_R])

    def close(self) -> None:
        if self._peer is not None:
            self._peer.close()
        self.view.release()
        self.head = self.bytes = None
        try:
            self.mm.close()
        except BufferError:  # zero-copy batches still point into it: the mapping goes with them
            pass


def _wake(ring: _Ring, flag: int, bell: int) -> None:
    """Ring the doorbell of the end whose sleep ``flag`` is set, clearing it: one ring wakes it, and it
    sets the flag again before it next sleeps (it was rung for every record written or released
    while it slept, a system call each)."""
    ring.head[flag] = 0
    if (peer := ring.peer(bell)) is not None:
        peer.ring()


class RingProducer(Producer):
    """The producer end of a ring. Never blocks: what does not fit waits in the backlog.

    ``bell``: this process's doorbell, rung by the consumer when it frees
    space we sleep for. A batch waiting in the backlog is copied out first,
    as it may point into an input ring that is about to be reused; unless
    ``batches_stay``: the caller keeps its batches valid until they are
    flushed (the engine's sources, whose ``send`` returns only once the
    rings have taken everything).
    """

    def __init__(self, path: str, bell: Doorbell | None = None, batches_stay: bool = False):
        self.ring = _Ring(path)
        self.bell, self.batches_stay = bell, batches_stay
        self.ring.head[_WRITER_PID] = os.getpid()
        _put_path(self.ring.mm, _WRITER_BELL, bell.path if bell is not None else "")
        self.w = int(self.ring.head[_W])
        self.backlog: deque = deque()  # (kind, head, body, bytes, epoch or None)
        self._backlog_bytes = 0
        self.schemas: dict[int, pa.Schema] = {}
        self._skip: dict[int, int] = {}  # per port: bytes of the schema message a stream writer puts first
        self.bytes_out = 0
        self.holding = False  # hold_wakes() was called: a wake-up the consumer is due waits
        self._wake_due = False

    def __repr__(self) -> str:
        return f"ring {self.ring.path}"

    # --- sending ---------------------------------------------------------------------------
    def send_data(self, port, stamp, batch):
        schema, known = batch.schema, self.schemas.get(port)
        if known is None or not known.equals(schema):
            self.schemas[port] = schema
            body = schema.serialize()
            self._skip[port] = body.size
            self._put(rec.SCHEMA, rec.SCHEMA_HEAD.pack(port, body.size), body, body.size, None)
        limit = self.ring.max_record - 4096
        if batch.num_rows <= SMALL_BATCH_ROWS:  # one IPC message copied in: a stream writer costs more
            head, body = rec.serialized_data(rec.DATA_HEAD.pack(stamp[0], stamp[1], stamp[2], port, 0, 0, 0), batch)
            if body.size <= limit:
                self._put(rec.DATA, head, body, body.size, stamp[0])
                return
        size = pa.ipc.get_record_batch_size(batch)  # a tenth of batch.nbytes' cost
        if size > limit and batch.num_rows > 1:  # cut into slices that fit a record
            rows = max(1, int(batch.num_rows * limit / size))
            for start in range(0, batch.num_rows, rows):
                part = batch.slice(start, rows)
                self._send_batch(port, stamp, part, limit, pa.ipc.get_record_batch_size(part))
        else:
            self._send_batch(port, stamp, batch, limit, size)

    def _send_batch(self, port, stamp, batch, limit, size):
        if size > limit and batch.num_rows > 1:
            half = batch.num_rows // 2
            for part in (batch.slice(0, half), batch.slice(half)):
                self._send_batch(port, stamp, part, limit, pa.ipc.get_record_batch_size(part))
            return
        # written in place by an Arrow stream writer: the schema message, the batch, end of stream
        skip = self._skip[port]
        self._put(rec.DATA, rec.DATA_HEAD.pack(stamp[0], stamp[1], stamp[2], port, size, skip, 0), batch,
                  skip + size + 8, stamp[0])

    def send_progress(self, epoch, frontier, watermark, arrival):
        self._put(rec.PROGRESS, rec.PROGRESS_HEAD.pack(epoch, frontier, watermark, arrival), None, 0, None)

    def send_control(self, record: Control) -> None:
        body = pa.py_buffer(rec.control_body(record))
        self._put(rec.CONTROL, rec.CONTROL_HEAD.pack(body.size, 0), body, body.size, None)

    def abort(self, epoch):
        kept = [item for item in self.backlog if item[4] != epoch]
        self.backlog = deque(kept)
        self._backlog_bytes = sum(item[3] for item in kept)
        self._put(rec.ABORT, rec.ABORT_HEAD.pack(epoch), None, 0, None)

    def _put(self, kind: int, head: bytes, body, body_size: int, epoch: int | None) -> None:
        """Queue a record whose ``body`` is a Buffer, a RecordBatch (written in place) or None.

        ``epoch``: the epoch whose data it carries (None for schemas and control records).
        """
        need = rec.padded(rec.REC.size + len(head) + body_size)
        if need > self.ring.max_record:
            self._put_fragments(kind, head, body, epoch)
            return
        if self.backlog or not self._try_put(kind, head, body, need):
            if isinstance(body, pa.RecordBatch) and not self.batches_stay:  # copy it out of a ring now
                head, body = rec.serialized_data(head, body)
                need = rec.padded(rec.REC.size + len(head) + body.size)
            self.backlog.append((kind, head, body, need, epoch))
            self._backlog_bytes += need

    def _put_fragments(self, kind: int, head: bytes, body, epoch: int | None) -> None:
        """A record larger than half the ring, cut into FRAGMENT records the consumer joins again."""
        if isinstance(body, pa.RecordBatch):
            head, body = rec.serialized_data(head, body)
        record = bytearray(rec.REC.pack(0, kind) + head)
        if body is not None:
            record += memoryview(body)
        rec.REC.pack_into(record, 0, len(record), kind)
        piece = self.ring.max_record - rec.REC.size - rec.FRAGMENT_HEAD.size - 8
        for start in range(0, len(record), piece):
            chunk = pa.py_buffer(bytes(record[start:start + piece]))
            last = int(start + piece >= len(record))
            self._put(rec.FRAGMENT, rec.FRAGMENT_HEAD.pack(last, 0), chunk, chunk.size, epoch)

    def _try_put(self, kind: int, head: bytes, body, need: int) -> bool:
        ring = self.ring
        cap, w = ring.capacity, self.w
        free = cap - (w - int(ring.head[_R]))
        if kind not in rec.CONTROL_KINDS:
            free -= ring.reserve
        pos = w & (cap - 1)
        if pos + need > cap:  # not contiguous: pad to the end and start over at 0
            tail = cap - pos
            if free < tail + need:
                return False
            rec.REC.pack_into(ring.view, pos, tail, rec.WRAP)
            w += tail
            pos = 0
        elif free < need:
            return False
        rec.REC.pack_into(ring.view, pos, need, kind)
        at = pos + rec.REC.size
        ring.view[at:at + len(head)] = head
        at += len(head)
        if isinstance(body, pa.RecordBatch):
            self._write_batch(body, head, at, pos + need)
        elif body is not None:
            ring.view[at:at + body.size] = memoryview(body).cast("B")
        self.w = w + need
        ring.head[_W] = self.w
        self.bytes_out += need
        if ring.head[_READER_SLEEPS]:
            if self.holding:
                self._wake_due = True
            else:
                _wake(ring, _READER_SLEEPS, _READER_BELL)
        return True

    def hold_wakes(self) -> None:
        self.holding = True

    def release_wakes(self) -> None:
        self.holding = False
        if self._wake_due:
            self._wake_due = False
            if self.ring.head is not None and self.ring.head[_READER_SLEEPS]:
                _wake(self.ring, _READER_SLEEPS, _READER_BELL)

    def _write_batch(self, batch: pa.RecordBatch, head: bytes, start: int, end: int) -> None:
        """Let Arrow write ``batch`` as a one-batch stream into ``ring[start:end]`` (no copy in between)."""
        sink = pa.FixedSizeBufferWriter(pa.py_buffer(self.ring.view[start:end]))
        writer = pa.ipc.RecordBatchStreamWriter(sink, batch.schema, options=IPC_OPTIONS)
        writer.write_batch(batch)
        writer.close()
        _, _, _, _, size, skip, _ = rec.DATA_HEAD.unpack(head)
        if sink.tell() != skip + size + 8:
            raise EngineError(f"ring {self.ring.path}: a batch took {sink.tell()} bytes in place, "
                              f"{skip + size + 8} expected (dictionary columns are not supported)", "RING")

    def map_pages(self) -> None:
        """Map every page of the ring in this process now, not one fault at a time while writing.

        Call it once the consumer has touched them: first touch places a page
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
        """Say (in the header) that we sleep until the consumer frees space."""
        head = self.ring.head  # None once closed (maybe by another thread)
        if head is not None:
            head[_WRITER_SLEEPS] = 1 if on else 0

    def wait_writable(self, timeout: float) -> None:
        self.sleep_flag(True)
        try:
            if self.flush():
                return
            if self.bell is not None:
                self.bell.wait(timeout)
            else:
                time.sleep(min(timeout, 0.001))
        finally:
            self.sleep_flag(False)

    def check_peer(self) -> None:
        head = self.ring.head
        if head is not None and not _alive(int(head[_READER_PID])):
            raise ChannelClosed(f"ring {self.ring.path}: its consumer (pid {int(head[_READER_PID])}) is gone")

    def close(self) -> None:
        """Say so to the consumer (if the ring has room) and unmap."""
        if self.ring.head is not None:
            self._put(rec.CLOSE, b"", None, 0, None)
            self.ring.close()


class RingConsumer(Consumer):
    """The consumer end of a ring.

    With ``copy=False`` a received batch points into the ring and stays valid
    only until the next :meth:`receive`; with ``copy=True`` it owns its memory.
    ``bell``: the doorbell this process sleeps on (the one named at :func:`create_ring`).
    """

    def __init__(self, path: str, bell: Doorbell | None = None, copy: bool = True, touch: bool = True):
        self.ring = _Ring(path)
        self.bell = bell
        self.ring.head[_READER_PID] = os.getpid()
        if touch:
            self.ring.touch()
        self.copy = copy
        self.r = int(self.ring.head[_R])
        self._next = self.r
        self.schemas: dict[int, pa.Schema] = {}
        self._fragments = rec.Fragments()  # of a record larger than half the ring
        self._peer_check = 0.0
        self.bytes_in = 0
        self.closed = False

    def __repr__(self) -> str:
        return f"ring {self.ring.path}"

    def receive(self):
        ring = self.ring
        if self._next != self.r:
            self._release()
        cap = ring.capacity
        while True:
            r = self.r
            if r == int(ring.head[_W]):
                self._check_writer()
                return None
            pos = r & (cap - 1)
            length, kind = rec.REC.unpack_from(ring.view, pos)
            if length <= 0 or length > cap:
                raise EngineError(f"ring {ring.path}: corrupt record of length {length} at {r}", "RING")
            self._next = r + length
            self.bytes_in += length
            if kind == rec.FRAGMENT:
                msg = self._fragments.add(ring.bytes, pos + rec.REC.size, pos + length, self.schemas)
            elif kind == rec.CLOSE:
                self.closed, msg = True, None
            else:
                if kind == rec.ABORT:
                    self._fragments.drop()
                msg = rec.decode(kind, ring.view, ring.bytes, pos + rec.REC.size, self.schemas, self.copy)
            if msg is None or self.copy or kind != rec.DATA:
                self._release()
            if msg is not None:
                return msg
            if self.closed:
                return None

    def _check_writer(self) -> None:
        """Raise ChannelClosed when the ring is drained and its producer died without closing it."""
        now = time.monotonic()
        if self.closed or now < self._peer_check:
            return
        self._peer_check = now + PEER_CHECK_S
        pid = int(self.ring.head[_WRITER_PID])
        if not _alive(pid) and self.r == int(self.ring.head[_W]):
            raise ChannelClosed(f"ring {self.ring.path}: its producer (pid {pid}) died")

    def _release(self) -> None:
        ring = self.ring
        self.r = self._next
        ring.head[_R] = self.r
        if ring.head[_WRITER_SLEEPS]:
            _wake(ring, _WRITER_SLEEPS, _WRITER_BELL)

    def ready(self) -> bool:
        head = self.ring.head
        return head is not None and not self.closed and self._next != int(head[_W])

    def fileno(self) -> int:
        if self.bell is None:
            raise EngineError(f"ring {self.ring.path}: its consumer has no doorbell to wait on", "RING")
        return self.bell.fileno()

    def sleep_flag(self, on: bool) -> None:
        """Say (in the header) that we sleep until the producer sends something."""
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
