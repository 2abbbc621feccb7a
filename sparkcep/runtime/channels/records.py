"""The byte layout of channel records, shared by every channel that is not in-process.

A record is ``length u32 | kind u32 | head | body`` (little-endian, the
length counting everything and padded to 8 bytes). Heads by kind:

========  =============================================================  =====================
DATA      epoch, frontier, arrival ns, port, body length, skip, 0       an Arrow IPC batch
          (``skip``: bytes of a schema message before the batch)
PROGRESS  epoch, frontier, watermark, arrival ns                        —
SCHEMA    port, body length                                             an Arrow IPC schema
ABORT     epoch                                                         —
CONTROL   body length                                                   JSON of a control record
FRAGMENT  1 on the last fragment, 0                                     a piece of a record
WRAP      —  (a ring's padding to its end)                              —
CLOSE     —  (the producer closed cleanly)                              —
========  =============================================================  =====================

Control records are JSON, never pickle: nothing a peer sends is executed.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pyarrow as pa

from sparkcep.errors import EngineError
from sparkcep.runtime.channels.base import CONTROL_TYPES, Abort, Control, Data, Progress

DATA, PROGRESS, SCHEMA, WRAP, ABORT, FRAGMENT, CONTROL, CLOSE = 1, 2, 3, 4, 5, 6, 7, 8
REC = struct.Struct("<ii")            # record length (bytes, incl. this, padded to 8), kind
DATA_HEAD = struct.Struct("<qqqiiii")  # epoch, frontier, arrival ns, port, body length, skip, 0
PROGRESS_HEAD = struct.Struct("<qqqq")  # epoch, frontier, watermark, arrival ns
SCHEMA_HEAD = struct.Struct("<ii")     # port, body length
ABORT_HEAD = struct.Struct("<q")       # epoch
CONTROL_HEAD = struct.Struct("<ii")    # body length, 0
FRAGMENT_HEAD = struct.Struct("<ii")   # 1 on the last fragment of a record, 0
CONTROL_KINDS = (PROGRESS, ABORT, CONTROL, CLOSE)  # records that always find room


def padded(size: int) -> int:
    return (size + 7) & ~7


def control_body(record: Control) -> bytes:
    """A control record as JSON: its type name and fields."""
    kind = next((name for name, cls in CONTROL_TYPES.items() if type(record) is cls), None)
    if kind is None:
        raise EngineError(f"{type(record).__name__} is not a known control record", "CHANNEL")
    # vars(), not dataclasses.asdict: its deep copy of a 4096-bin table cost 11 ms a record
    return json.dumps({"type": kind, **vars(record)}, separators=(",", ":")).encode()


def read_control(body: bytes) -> Control:
    fields = json.loads(body)
    cls = CONTROL_TYPES.get(fields.pop("type", None))
    if cls is None:
        raise EngineError(f"unknown control record {body[:80]!r}", "CHANNEL")
    return cls(**fields)


def serialized_data(head: bytes, batch: pa.RecordBatch) -> tuple[bytes, pa.Buffer]:
    """A DATA record's head and body with the batch as one IPC message (no schema before it)."""
    epoch, frontier, arrival, port, _, _, _ = DATA_HEAD.unpack(head)
    body = batch.serialize()
    return DATA_HEAD.pack(epoch, frontier, arrival, port, body.size, 0, 0), body


def decode(kind: int, view: memoryview, data: np.ndarray, at: int, schemas: dict[int, pa.Schema], copy: bool):
    """The message of the record whose head starts at ``view[at]`` (None for schemas and padding).

    ``data`` is ``view`` as uint8; a batch points into it unless ``copy``.
    A SCHEMA record updates ``schemas`` (port -> schema).
    """
    if kind == PROGRESS:
        return Progress(*PROGRESS_HEAD.unpack_from(view, at))
    if kind == DATA:
        epoch, frontier, arrival, port, size, skip, _ = DATA_HEAD.unpack_from(view, at)
        at += DATA_HEAD.size + skip
        body = data[at:at + size]
        if copy:
            body = body.copy()
        return Data(port, epoch, frontier, arrival, pa.ipc.read_record_batch(pa.py_buffer(body), schemas[port]))
    if kind == ABORT:
        return Abort(*ABORT_HEAD.unpack_from(view, at))
    if kind == SCHEMA:
        port, size = SCHEMA_HEAD.unpack_from(view, at)
        at += SCHEMA_HEAD.size
        schemas[port] = pa.ipc.read_schema(pa.py_buffer(data[at:at + size].copy()))
        return None
    if kind == CONTROL:
        size, _ = CONTROL_HEAD.unpack_from(view, at)
        at += CONTROL_HEAD.size
        return read_control(data[at:at + size].tobytes())
    if kind == WRAP:
        return None
    raise EngineError(f"unknown channel record kind {kind}", "CHANNEL")


class Fragments:
    """The fragments of a record too large to travel whole, joined once its last one is in."""

    def __init__(self):
        self.parts: list[bytes] = []

    def add(self, data: np.ndarray, at: int, end: int, schemas: dict[int, pa.Schema]):
        """Add the fragment ``data[at:end]`` (its FRAGMENT_HEAD first, copied out); the message of the
        record once this was its last fragment, else None."""
        last, _ = FRAGMENT_HEAD.unpack_from(data, at)
        self.parts.append(data[at + FRAGMENT_HEAD.size:end].tobytes())
        if not last:
            return None
        record = b"".join(self.parts)
        self.parts = []
        length, kind = REC.unpack_from(record, 0)
        return decode(kind, memoryview(record), np.frombuffer(record, np.uint8, count=length), REC.size, schemas,
                      False)

    def drop(self) -> None:
        """Forget the fragments so far (their record was cut short by an abort)."""
        self.parts = []
