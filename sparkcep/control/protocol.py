"""The framing of the loopback endpoint: a JSON header plus an optional Arrow IPC payload.

One frame, in both directions::

    b"UC" | version u8 | 0 u8 | header length u32 | payload length u64 | header | payload

all integers big-endian. The header is a UTF-8 JSON object: requests carry
``"op"``, responses ``"ok"`` (and, when false, ``"error": {"type", "code",
"message"}``). The payload is empty or an Arrow IPC *stream* (schema then
batches). A connection carries any number of request/response pairs, one at
a time.
"""

from __future__ import annotations

import json
import socket
import struct

import pyarrow as pa

from sparkcep.errors import EngineError

MAGIC = b"UC"
VERSION = 1
_PREFIX = struct.Struct(">2sBBIQ")
MAX_HEADER = 16 << 20


class ProtocolError(EngineError):
    """A peer sent something that is not a frame of this protocol."""

    code = "PROTOCOL"


def send_frame(sock: socket.socket, header: dict, payload=b"") -> None:
    """Write one frame; ``payload`` is bytes or a pyarrow Buffer."""
    head = json.dumps(header, separators=(",", ":")).encode()
    size = payload.size if isinstance(payload, pa.Buffer) else len(payload)
    sock.sendall(_PREFIX.pack(MAGIC, VERSION, 0, len(head), size) + head)
    if size:
        sock.sendall(memoryview(payload))


def recv_frame(sock: socket.socket) -> tuple[dict, pa.Buffer | None] | None:
    """Read one frame: ``(header, payload or None)``; None when the peer closed cleanly before a frame."""
    prefix = _recv_exact(sock, _PREFIX.size, eof_ok=True)
    if prefix is None:
        return None
    magic, version, _, head_len, size = _PREFIX.unpack(prefix)
    if magic != MAGIC or version != VERSION:
        raise ProtocolError(f"not a sparkcep endpoint frame (magic {magic!r}, version {version}); "
                            f"expected {MAGIC!r} version {VERSION}")
    if head_len > MAX_HEADER:
        raise ProtocolError(f"frame header of {head_len} bytes exceeds {MAX_HEADER}")
    header = json.loads(bytes(_recv_exact(sock, head_len)))
    payload = pa.py_buffer(_recv_exact(sock, size)) if size else None
    return header, payload


def _recv_exact(sock: socket.socket, n: int, eof_ok: bool = False):
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            if eof_ok and got == 0:
                return None
            raise ProtocolError(f"connection closed after {got} of {n} bytes of a frame")
        got += k
    return buf


def to_ipc(batches: list[pa.RecordBatch], schema: pa.Schema) -> pa.Buffer:
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
