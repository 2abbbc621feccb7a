"""Where each row of a batch goes, and the rows a filter keeps.

:func:`destinations` gives each row's instance from its key; the route-key
balancer then takes the rows in that order with one Arrow take and slices
the result per destination. On HiBench rows after the parse, two
destinations, that matches gathering every column with :func:`partition`'s
kernels from 16K rows up (32K rows: 250 against 237 us, 308 against 356
with the parts serialized) and costs half as much on small batches, where
the kernels' per-column Python calls dominate (2.5K rows: 35 against 64 us;
50 rows: 19 against 50).

:func:`select` picks the rows a filter keeps with those kernels: half the
rows of a 64K-row batch (a string and five 8-byte columns) at 146 M rows/s,
Arrow's filter at 110 M.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numba import njit

from sparkcep.core.hashing import hash_key
from sparkcep.core.memory import load8, store8

WORD = 8  # string bytes are copied a word at a time
SHORT = 16  # a string this long or shorter is copied as two words, with no loop; outputs carry this much slack


@njit(nogil=True, cache=True)
def destinations(offsets, data, owners, parts):
    """Rows grouped by the owner of their key's bin (``owners[hash & (len(owners) - 1)]``, a power of
    two of bins), in row order within a part: (row order, start of each of ``parts`` parts + end)."""
    n = len(offsets) - 1
    mask = np.uint64(len(owners) - 1)
    dest = np.empty(n, np.int64)
    starts = np.zeros(parts + 1, np.int64)
    for i in range(n):
        h = hash_key(data, np.int64(offsets[i]), np.int64(offsets[i + 1]))[0]
        d = owners[np.int64(h & mask)]
        dest[i] = d
        starts[d + 1] += 1
    for p in range(parts):
        starts[p + 1] += starts[p]
    fill = starts[:-1].copy()
    order = np.empty(n, np.int64)
    for i in range(n):
        d = dest[i]
        order[fill[d]] = i
        fill[d] += 1
    return order, starts


@njit(nogil=True, cache=True)
def gather(columns, count, order):
    """The first ``count`` of ``columns`` (a tuple of :data:`GATHER` arrays of one width) in
    destination order: row ``c`` of the result is ``columns[c][order]``. One call for up to
    GATHER columns: five 8-byte columns of 32K rows took 2.5 ns a row, against 10 in a call each.
    The tuple always has GATHER arrays (unused ones empty): numba compiles a kernel per tuple
    length, and a batch of another shape would have waited for it in the middle of a run."""
    out = np.empty((count, len(order)), columns[0].dtype)
    for c in range(count):
        values = columns[c]
        for j in range(len(order)):
            out[c, j] = values[order[j]]
    return out


@njit(nogil=True, cache=True)
def gather_strings(offsets, data, order, starts):
    """Strings ``order`` as one offsets array per part, each starting at 0 (part ``p``'s offsets are
    ``out_offsets[starts[p] + p : starts[p + 1] + p + 1]``), and their bytes: (out_offsets, bytes,
    byte start of each part + end). ``bytes`` has :data:`SHORT` bytes of slack past the end.

    Strings of up to :data:`SHORT` bytes (IPs, most keys) are two word copies without a loop: half
    the rows of a 64K-row batch of HiBench IPs took 109 us where a word loop took 142."""
    parts = len(starts) - 1
    out_off = np.empty(len(order) + parts, offsets.dtype)
    at = np.zeros(parts + 1, np.int64)
    total = 0
    for p in range(parts):
        q = starts[p] + p
        out_off[q] = 0
        for j in range(starts[p], starts[p + 1]):
            r = order[j]
            q += 1
            out_off[q] = out_off[q - 1] + (offsets[r + 1] - offsets[r])
        total += out_off[q]
        at[p + 1] = total
    out = np.empty(total + SHORT, np.uint8)
    last = len(data) - WORD  # a word may be loaded at or before this offset
    d = 0
    for j in range(len(order)):
        r = order[j]
        s, e = np.int64(offsets[r]), np.int64(offsets[r + 1])
        if e - s <= SHORT and s + SHORT <= len(data):
            store8(out, d, load8(data, s))
            store8(out, d + WORD, load8(data, s + WORD))
        else:
            k = 0
            while s + k < e:
                if s + k <= last:
                    store8(out, d + k, load8(data, s + k))
                    k += WORD
                else:
                    out[d + k] = data[s + k]
                    k += 1
        d += e - s
    return out_off, out, at


_FIXED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}  # gathered by width, whatever the type
GATHER = 8  # fixed-width columns gathered by one kernel call


def _read_only(a: np.ndarray) -> np.ndarray:
    """``a`` marked read-only, whoever owns its buffer: numba types read-only arrays apart, so a
    batch read from a channel and one made here would compile the kernels twice (and a tuple of both
    kinds does not compile at all)."""
    a.flags.writeable = False
    return a


_NONE = {width: _read_only(np.zeros(0, dtype)) for width, dtype in _FIXED.items()}  # a tuple's unused places


def partition(batch: pa.RecordBatch, order: np.ndarray, starts: np.ndarray) -> list[pa.RecordBatch | None]:
    """Part ``p`` of ``batch``: its rows ``order[starts[p]:starts[p + 1]]`` (None when that is no row),
    in buffers of their own.

    Fixed-width and string columns without nulls go through the kernels; any
    other column (nulls, bools, large strings) is taken by Arrow.
    """
    parts = len(starts) - 1
    sizes = [int(starts[p + 1] - starts[p]) for p in range(parts)]
    cols: list[list] = [[None] * batch.num_columns for _ in range(parts)]
    fixed: dict[int, list[tuple[int, pa.DataType, np.ndarray]]] = {}  # width -> (column, type, values)
    first: dict[tuple[int, int], int] = {}  # (address, width) of a fixed-width column's values -> its column
    same: list[tuple[int, pa.DataType, int]] = []  # (column, type, the column with the same values)
    for i, arr in enumerate(batch.columns):
        t = arr.type
        width = t.bit_width // 8 if pa.types.is_primitive(t) and not pa.types.is_boolean(t) else 0
        if arr.null_count == 0 and width in _FIXED:
            data = arr.buffers()[1]
            where = (data.address + arr.offset * width, width)
            if where in first:  # a view of a column before it (the event time and __ts): gathered once
                same.append((i, t, first[where]))
                continue
            first[where] = i
            values = _read_only(np.frombuffer(data, _FIXED[width], len(arr), arr.offset * width))
            fixed.setdefault(width, []).append((i, t, values))
        elif arr.null_count == 0 and (pa.types.is_string(t) or pa.types.is_binary(t)):
            _, off_buf, data_buf = arr.buffers()
            offsets = _read_only(np.frombuffer(off_buf, np.int32, len(arr) + 1, arr.offset * 4))
            data = _read_only(np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8))
            out_off, out, at = gather_strings(offsets, data, order, starts)
            for p in range(parts):
                lo, hi = starts[p] + p, starts[p + 1] + p + 1
                cols[p][i] = pa.Array.from_buffers(t, sizes[p], [None, pa.py_buffer(out_off[lo:hi]),
                                                                 pa.py_buffer(out[at[p]:at[p + 1]])])
        else:
            taken = pc.take(arr, pa.array(order, pa.int64()), boundscheck=False)
            for p in range(parts):
                cols[p][i] = taken.slice(starts[p], sizes[p])
    for width, group in fixed.items():
        for k in range(0, len(group), GATHER):
            chunk = group[k:k + GATHER]
            arrays = tuple(values for _, _, values in chunk) + (_NONE[width],) * (GATHER - len(chunk))
            out = gather(arrays, len(chunk), order)
            for c, (i, t, _) in enumerate(chunk):
                for p in range(parts):
                    cols[p][i] = pa.Array.from_buffers(t, sizes[p], [None, pa.py_buffer(out[c, starts[p]:starts[p + 1]])])
    for i, t, j in same:
        for p in range(parts):
            cols[p][i] = cols[p][j].view(t)
    return [pa.RecordBatch.from_arrays(cols[p], schema=batch.schema) if sizes[p] else None for p in range(parts)]


@njit(nogil=True, cache=True)
def kept_rows(keep):
    """The positions where ``keep`` (bool) is true, in order. Branch-free: numpy's ``flatnonzero``
    took 56-61 us on 64K rows where half or more are kept, this 30 whatever is kept."""
    rows = np.empty(len(keep), np.int64)
    n = 0
    for i in range(len(keep)):
        rows[n] = i
        n += keep[i]
    return rows[:n]


def select(batch: pa.RecordBatch, keep: np.ndarray) -> pa.RecordBatch:
    """The rows of ``batch`` where ``keep`` (bool, one per row) is true, in buffers of their own."""
    rows = kept_rows(keep)
    return partition(batch, rows, np.array([0, len(rows)], np.int64))[0] or batch.slice(0, 0)
