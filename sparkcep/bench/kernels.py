"""Numba kernels of the benchmark workloads: parsing the IP out of a record,
and wordcount's running count per key over the core's binned hash table.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from numba import njit

from sparkcep.core import columns
from sparkcep.core.memory import load8, store8, trailing_zeros
from sparkcep.core.table import ACC, BinnedTable, find_slot, key_bytes, lookup, place, room, slot_hash, touch

GROUP = 256  # rows whose first probes are prefetched before any of them is counted (see core.table.touch)
COUNT, LAST = ACC, ACC + 1  # int slots of a running-count entry (a third pads it to 64 bytes)


ONES = np.uint64(0x0101010101010101)
HIGHS = ONES * np.uint64(0x80)


@njit(nogil=True, cache=True)
def first_field(offsets, data, sep):
    """Offsets and bytes of each string's text before its first ``sep`` byte (all of it if none).

    Eight bytes at a time: a word is searched for ``sep`` with the classic
    has-zero-byte test on ``word ^ sep * ONES`` (its lowest flag is exact),
    and the field is copied in words (the output has 8 bytes of slack).
    """
    n = len(offsets) - 1
    out_off = np.empty(n + 1, np.int64)
    out_off[0] = 0
    out = np.empty(offsets[n] - offsets[0] + 8, np.uint8)
    pattern = ONES * np.uint64(sep)
    end_words = len(data) - 8  # a word may be loaded at or before this offset
    d = 0
    for i in range(n):
        j, e = offsets[i], offsets[i + 1]
        k = j
        while k < e:
            if k > end_words:  # the last bytes of the buffer, one at a time
                while k < e and data[k] != sep:
                    k += 1
                break
            x = load8(data, k) ^ pattern
            hit = (x - ONES) & ~x & HIGHS
            if hit:
                k += np.int64(trailing_zeros(hit) >> np.uint64(3))
                break
            k += 8
        k = min(k, e)
        for q in range(0, k - j, 8):
            if j + q <= end_words:
                store8(out, d + q, load8(data, j + q))
            else:  # the rest, near the buffer's end
                for t in range(q, k - j):
                    out[d + t] = data[j + t]
                break
        d += k - j
        out_off[i + 1] = d
    return out_off, out[:d]


def parse_ip(values: pa.Array) -> pa.Array:
    """HiBench's ``UserVisitParser``: the source IP, the value's first comma-separated field."""
    if values.null_count:
        raise ValueError("HiBench record values must not be null")
    off, data, _ = columns.strings(values)
    o, d = first_field(off, data, 44)
    return columns.string_array(o, d, None)


def count_table(bins: int) -> BinnedTable:
    """Running counts per key: one 64-byte entry per key (count, last row of the batch, padding)."""
    return BinnedTable(bins, n_int=3, n_float=0)


@njit(nogil=True, cache=True, inline="always")
def _count(ent, b, e, r, touched_b, touched_e, nt):
    """Count row ``r`` for entry ``e``; returns how many entries the batch touched.

    An entry touched by the batch is listed once and holds ``-count - 1``
    until :func:`running_count` restores it.
    """
    c = ent[b, e, COUNT]
    if c >= 0:
        touched_b[nt] = b
        touched_e[nt] = e
        nt += 1
        c = -c - 1
    ent[b, e, COUNT] = c - 1
    ent[b, e, LAST] = r
    return nt


@njit(nogil=True, cache=True)
def count_known(K, T, misses, touched_b, touched_e):
    """Pass 1: count the rows whose key has an entry (read-only probes, prefetched in groups);
    the others go, in order, to ``misses``. Returns (misses, entries touched)."""
    khash, kw0, kw1, koff, kdata, kbin = K
    ent, arena, meta = T
    m = nt = 0
    first = np.empty(GROUP, np.int64)
    n = len(khash)
    for g in range(0, n, GROUP):
        ge = min(n, g + GROUP)
        for r in range(g, ge):
            first[r - g] = slot_hash(khash[r], 0)
            touch(ent, kbin[r], first[r - g])
        for r in range(g, ge):
            b, ks = kbin[r], koff[r]
            e = lookup(ent, arena, b, first[r - g], 0, kw0[r], kw1[r], kdata, ks, koff[r + 1] - ks)
            if e >= 0:
                nt = _count(ent, b, e, r, touched_b, touched_e, nt)
            else:
                misses[m] = r
                m += 1
    return m, nt


@njit(nogil=True, cache=True)
def count_new(pos, m, misses, K, T, touched_b, touched_e, nt):
    """Pass 2: the missed rows, inserting their keys; returns (where it stopped for room, entries touched)."""
    khash, kw0, kw1, koff, kdata, kbin = K
    ent, arena, meta = T
    for q in range(pos, m):
        r = misses[q]
        b = kbin[r]
        if not room(ent, arena, meta, b, 1, key_bytes(koff[r + 1] - koff[r])):
            return q, nt
        ks, klen = koff[r], koff[r + 1] - koff[r]
        e, i = find_slot(ent, arena, b, slot_hash(khash[r], 0), 0, kw0[r], kw1[r], kdata, ks, klen)
        if e < 0:
            e = place(ent, arena, meta, b, i, kw0[r], kw1[r], 0, kdata, ks, klen)
        nt = _count(ent, b, e, r, touched_b, touched_e, nt)
    return m, nt


@njit(nogil=True, cache=True)
def locate(rows, K, T, entries):
    """The entry of each row's key (after a rebuild renumbered them)."""
    khash, kw0, kw1, koff, kdata, kbin = K
    ent, arena, meta = T
    for j in range(len(rows)):
        r = rows[j]
        ks = koff[r]
        entries[j] = lookup(ent, arena, kbin[r], slot_hash(khash[r], 0), 0, kw0[r], kw1[r], kdata, ks,
                            koff[r + 1] - ks)


@njit(nogil=True, cache=True)
def counts_by_last_row(ent, touched_b, touched_e, nt, n):
    """(last row, count) of the ``nt`` entries a batch of ``n`` rows touched, in last-row order
    (a counting sort: last rows are distinct); restores their counts."""
    at = np.full(n, -1, np.int64)
    counts = np.empty(nt, np.int64)
    for t in range(nt):
        b, e = touched_b[t], touched_e[t]
        counts[t] = -ent[b, e, COUNT] - 1
        ent[b, e, COUNT] = counts[t]
        at[ent[b, e, LAST]] = t
    last = np.empty(nt, np.int64)
    count = np.empty(nt, np.int64)
    j = 0
    for r in range(n):
        if at[r] >= 0:
            last[j] = r
            count[j] = counts[at[r]]
            j += 1
    return last, count


def running_count(table: BinnedTable, K) -> tuple[np.ndarray, np.ndarray]:
    """Count every row of a batch under its key; returns (last row, count now) of each key the batch
    holds, ordered by last row. ``K``: the batch's (hashes, words, words, key offsets, key bytes, bins)."""
    n = len(K[0])
    misses, touched_b, touched_e = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    m, nt = count_known(K, table.arrays, misses, touched_b, touched_e)
    pos = 0
    while True:
        pos, nt = count_new(pos, m, misses, K, table.arrays, touched_b, touched_e, nt)
        if pos == m:
            break
        rows = table.ent[touched_b[:nt], touched_e[:nt], LAST]  # a rebuild renumbers the entries
        table.grow_for(K[5][misses[pos:m]], K[3])
        locate(rows, K, table.arrays, touched_e)
    return counts_by_last_row(table.ent, touched_b, touched_e, nt, n)
