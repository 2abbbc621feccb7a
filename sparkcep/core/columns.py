"""Zero-copy views between Arrow arrays and the numpy arrays kernels take."""

from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkcep.core import hashing
from sparkcep.schema import TYPES

# hidden columns every internal batch carries: sequence number, output id (uint64 bits, see
# sparkcep.core.ids; a row's output id is (SEQ, ID)), event time, source watermark
SEQ, ID, TS, WM = "__seq", "__id", "__ts", "__wm"
HIDDEN = (SEQ, ID, TS, WM)

KIND_FIXED, KIND_STRING = 0, 1


def stamp(batch: pa.RecordBatch, first_seq: int, times: pa.Array | None, watermark: int) -> pa.RecordBatch:
    """``batch`` as the engine sends it in: the hidden columns appended — sequence numbers from
    ``first_seq`` on, output ids (seq, 0), event times ``times`` (its time field :func:`as_int64`;
    None without one: zeros), and the source's ``watermark`` from before the batch on every row.

    One ``from_arrays`` with a schema made once per input schema, the event times a view of the
    time field's buffer, the ids a slice of one array of zeros, the sequence numbers and the
    watermark two views of one buffer filled in place (four ``append_column`` calls and a cast took
    25 us a 100-row send, this 13; a ``pa.array`` each for the sequence numbers and the watermark
    14-16 us, at 10K rows 21-23 us against 18-20).
    """
    n = batch.num_rows
    block = np.empty(2 * n, np.int64)
    np.add(_iota(n), first_seq, out=block[:n])
    block[n:] = watermark
    buf = pa.py_buffer(block)
    seq, wm = (pa.Array.from_buffers(_INT64, n, [None, buf], offset=at) for at in (0, n))
    zeros = _zeros(n)
    return pa.RecordBatch.from_arrays([*batch.columns, seq, zeros, zeros if times is None else times, wm],
                                      schema=_stamped(batch.schema))


def as_int64(times: pa.Array) -> pa.Array:
    """Event times (timestamp or int64) as int64, sharing their buffers where they can (a cast runs a
    compute kernel: 7 us where this takes 1.5)."""
    if pa.types.is_timestamp(times.type) or times.type == pa.int64():
        return times.view(pa.int64())
    return times.cast(pa.int64())


def event_times(batches: list[pa.RecordBatch], time_field: str | None) -> list[pa.Array] | None:
    """Each batch's event times as int64 (:func:`as_int64`), or None for a stream without a time field."""
    return None if time_field is None else [as_int64(b.column(time_field)) for b in batches]


def peaks(times: list[pa.Array]) -> list[int]:
    """The largest event time of each of ``times`` (:func:`event_times`; none empty)."""
    return [int(t.to_numpy().max()) for t in times]


@functools.lru_cache(maxsize=64)
def _stamped(schema: pa.Schema) -> pa.Schema:
    """``schema`` with the hidden columns after its fields."""
    return pa.schema([*schema, *(pa.field(name, pa.int64()) for name in HIDDEN)])


_ZEROS = [pa.array(np.zeros(1 << 16, np.int64))]  # grown on demand; slices of it are the source's ids
_IOTA = [np.arange(1 << 16, dtype=np.int64)]  # grown on demand: 0, 1, 2, ...
_INT64 = pa.int64()


def _iota(n: int) -> np.ndarray:
    """0 .. n-1 as int64, a view of one array."""
    if len(_IOTA[0]) < n:
        _IOTA[0] = np.arange(n, dtype=np.int64)
    return _IOTA[0][:n]


def _zeros(n: int) -> pa.Array:
    """``n`` int64 zeros, sharing one buffer."""
    if len(_ZEROS[0]) < n:
        _ZEROS[0] = pa.array(np.zeros(n, np.int64))
    return _ZEROS[0].slice(0, n)


def take(data, rows: np.ndarray):
    """Rows ``rows`` of a batch or array. The engine computes its row numbers itself, so they are
    in bounds: Arrow's bounds check is skipped (a sixth of a take's time)."""
    return pc.take(data, pa.array(rows, pa.int64()), boundscheck=False)


