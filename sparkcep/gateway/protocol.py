"""The framing of the loopback endpoint: a JSON header plus an optional Arrow IPC payload.

One frame, in both directions::

    b"UC" | version u8 | 0 u8 | header length u32 | payload length u64 | header | payload

all integers big-endian. The header is a UTF-8 JSON object: requests carry
``"op"`` and the engine's ``"token"``, responses ``"ok"`` (and, when false,
``"error": {"type", "code", "message"}``). The payload is empty or an Arrow
IPC *stream* (schema then batches). A connection carries any number of
request/response pairs, one at a time.

Sizes are bounded both ways: a header of at most :data:`MAX_HEADER` bytes,
a payload of at most :data:`MAX_PAYLOAD`. A reader checks the lengths in the
prefix before it allocates anything; a writer refuses to send more. Clients
split what they send and read into pieces of at most :func:`chunk_bytes`
(see :func:`chunks`), so no legitimate request reaches the limits.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Iterable, Iterator

import pyarrow as pa

from sparkcep.errors import EngineError

MAGIC = b"UC"
VERSION = 2
_PREFIX = struct.Struct(">2sBBIQ")
MAX_HEADER = 1 << 20
MAX_PAYLOAD = 256 << 20


class ProtocolError(EngineError):
    """A peer sent something that is not a frame of this protocol, or a frame over the limits."""

    code = "PROTOCOL"


def chunk_bytes() -> int:
    """Arrow bytes a client puts in one request or asks for in one reply: 8 MiB, at most a quarter of the limit.

    Measured: serialising 64 MiB IPC payloads cost 10x the time of 8 MiB ones
    (buffer growth), and a task streams its rows as they come either way.
    """
    return min(MAX_PAYLOAD // 4, 8 << 20)


def send_frame(sock: socket.socket, header: dict, payload=b"") -> None:
    """Write one frame; ``payload`` is bytes or a pyarrow Buffer. ProtocolError ``FRAME_TOO_LARGE`` over the limits."""
    head = json.dumps(header, separators=(",", ":")).encode()
    size = payload.size if isinstance(payload, pa.Buffer) else len(payload)
    _check_sizes(len(head), size, f"a {header.get('op', 'reply')!r} frame")
    sock.sendall(_PREFIX.pack(MAGIC, VERSION, 0, len(head), size) + head)
    if size:
        sock.sendall(memoryview(payload))


def read_head(sock: socket.socket) -> tuple[dict, int] | None:
    """The header of the next frame and its payload length; None when the peer closed before a frame.

    The payload is left unread: the caller reads it with :func:`read_payload`
    (or closes the connection, e.g. when the header is not authenticated).
    """
    prefix = _recv_exact(sock, _PREFIX.size, eof_ok=True)
    if prefix is None:
        return None
    magic, version, _, head_len, size = _PREFIX.unpack(prefix)
    if magic != MAGIC or version != VERSION:
        raise ProtocolError(f"not a sparkcep endpoint frame (magic {bytes(magic)!r}, version {version}); "
                            f"expected {MAGIC!r} version {VERSION}")
    _check_sizes(head_len, size, "a frame")
    try:
        header = json.loads(bytes(_recv_exact(sock, head_len)))
    except ValueError as e:
        raise ProtocolError(f"frame header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"frame header is a JSON {type(header).__name__}, expected an object")
    return header, size


def read_payload(sock: socket.socket, size: int, alloc=bytearray) -> pa.Buffer | None:
    """The ``size`` payload bytes that follow a header, read into ``alloc(size)`` (None when there are none)."""
    return pa.py_buffer(_recv_into(sock, alloc(size))) if size else None


def recv_frame(sock: socket.socket) -> tuple[dict, pa.Buffer | None] | None:
    """Read one frame: ``(header, payload or None)``; None when the peer closed cleanly before a frame."""
    head = read_head(sock)
    if head is None:
        return None
    header, size = head
    return header, read_payload(sock, size)


def _check_sizes(head_len: int, size: int, what: str) -> None:
    if head_len > MAX_HEADER:
        raise ProtocolError(f"{what} has a header of {head_len:,} bytes; the limit is {MAX_HEADER:,}",
                            "FRAME_TOO_LARGE")
    if size > MAX_PAYLOAD:
        raise ProtocolError(f"{what} has a payload of {size:,} bytes; the limit is {MAX_PAYLOAD:,} (clients "
                            "split larger sends and reads into several requests)", "FRAME_TOO_LARGE")


def _recv_exact(sock: socket.socket, n: int, eof_ok: bool = False):
    return _recv_into(sock, bytearray(n), eof_ok)


def _recv_into(sock: socket.socket, buf, eof_ok: bool = False):
    """``buf`` (a writable buffer) filled from ``sock``; None if the peer closed before its first byte,
    ConnectionError if it closed after (it went away mid-frame: a dead engine, not a bad frame)."""
    view = memoryview(buf).cast("B")
    n, got = len(view), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            if eof_ok and got == 0:
                return None
            raise ConnectionError(f"connection closed after {got} of {n} bytes of a frame")  # the peer went away
        got += k
    return buf


def to_ipc(batches: Iterable[pa.RecordBatch], schema: pa.Schema) -> pa.Buffer:
    """An Arrow IPC stream of ``batches``."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for b in batches:
            writer.write_batch(b)
    return sink.getvalue()


def from_ipc(payload: pa.Buffer | None) -> pa.Table | None:
    """The table in an Arrow IPC stream payload (zero-copy over the buffer)."""
    if payload is None:
        return None
    return pa.ipc.open_stream(payload).read_all()


def chunks(batches: Iterable[pa.RecordBatch], budget: int) -> Iterator[list[pa.RecordBatch]]:
    """``batches`` regrouped into lists of about ``budget`` bytes each, in order; a larger batch is sliced.

    Empty batches are skipped; every list holds at least one row.
    """
    group, size = [], 0
    for b in batches:
        start = 0
        while start < b.num_rows:
            piece = b.slice(start)
            room = budget - size
            if piece.nbytes > room:
                per_row = max(piece.nbytes // piece.num_rows, 1)
                rows = room // per_row
                if rows == 0 and group:
                    yield group
                    group, size = [], 0
                    continue
                piece = piece.slice(0, max(rows, 1))
            group.append(piece)
            size += piece.nbytes
            start += piece.num_rows
            if size >= budget:
                yield group
                group, size = [], 0
    if group:
        yield group
