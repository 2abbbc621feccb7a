"""The keyed state of windowed operators, kept per bin.

Every array has the bin (route-key bucket) as its first dimension: each bin
is a small open-addressing hash table of entries keyed by (encoded key
bytes, window start), with accumulator slots, key bytes and string values in
the bin's own arena. A batch is processed bin after bin (sequence order kept
within a bin), and a bin's state is one slice of each array, so extracting
and installing a bin — the interface migration and replication build on
(DESIGN.md §5) — is a copy.

Kernels take the arrays as one tuple ``T`` (numba caches plain functions,
not classes) and unpack it once, outside their loops: unpacking it per row
costs tens of ns in reference counting. The per-row helpers are inlined and
take the arrays they touch. :class:`BinnedTable` owns the arrays and resizes
them. All bins share one capacity: keys hash uniformly over bins, so they
fill evenly.
"""

from __future__ import annotations

import numpy as np
from numba import njit

EMPTY, TOMB = -1, -2
COUNTER = np.iinfo(np.int64).min  # window start of a per-group tuple counter entry
N_ENTRIES, ARENA_USED, N_LIVE, N_TOMB = 0, 1, 2, 3  # meta columns, per bin
WSTART, KOFF, KLEN, AUX, TS, HASH, K0, K1 = range(8)  # entry columns, then the accumulators
ACC = 8  # first accumulator column: int slots, then float slots (read through a float64 view)
# AUX: counters: tuples seen; windows: max sequence number. TS: windows: max event time.
# K0, K1: the key's first 16 bytes, so short keys compare without reading the arena.
GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit(nogil=True, cache=True, inline="always")
def slot_hash(h, wstart):
    """The hash that places (key, window start) in a bin's slots."""
    x = h ^ (np.uint64(wstart) * GOLDEN)
    x ^= x >> np.uint64(29)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(32)
    return np.int64(x)


@njit(nogil=True, cache=True, inline="always")
def lookup(slots, ent, arena, b, hw, wstart, w0, w1, kdata, ks, klen):
    """Entry of (key, wstart) in bin ``b`` or -1: the hot path, reads only.

    Short-circuit tests and one exit keep the probe small enough for LLVM to
    hold in registers. A loop that may also insert runs ~10x slower even when
    it never does, so hot loops call only this and defer misses (see
    ``aggregate.accumulate_time``).
    """
    mask = slots.shape[1] - 1
    i = hw & mask
    found = -1
    while True:
        c = slots[b, i, 1]
        if c == EMPTY:
            break
        if c >= 0 and slots[b, i, 0] == hw and ent[b, c, WSTART] == wstart and ent[b, c, KLEN] == klen \
                and ent[b, c, K0] == w0 and ent[b, c, K1] == w1:
            if klen <= 16 or same_tail(arena, b, ent[b, c, KOFF], kdata, ks, klen):
                found = c
                break
        i = (i + 1) & mask
    return found


@njit(nogil=True, cache=True, inline="always")
def same_tail(arena, b, o, kdata, ks, klen):
    """Whether a stored key's bytes past the first 16 equal the probe key's."""
    for k in range(16, klen):
        if arena[b, o + k] != kdata[ks + k]:
            return False
    return True


@njit(nogil=True, cache=True, inline="always")
def insert(slots, ent, live, arena, meta, b, h, hw, w0, w1, wstart, kdata, ks, klen):
    """Add (key, wstart), known absent, to bin ``b``; its entry, or -1 when the bin is full."""
    e = meta[b, N_ENTRIES]
    o = meta[b, ARENA_USED]
    S = slots.shape[1]
    if e >= ent.shape[1] or o + klen > arena.shape[1] or (meta[b, N_LIVE] + meta[b, N_TOMB] + 1) * 2 > S:
        return -1
    mask = S - 1
    i = hw & mask
    while slots[b, i, 1] >= 0:  # the first empty slot or tombstone
        i = (i + 1) & mask
    if slots[b, i, 1] == TOMB:
        meta[b, N_TOMB] -= 1
    slots[b, i, 0] = hw
    slots[b, i, 1] = e
    for k in range(klen):
        arena[b, o + k] = kdata[ks + k]
    meta[b, N_ENTRIES] = e + 1
    meta[b, ARENA_USED] = o + klen
    meta[b, N_LIVE] += 1
    ent[b, e, WSTART] = wstart
    ent[b, e, KOFF] = o
    ent[b, e, KLEN] = klen
    ent[b, e, AUX] = 0
    ent[b, e, TS] = 0
    ent[b, e, HASH] = np.int64(h)
    ent[b, e, K0] = w0
    ent[b, e, K1] = w1
    for k in range(ACC, ent.shape[2]):
        ent[b, e, k] = 0  # int 0 is float 0.0 too
    live[b, e] = True
    return e