def owned(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A copy of ``batch`` in memory of its own (it may point into a ring that is about to be reused)."""
    return pa.ipc.read_record_batch(batch.serialize(), batch.schema)


def values(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(values, valid) of a numeric / bool / timestamp array; nulls hold 0 in values."""
    if pa.types.is_timestamp(arr.type):
        arr = arr.view(pa.int64())  # the same buffers: a cast ran a compute kernel
    if arr.null_count:
        valid = arr.is_valid().to_numpy(zero_copy_only=False)
        arr = pc.fill_null(arr, False if pa.types.is_boolean(arr.type) else 0)
    else:
        valid = np.ones(len(arr), np.bool_)
    return arr.to_numpy(zero_copy_only=False), valid


def strings(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets, bytes, valid) of a string array, read-only views on its Arrow buffers.

    Read-only whoever owns the buffers: numba compiles a kernel once per
    array type and types read-only arrays apart, and buffers read from a
    channel are mutable where those pyarrow builds are not. Mixed, a kernel
    met a new type mid-run and compiled for seconds (the wordcount stall).
    """
    if pa.types.is_large_string(arr.type):
        off_type = np.int64
    else:
        off_type = np.int32
    n = len(arr)
    _, off_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(off_buf, off_type, count=arr.offset + n + 1)[arr.offset:] if off_buf else np.zeros(n + 1, off_type)
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    valid = arr.is_valid().to_numpy(zero_copy_only=False) if arr.null_count else np.ones(n, np.bool_)
    offsets.flags.writeable = data.flags.writeable = False
    return offsets, data, valid


def string_array(offsets: np.ndarray, data: np.ndarray, valid: np.ndarray | None) -> pa.Array:
    """An Arrow string array over kernel output (offsets rebased to 0)."""
    offsets = np.asarray(offsets, np.int64)
    n = len(offsets) - 1
    if offsets[-1] < 2**31:
        off = pa.py_buffer((offsets - offsets[0]).astype(np.int32))
        typ = pa.string()
    else:
        off, typ = pa.py_buffer(offsets - offsets[0]), pa.large_string()
    mask = None
    if valid is not None and not valid.all():
        mask = pa.array(valid).buffers()[1]
    arr = pa.Array.from_buffers(typ, n, [mask, off, pa.py_buffer(data[offsets[0]:offsets[-1]])])
    return arr.cast(pa.string()) if typ != pa.string() else arr


def as_bits(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(uint64 bit patterns, valid) of a fixed-width array, as the key encoding stores them."""
    v, valid = values(arr)
    if v.dtype == np.float64 or v.dtype == np.float32:
        v = v.astype(np.float64)  # a copy, made one bit pattern per value so that equal keys group together:
        np.copyto(v, np.nan, where=np.isnan(v))  # every NaN as np.nan (numpy's 0/0 has the sign bit set)
        v += 0.0  # -0.0 as 0.0
        return v.view(np.uint64), valid
    return v.astype(np.int64).view(np.uint64), valid


def from_bits(bits: np.ndarray, valid: np.ndarray, type_name: str) -> pa.Array:
    """Inverse of :func:`as_bits` for a field of ``type_name``."""
    if type_name.startswith("float"):
        v = bits.view(np.float64)
    elif type_name == "bool":
        v = bits.astype(np.bool_)
    else:
        v = bits.view(np.int64)
    return pa.array(v, mask=None if valid.all() else ~valid).cast(TYPES[type_name])  # a mask costs 5x the rest


def encode_keys(batch: pa.RecordBatch, fields: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per-row encoded key bytes of ``fields``: (offsets, bytes), see :mod:`sparkcep.core.hashing`."""
    cols = [batch.column(f) for f in fields]
    if is_raw_key([c.type for c in cols]):
        offsets, data, valid = strings(cols[0])
        if cols[0].null_count:
            return hashing.write_raw_nullable(offsets, data, valid)
        return offsets, data
    n = batch.num_rows
    lengths = np.zeros(n, np.int64)
    views = []
    for c in cols:
        if pa.types.is_string(c.type):
            views.append(strings(c))
            hashing.string_lengths(lengths, views[-1][0])
        else:
            views.append(as_bits(c))
            hashing.fixed_lengths(lengths)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    out = np.empty(offsets[-1], np.uint8)
    cursor = offsets[:-1].copy()
    for v in views:
        if len(v) == 3:
            hashing.write_string(out, cursor, v[0], v[1], v[2])
        else:
            hashing.write_fixed(out, cursor, v[0], v[1])
    return offsets, out


def is_raw_key(types: list) -> bool:
    """A single string field is encoded raw (its bytes as they are)."""
    return len(types) == 1 and (types[0] == "string" or types[0] == pa.string())


def decode_keys(offsets: np.ndarray, data: np.ndarray, fields: dict[str, str]) -> list[pa.Array]:
    """Arrow columns of the key ``fields`` of encoded keys ``data[offsets[i]:offsets[i+1]]``."""
    types = list(fields.values())
    if is_raw_key(types):
        one = np.diff(offsets) == 1  # a null is the one byte NULL_BYTE
        valid = np.ones(len(one), np.bool_)
        valid[one] = data[offsets[:-1][one]] != hashing.NULL_BYTE
        return [string_array(offsets, data, valid)]
    kinds = np.array([KIND_STRING if t == "string" else KIND_FIXED for t in types], np.int64)
    out = []
    for j, t in enumerate(types):
        if t == "string":
            off, sdata, valid = hashing.read_string(data, offsets[:-1], kinds, j)
            out.append(string_array(off, sdata, valid))
        else:
            bits, valid = hashing.read_fixed(data, offsets[:-1], kinds, j)
            out.append(from_bits(bits, valid, t))
    return out
