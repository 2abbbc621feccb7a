"""Numba kernels of the benchmark workloads: parsing the IP out of a record
and the per-key running count of wordcount. Plain loops over Arrow buffers.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from numba import njit

EMPTY = -1


def string_buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(int64 offsets, bytes) of a string array without nulls, views on its buffers where possible."""
    if arr.null_count:
        raise ValueError("string column with nulls")
    _, off, data = arr.buffers()
    typ = np.int64 if pa.types.is_large_string(arr.type) else np.int32
    offsets = np.frombuffer(off, typ, count=arr.offset + len(arr) + 1)[arr.offset:]
    return offsets, (np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8))


def string_array(offsets: np.ndarray, data: np.ndarray) -> pa.Array:
    """A string array over kernel output (offsets start at 0)."""
    n = len(offsets) - 1
    if offsets[-1] < 2**31:
        return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)])
    return pa.Array.from_buffers(pa.large_string(), n, [None, pa.py_buffer(offsets.astype(np.int64)),
                                                        pa.py_buffer(data)]).cast(pa.string())


@njit(nogil=True, cache=True)
def first_field(offsets, data, sep):
    """Offsets and bytes of each string's text before its first ``sep`` byte (all of it if none)."""
    n = len(offsets) - 1
    out_off = np.zeros(n + 1, np.int64)
    ends = np.empty(n, np.int64)
    for i in range(n):
        s, e = offsets[i], offsets[i + 1]
        j = s
        while j < e and data[j] != sep:
            j += 1
        ends[i] = j
        out_off[i + 1] = out_off[i] + j - s
    out = np.empty(out_off[n], np.uint8)
    for i in range(n):
        s = offsets[i]
        d = out_off[i]
        for k in range(out_off[i + 1] - d):
            out[d + k] = data[s + k]
    return out_off, out


def parse_ip(values: pa.Array) -> pa.Array:
    """HiBench's ``UserVisitParser``: the source IP, the value's first comma-separated field."""
    off, data = string_buffers(values)
    o, d = first_field(off, data, 44)
    return string_array(o, d)


@njit(nogil=True, cache=True)
def count_rows(rows, hashes, koff, kdata, slots, e_hash, e_off, e_len, e_count, arena, meta, touched, last):
    """Add 1 to the count of each row's key (rows in order); returns how many entries were touched.

    ``touched[:returned]`` are the entries touched, in first-touch order;
    ``last[e]`` the last row of entry e. The caller guaranteed room.
    """
    mask = len(slots) - 1
    nt = 0
    for j in range(len(rows)):
        r = rows[j]
        h = hashes[r]
        ks, ke = koff[r], koff[r + 1]
        kl = ke - ks
        i = np.int64(h & np.uint64(mask))
        while True:
            e = slots[i]
            if e == EMPTY:
                e = meta[0]
                meta[0] = e + 1
                o = meta[1]
                for k in range(kl):
                    arena[o + k] = kdata[ks + k]
                meta[1] = o + kl
                slots[i] = e
                e_hash[e], e_off[e], e_len[e], e_count[e] = h, o, kl, 0
                break
            if e_hash[e] == h and e_len[e] == kl:
                o = e_off[e]
                same = True
                for k in range(kl):
                    if arena[o + k] != kdata[ks + k]:
                        same = False
                        break
                if same:
                    break
            i = (i + 1) & mask
        if e_count[e] >= 0:
            touched[nt] = e
            nt += 1
            e_count[e] = -e_count[e] - 1  # negative while touched in this call
        last[e] = r
        e_count[e] -= 1
    for t in range(nt):
        e = touched[t]
        e_count[e] = -e_count[e] - 1
    return nt


@njit(nogil=True, cache=True)
def rehash(slots, e_hash, n):
    mask = len(slots) - 1
    for e in range(n):
        i = np.int64(e_hash[e] & np.uint64(mask))
        while slots[i] != EMPTY:
            i = (i + 1) & mask
        slots[i] = e


class CountTable:
    """Exact running counts per key (key bytes kept in an arena): the state of one bin."""

    def __init__(self, capacity: int = 64, arena_bytes: int = 1024):
        self.meta = np.zeros(2, np.int64)  # entries, arena bytes used
        self._alloc(capacity, arena_bytes)

    def _alloc(self, capacity: int, arena_bytes: int) -> None:
        self.slots = np.full(capacity * 2, EMPTY, np.int64)
        self.e_hash = np.zeros(capacity, np.uint64)
        self.e_off = np.zeros(capacity, np.int64)
        self.e_len = np.zeros(capacity, np.int64)
        self.e_count = np.zeros(capacity, np.int64)
        self.last = np.zeros(capacity, np.int64)
        self.arena = np.zeros(arena_bytes, np.uint8)

    def reserve(self, entries: int, key_bytes: int) -> None:
        n, used = int(self.meta[0]), int(self.meta[1])
        if n + entries <= len(self.e_hash) and used + key_bytes <= len(self.arena):
            return
        cap, ab = len(self.e_hash), len(self.arena)
        while cap < n + entries:
            cap *= 2
        while ab < used + key_bytes:
            ab *= 2
        old = (self.e_hash, self.e_off, self.e_len, self.e_count, self.arena)
        self._alloc(cap, ab)
        for new, o in zip((self.e_hash, self.e_off, self.e_len, self.e_count, self.arena), old):
            new[:len(o)] = o
        rehash(self.slots, self.e_hash, n)

    def add(self, rows: np.ndarray, hashes: np.ndarray, koff: np.ndarray, kdata: np.ndarray):
        """Count ``rows``; returns (entries touched, their last row, their count now)."""
        self.reserve(len(rows), int((koff[rows + 1] - koff[rows]).sum()))
        touched = np.empty(len(rows), np.int64)
        nt = count_rows(rows, hashes, koff, kdata, self.slots, self.e_hash, self.e_off, self.e_len,
                        self.e_count, self.arena, self.meta, touched, self.last)
        t = touched[:nt]
        return t, self.last[t], self.e_count[t].copy()