@njit(nogil=True, cache=True, inline="always")
def find_or_insert(slots, ent, live, arena, meta, b, h, w0, w1, wstart, kdata, ks, ke):
    """Entry of (key, wstart) in bin ``b``, inserted if absent; -1 when the bin is full.

    ``w0``/``w1`` are the key's first 16 bytes (see ``hashing.hash_words``).
    """
    hw = slot_hash(h, wstart)
    klen = ke - ks
    e = lookup(slots, ent, arena, b, hw, wstart, w0, w1, kdata, ks, klen)
    if e < 0:
        e = insert(slots, ent, live, arena, meta, b, h, hw, w0, w1, wstart, kdata, ks, klen)
    return e


@njit(nogil=True, cache=True, inline="always")
def room(slots, ent, arena, meta, b, entries, nbytes):
    """Whether bin ``b`` can take ``entries`` more entries and ``nbytes`` more arena bytes."""
    return (meta[b, N_ENTRIES] + entries <= ent.shape[1] and meta[b, ARENA_USED] + nbytes <= arena.shape[1]
            and (meta[b, N_LIVE] + meta[b, N_TOMB] + entries) * 2 <= slots.shape[1])


@njit(nogil=True, cache=True)
def delete_entries(T, bins, entries):
    slots, ent, live, arena, meta = T
    mask = slots.shape[1] - 1
    for j in range(len(entries)):
        b, e = bins[j], entries[j]
        i = slot_hash(np.uint64(ent[b, e, HASH]), ent[b, e, WSTART]) & mask
        while slots[b, i, 1] != e:
            i = (i + 1) & mask
        slots[b, i, 1] = TOMB
        live[b, e] = False
        meta[b, N_LIVE] -= 1
        meta[b, N_TOMB] += 1


@njit(nogil=True, cache=True)
def copy_bin(S, sb, T, tb, str_slots):
    """Insert the live entries of bin ``sb`` of table S into bin ``tb`` of table T (room ensured).

    ``str_slots``: entry columns holding an arena offset of a string value (length in the next).
    """
    s_slots, s_ent, s_live, s_arena, s_meta = S
    slots, ent, live, arena, meta = T
    for s in range(s_meta[sb, N_ENTRIES]):
        if not s_live[sb, s]:
            continue
        ks = s_ent[sb, s, KOFF]
        e = find_or_insert(slots, ent, live, arena, meta, tb, np.uint64(s_ent[sb, s, HASH]),
                           s_ent[sb, s, K0], s_ent[sb, s, K1], s_ent[sb, s, WSTART], s_arena[sb], ks,
                           ks + s_ent[sb, s, KLEN])
        ent[tb, e, AUX] = s_ent[sb, s, AUX]
        ent[tb, e, TS] = s_ent[sb, s, TS]
        for k in range(ACC, ent.shape[2]):
            ent[tb, e, k] = s_ent[sb, s, k]
        for q in range(len(str_slots)):
            c = str_slots[q]
            n = s_ent[sb, s, c + 1]
            o = meta[tb, ARENA_USED]
            so = s_ent[sb, s, c]
            for k in range(n):
                arena[tb, o + k] = s_arena[sb, so + k]
            ent[tb, e, c] = o
            meta[tb, ARENA_USED] = o + n


@njit(nogil=True, cache=True)
def live_bytes(T, str_slots):
    """Per bin: (live entries, arena bytes the live entries use)."""
    slots, ent, live, arena, meta = T
    B = meta.shape[0]
    out = np.zeros((B, 2), np.int64)
    for b in range(B):
        for e in range(meta[b, N_ENTRIES]):
            if live[b, e]:
                out[b, 0] += 1
                out[b, 1] += ent[b, e, KLEN]
                for q in range(len(str_slots)):
                    out[b, 1] += ent[b, e, str_slots[q] + 1]
    return out


@njit(nogil=True, cache=True)
def select(T, max_wstart, want_bin, counters):
    """(bins, entries) of live window entries with start <= ``max_wstart``, bin-major, creation order.

    ``want_bin`` >= 0 limits to one bin; ``counters`` includes tuple counters.
    """
    slots, ent, live, arena, meta = T
    n = 0
    for b in range(meta.shape[0]):
        n += meta[b, N_LIVE]
    ob = np.empty(n, np.int64)
    oe = np.empty(n, np.int64)
    m = 0
    for b in range(meta.shape[0]):
        if want_bin >= 0 and b != want_bin:
            continue
        for e in range(meta[b, N_ENTRIES]):
            if not live[b, e]:
                continue
            w = ent[b, e, WSTART]
            if (w == COUNTER and not counters) or (w != COUNTER and w > max_wstart):
                continue
            ob[m] = b
            oe[m] = e
            m += 1
    return ob[:m], oe[:m]


@njit(nogil=True, cache=True)
def group_rows(keys, n_keys):
    """Stable counting sort: (row indices grouped by key, order kept within a key; start of each key)."""
    starts = np.zeros(n_keys + 1, np.int64)
    for i in range(len(keys)):
        starts[keys[i] + 1] += 1
    for k in range(n_keys):
        starts[k + 1] += starts[k]
    fill = starts[:-1].copy()
    order = np.empty(len(keys), np.int64)
    for i in range(len(keys)):
        k = keys[i]
        order[fill[k]] = i
        fill[k] += 1
    return order, starts


class BinnedTable:
    """Entries keyed by (key bytes, window start) in ``bins`` bins, with accumulator slots.

    Each entry is one row of ``ent``: its key and window columns, then
    ``n_int`` int slots and ``n_float`` float slots (``entf`` is the same
    memory seen as float64). ``str_slots`` lists the int slots holding an
    arena offset of a string value (its length is in the next slot), so
    copies move the bytes too.
    """

    def __init__(self, bins: int, n_int: int, n_float: int, str_slots=(), entries: int = 16, arena_bytes: int = 256):
        self.n_bins, self.n_int, self.n_float = bins, n_int, n_float
        self.str_slots = np.asarray(str_slots, np.int64)
        E = 1 << max(3, int(entries - 1).bit_length())
        slots = np.zeros((bins, 2 * E, 2), np.int64)   # (hash of key and window start, entry)
        slots[:, :, 1] = EMPTY
        self.arrays = (
            slots,
            np.zeros((bins, E, ACC + n_int + n_float), np.int64),  # entries
            np.zeros((bins, E), np.bool_),                # entry is live
            np.zeros((bins, max(64, int(arena_bytes))), np.uint8),  # key bytes and string values
            np.zeros((bins, 4), np.int64),                # meta per bin
        )

    @property
    def ent(self) -> np.ndarray:
        return self.arrays[1]

    @property
    def entf(self) -> np.ndarray:
        """The entry rows seen as float64 (for the float accumulator slots)."""
        return self.arrays[1].view(np.float64)

    def kernel_state(self) -> tuple:
        """(slots, entries, entries as float64, live, arena, meta): what the accumulate kernels take."""
        slots, ent, live, arena, meta = self.arrays
        return slots, ent, ent.view(np.float64), live, arena, meta

    @property
    def acc_i(self) -> np.ndarray:
        return self.ent[:, :, ACC:ACC + self.n_int]

    @property
    def acc_f(self) -> np.ndarray:
        return self.entf[:, :, ACC + self.n_int:]

    @property
    def arena(self) -> np.ndarray:
        return self.arrays[3]

    @property
    def meta(self) -> np.ndarray:
        return self.arrays[4]

    @property
    def n_live(self) -> int:
        return int(self.meta[:, N_LIVE].sum())

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)

    def grow(self, entries: int = 0, arena_bytes: int = 0) -> None:
        """Rebuild with room for ``entries`` more entries and ``arena_bytes`` more bytes in every bin.

        Dead entries and tombstones are dropped on the way.
        """
        live = live_bytes(self.arrays, self.str_slots + ACC)
        fresh = BinnedTable(self.n_bins, self.n_int, self.n_float, self.str_slots,
                            2 * int(live[:, 0].max()) + entries, 2 * int(live[:, 1].max()) + arena_bytes)
        for b in range(self.n_bins):
            copy_bin(self.arrays, b, fresh.arrays, b, self.str_slots + ACC)
        self.arrays = fresh.arrays

    def delete(self, bins: np.ndarray, entries: np.ndarray) -> None:
        delete_entries(self.arrays, bins, entries)

    def select(self, max_wstart: int = np.iinfo(np.int64).max, bin: int = -1, counters: bool = False):
        """(bins, entries) of live window entries starting at or before ``max_wstart``."""
        return select(self.arrays, max_wstart, bin, counters)

    def extract(self, bin: int) -> "BinnedTable":
        """Remove and return bin ``bin``'s state (windows and tuple counters) as a one-bin table."""
        live = live_bytes(self.arrays, self.str_slots + ACC)[bin]
        out = BinnedTable(1, self.n_int, self.n_float, self.str_slots, 2 * int(live[0]), int(live[1]) + 64)
        copy_bin(self.arrays, bin, out.arrays, 0, self.str_slots + ACC)
        self.delete(*self.select(bin=bin, counters=True))
        return out

    def install(self, bin: int, state: "BinnedTable") -> None:
        """Add the entries of a one-bin table from :meth:`extract` to bin ``bin``."""
        live = live_bytes(state.arrays, self.str_slots + ACC)[0]
        slots, ent, _, arena, meta = self.arrays
        if not room(slots, ent, arena, meta, bin, int(live[0]), int(live[1])):
            self.grow(int(live[0]), int(live[1]))
        copy_bin(state.arrays, 0, self.arrays, bin, self.str_slots + ACC)

    def bins(self) -> np.ndarray:
        """The bins holding live entries."""
        return np.flatnonzero(self.meta[:, N_LIVE] > 0)
