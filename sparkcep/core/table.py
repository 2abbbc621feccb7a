"""The keyed state of windowed operators, kept per bin.

Every array has the bin (route-key bucket) as its first dimension: each bin
is an open-addressing hash table whose slots *are* the entries, keyed by
(encoded key bytes, window start), with accumulator columns after the key;
string values and the bytes of keys longer than 16 live in the bin's own
arena. A bin's state is one slice of each array, so taking bins out and
installing them — the interface migration and replication build on
(DESIGN.md §5) — is one fancy-index copy of their slices, whatever the
number of bins that stay.

Why entries sit in the slots: the HiBench-fixwindow state (100K keys,
16 MB of slots) does not fit in the core's caches, so the window aggregate
is bound by how many cache lines a tuple touches and how many of those
misses overlap. One line per tuple (an entry row of 64 bytes for count +
min: 5 key columns, 3 accumulator slots), prefetched by :func:`touch` a few
dozen tuples before it is processed, and probe runs kept short
(:func:`rehash_bin`), is what makes it fast.

Kernels take the arrays as one tuple ``T`` (numba caches plain functions,
not classes) and unpack it once, outside their loops: unpacking it per row
costs tens of ns in reference counting. The per-row helpers are inlined and
take the arrays they touch. :class:`BinnedTable` owns the arrays and
rebuilds them. All bins share one capacity: keys hash uniformly over bins,
so they fill evenly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from sparkcep.core.hashing import hash_head, hash_key
from sparkcep.core.memory import prefetch, store8
from sparkcep.core.pages import zeroed
from sparkcep.errors import EngineError

EMPTY, TOMB = -1, -2  # KEY column of a free slot and of a deleted entry
COUNTER = np.iinfo(np.int64).min  # window start of a per-group tuple counter entry
N_LIVE, N_TOMB, ARENA_USED = range(3)  # meta columns, per bin
K0, K1, WSTART, KEY, AUX = range(5)  # entry columns, then the accumulators
ACC = 5  # first accumulator column: int slots, then float slots (read through a float64 view)
# K0, K1: the key's first 16 bytes; a key of up to 16 bytes lives there alone, not in the arena.
# KEY: the key's arena offset << KEY_BITS | its length (negative: EMPTY or TOMB).
# AUX: counters: tuples seen; windows: the largest sequence number added.
KEY_BITS = 24
KEY_LEN = (1 << KEY_BITS) - 1
MAX_LOAD = 0.75  # live entries + tombstones per slot before a bin must be rebuilt
# string bytes one add may reserve, counted over every bin: each bin's arena is as wide as the fullest's
ARENA_PART_BYTES = 64 << 20
GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit(nogil=True, cache=True, inline="always")
def slot_hash(h, wstart):
    """The hash that places (key, window start) in a bin."""
    x = h ^ (np.uint64(wstart) * GOLDEN)
    x ^= x >> np.uint64(29)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(32)
    return np.int64(x)


@njit(nogil=True, cache=True, inline="always")
def key_bytes(klen):
    """Arena bytes a key of ``klen`` bytes takes: none up to 16, which K0 and K1 hold."""
    return klen if klen > 16 else 0


@njit(nogil=True, cache=True, inline="always")
def touch(ent, b, hw):
    """Prefetch the first two slots (key, window start) probes, so their cache lines are on their way.

    Kernels call this for a group of tuples before processing them, so the
    misses overlap instead of queueing one by one. A slot is a line, and at
    the loads tables run at about half of hits are one slot past their first.
    """
    mask = ent.shape[1] - 1
    prefetch(ent, b, hw & mask)
    prefetch(ent, b, (hw + 1) & mask)


@njit(nogil=True, cache=True, inline="always")
def lookup(ent, arena, b, hw, wstart, w0, w1, kdata, ks, klen):
    """Entry of (key, wstart) in bin ``b`` or -1: the hot path, reads only.

    Short-circuit tests and one exit keep the probe small enough for LLVM to
    hold in registers. Loops that may insert call :func:`find_slot`, then
    :func:`place` on a miss, themselves: a helper doing both, inlined into a
    loop, made each call ~50 ns slower even when it only found.
    """
    mask = ent.shape[1] - 1
    i = hw & mask
    found = -1
    while True:
        k = ent[b, i, KEY]
        if k == EMPTY:
            break
        if k >= 0 and ent[b, i, K0] == w0 and ent[b, i, K1] == w1 and ent[b, i, WSTART] == wstart \
                and (k & KEY_LEN) == klen:
            if klen <= 16 or same_tail(arena, b, k >> KEY_BITS, kdata, ks, klen):
                found = i
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
def room(ent, arena, meta, b, entries, nbytes):
    """Whether bin ``b`` can take ``entries`` more entries and ``nbytes`` more arena bytes."""
    return (meta[b, N_LIVE] + meta[b, N_TOMB] + entries <= MAX_LOAD * ent.shape[1]
            and meta[b, ARENA_USED] + nbytes <= arena.shape[1])


@njit(nogil=True, cache=True, inline="always")
def find_slot(ent, arena, b, hw, wstart, w0, w1, kdata, ks, klen):
    """(entry of (key, wstart) in bin ``b`` or -1, the slot to :func:`place` it at when absent):
    :func:`lookup` and the free slot from one walk, for loops that insert most of what they probe."""
    mask = ent.shape[1] - 1
    i = hw & mask
    free = -1
    found = -1
    while True:
        k = ent[b, i, KEY]
        if k == EMPTY:
            break
        if k == TOMB:
            if free < 0:
                free = i
        elif ent[b, i, K0] == w0 and ent[b, i, K1] == w1 and ent[b, i, WSTART] == wstart \
                and (k & KEY_LEN) == klen:
            if klen <= 16 or same_tail(arena, b, k >> KEY_BITS, kdata, ks, klen):
                found = i
                break
        i = (i + 1) & mask
    return found, (free if free >= 0 else i)


@njit(nogil=True, cache=True, inline="always")
def place(ent, arena, meta, b, i, w0, w1, wstart, kdata, ks, klen):
    """Write (key, wstart) as a new entry at free slot or tombstone ``i`` of bin ``b`` (room
    checked by the caller); returns ``i``."""
    if ent[b, i, KEY] == TOMB:
        meta[b, N_TOMB] -= 1
    o = meta[b, ARENA_USED]
    for k in range(key_bytes(klen)):
        arena[b, o + k] = kdata[ks + k]
    meta[b, ARENA_USED] = o + key_bytes(klen)
    meta[b, N_LIVE] += 1
    ent[b, i, K0] = w0
    ent[b, i, K1] = w1
    ent[b, i, WSTART] = wstart
    ent[b, i, KEY] = (o << KEY_BITS) | klen
    for k in range(AUX, ent.shape[2]):
        ent[b, i, k] = 0  # int 0 is float 0.0 too
    return i


@njit(nogil=True, cache=True, inline="always")
def free_runs(ent, meta, b, entries, lo, hi):
    """Free the tombstones of bin ``b`` no probe needs any more, given its deleted ``entries[lo:hi]``
    in slot order.

    A probe stops at the first free slot, so a tombstone followed by a free
    slot can never be passed over again: it and the run of tombstones
    before it become free. Walking the deleted entries backwards frees
    whole runs. For a few deletions; a fire, which empties most of a bin,
    sweeps the bin instead (:func:`sweep_tombstones`).
    """
    mask = ent.shape[1] - 1
    for j in range(hi - 1, lo - 1, -1):
        i = entries[j]
        if ent[b, (i + 1) & mask, KEY] == EMPTY:
            while ent[b, i, KEY] == TOMB:
                ent[b, i, KEY] = EMPTY
                meta[b, N_TOMB] -= 1
                i = (i - 1) & mask


@njit(nogil=True, cache=True)
def delete_entries(T, bins, entries):
    """Delete entries (bin-major, slot order within a bin), then free the tombstones they leave
    (rehashing bins they still crowd)."""
    ent, arena, meta = T
    for j in range(len(entries)):
        b, e = bins[j], entries[j]
        ent[b, e, KEY] = TOMB
        meta[b, N_LIVE] -= 1
        meta[b, N_TOMB] += 1
    lo = 0
    for j in range(1, len(entries) + 1):
        if j == len(entries) or bins[j] != bins[lo]:
            free_runs(ent, meta, bins[lo], entries, lo, j)
            clean(ent, arena, meta, bins[lo])
            lo = j


@njit(nogil=True, cache=True, inline="always")
def _unpack_words(w0, w1, out, d):
    """The 16 bytes of K0, K1 into ``out[d:d+16]``."""
    store8(out, d, w0)
    store8(out, d + 8, w1)


@njit(nogil=True, cache=True, inline="always")
def stored_hash(k, w0, w1, bin_arena):
    """:func:`~sparkcep.core.hashing.hash_key` of a stored key: KEY column ``k``, words ``w0``, ``w1``."""
    n = k & KEY_LEN
    if n > 16:
        return hash_key(bin_arena, k >> KEY_BITS, (k >> KEY_BITS) + n)[0]
    return hash_head(np.uint64(w0), np.uint64(w1), n)


@njit(nogil=True, cache=True)
def rehash_bin(ent, arena, meta, b):
    """Put bin ``b``'s live entries back in their probe order with no tombstone between them.

    Deleting leaves tombstones a probe must walk past; after windows fire,
    the entries of the next one keep runs of them alive, and clusters grow
    window after window.
    Entries keep their arena bytes; only their slots change.
    """
    slots = ent.shape[1]
    live = np.empty((meta[b, N_LIVE], ent.shape[2]), np.int64)
    n = 0
    for e in range(slots):
        if ent[b, e, KEY] >= 0:
            live[n] = ent[b, e]
            n += 1
        ent[b, e, KEY] = EMPTY
    meta[b, N_TOMB] = 0
    mask = slots - 1
    for j in range(n):
        i = slot_hash(stored_hash(live[j, KEY], live[j, K0], live[j, K1], arena[b]), live[j, WSTART]) & mask
        while ent[b, i, KEY] >= 0:
            i = (i + 1) & mask
        ent[b, i] = live[j]


@njit(nogil=True, cache=True, inline="always")
def clean(ent, arena, meta, b):
    """Rehash bin ``b`` when tombstones fill an eighth of it."""
    if meta[b, N_TOMB] * 8 > ent.shape[1]:
        rehash_bin(ent, arena, meta, b)


@njit(nogil=True, cache=True)
def keys_out(rows, bins, arena):
    """Key bytes of entries copied out as ``rows`` (columns, n) from bins ``bins``: (offsets, bytes).

    A key of up to 16 bytes is all in K0, K1: their 16 bytes are written
    without a length-dependent loop (the bytes have 16 of slack; the next
    key overwrites the excess). Longer keys come from the arena, so call
    this before the next rebuild. A pass of its own: interleaved with
    the table scan, these byte stores made taking entries twice as slow.
    """
    n = rows.shape[1]
    koff = np.zeros(n + 1, np.int64)
    for j in range(n):
        koff[j + 1] = koff[j] + (rows[KEY, j] & KEY_LEN)
    kdata = np.empty(koff[n] + 16, np.uint8)
    for j in range(n):
        d, ln = koff[j], rows[KEY, j] & KEY_LEN
        if ln <= 16:
            _unpack_words(rows[K0, j], rows[K1, j], kdata, d)
        else:
            o = rows[KEY, j] >> KEY_BITS
            for q in range(ln):
                kdata[d + q] = arena[bins[j], o + q]
    return koff, kdata[:koff[n]]


@njit(nogil=True, cache=True)
def take_entries(T, bins, entries):
    """Copy entries out and delete them: (their columns as a (columns, n) array, key offsets, key bytes)."""
    ent, arena, meta = T
    out = np.empty((ent.shape[2], len(entries)), np.int64)
    for j in range(len(entries)):
        for c in range(ent.shape[2]):
            out[c, j] = ent[bins[j], entries[j], c]
    delete_entries(T, bins, entries)
    koff, kdata = keys_out(out, bins, arena)
    return out, koff, kdata


@njit(nogil=True, cache=True, inline="always")
def sweep_tombstones(ent, meta, b):
    """Free every tombstone of bin ``b`` that no probe needs, in one backward pass over its slots.

    A probe walks forward to the first free slot, so a tombstone is needed
    only where a live entry follows it before a free slot: walking backwards
    from a free slot, that is one flag. For a bin mostly emptied at once
    (:func:`take_expired`); :func:`free_runs` costs less for a few deletions.
    Branch-free, as live, deleted and free slots alternate at random there.
    """
    slots = ent.shape[1]
    mask = slots - 1
    start = 0  # a free slot (loads stay below 1)
    while ent[b, start, KEY] != EMPTY:
        start += 1
    need, tombs, i = False, 0, start
    for _ in range(slots):
        i = (i - 1) & mask
        k = ent[b, i, KEY]
        tomb = k == TOMB
        keep = tomb & need
        ent[b, i, KEY] = EMPTY if tomb and not need else k
        need = (k >= 0) | keep
        tombs += keep
    meta[b, N_TOMB] = tombs


@njit(nogil=True, cache=True)
def take_expired(T, max_wstart, lo, hi):
    """Take out every window entry of bins ``[lo, hi)`` starting at or before ``max_wstart``, bin by
    bin in slot order: (their bins, columns, key offsets, key bytes), as :func:`take_entries`.

    Per bin, a branch-free pass lists the slots to take (live, free and
    deleted slots alternate at random, so branching on each mispredicts),
    then only those are copied out. Copying every slot branch-free and
    keeping the taken ones took 1.33 ms where this takes 1.0 (HiBench
    fixwindow's fire of 63K entries from 128K slots). The taken slots stay
    tombstones: :func:`sweep_bins` frees them later, off the close's path.
    """
    ent, arena, meta = T
    cap = 0
    for b in range(lo, hi):
        cap += meta[b, N_LIVE]
    bins = np.empty(cap, np.int64)
    out = np.empty((ent.shape[2], cap), np.int64)
    taken = np.empty(ent.shape[1], np.int64)  # the slots taken from the bin at hand
    n = 0
    for b in range(lo, hi):
        if meta[b, N_LIVE] == 0:  # e.g. a bin another instance owns: do not walk its slots
            continue
        m = 0
        for e in range(ent.shape[1]):
            w = ent[b, e, WSTART]
            taken[m] = e
            m += (ent[b, e, KEY] >= 0) & (w != COUNTER) & (w <= max_wstart)
        for j in range(m):
            e = taken[j]
            for c in range(ent.shape[2]):
                out[c, n + j] = ent[b, e, c]
            ent[b, e, KEY] = TOMB
            bins[n + j] = b
        n += m
        meta[b, N_LIVE] -= m
        meta[b, N_TOMB] += m
    koff, kdata = keys_out(out[:, :n], bins[:n], arena)
    return bins[:n], out[:, :n], koff, kdata


@njit(nogil=True, cache=True)
def sweep_bins(T, bins):
    """Free the tombstones of ``bins`` no probe needs any more (:func:`sweep_tombstones`), rehashing
    the bins they still crowd."""
    ent, arena, meta = T
    for b in bins:
        if meta[b, N_TOMB]:
            sweep_tombstones(ent, meta, b)
            clean(ent, arena, meta, b)


@njit(nogil=True, cache=True)
def compact_arena(T, arena, str_slots):
    """Copy the bytes live entries use into ``arena`` (same bins, maybe longer), updating their offsets."""
    ent, old, meta = T
    for b in range(ent.shape[0]):
        o = 0
        if meta[b, N_LIVE] == 0:
            meta[b, ARENA_USED] = 0
            continue
        for e in range(ent.shape[1]):
            k = ent[b, e, KEY]
            if k < 0:
                continue
            ks, n = k >> KEY_BITS, k & KEY_LEN
            for j in range(key_bytes(n)):
                arena[b, o + j] = old[b, ks + j]
            ent[b, e, KEY] = (o << KEY_BITS) | n
            o += key_bytes(n)
            for q in range(len(str_slots)):
                c = str_slots[q]
                so, n = ent[b, e, c], ent[b, e, c + 1]
                for j in range(n):
                    arena[b, o + j] = old[b, so + j]
                ent[b, e, c] = o
                o += n
        meta[b, ARENA_USED] = o


@njit(nogil=True, cache=True)
def copy_bin(S, sb, T, tb, str_slots):
    """Insert the live entries of bin ``sb`` of table S into bin ``tb`` of table T (room ensured).

    ``str_slots``: entry columns holding an arena offset of a string value (length in the next).
    """
    s_ent, s_arena, s_meta = S
    ent, arena, meta = T
    src = s_arena[sb]
    if s_meta[sb, N_LIVE] == 0:
        return
    for s in range(s_ent.shape[1]):
        k = s_ent[sb, s, KEY]
        if k < 0:
            continue
        ks, n = k >> KEY_BITS, k & KEY_LEN
        w, w0, w1 = s_ent[sb, s, WSTART], s_ent[sb, s, K0], s_ent[sb, s, K1]
        e, i = find_slot(ent, arena, tb, slot_hash(stored_hash(k, w0, w1, src), w), w, w0, w1, src, ks, n)
        if e < 0:
            e = place(ent, arena, meta, tb, i, w0, w1, w, src, ks, n)
        for c in range(AUX, ent.shape[2]):
            ent[tb, e, c] = s_ent[sb, s, c]
        for q in range(len(str_slots)):
            c = str_slots[q]
            n = s_ent[sb, s, c + 1]
            o = meta[tb, ARENA_USED]
            so = s_ent[sb, s, c]
            for j in range(n):
                arena[tb, o + j] = src[so + j]
            ent[tb, e, c] = o
            meta[tb, ARENA_USED] = o + n


@njit(nogil=True, cache=True)
def insert_bins(S, sbins, T, tbins, str_slots):
    """:func:`copy_bin` of bin ``sbins[i]`` of S into bin ``tbins[i]`` of T, for every i (room ensured)."""
    for i in range(len(sbins)):
        copy_bin(S, sbins[i], T, tbins[i], str_slots)


@njit(nogil=True, cache=True)
def live_bytes(T, str_slots):
    """Per bin: (live entries, arena bytes the live entries use)."""
    ent, arena, meta = T
    B = meta.shape[0]
    out = np.zeros((B, 2), np.int64)
    for b in range(B):
        if meta[b, N_LIVE] == 0:
            continue
        for e in range(ent.shape[1]):
            k = ent[b, e, KEY]
            if k >= 0:
                out[b, 0] += 1
                out[b, 1] += key_bytes(k & KEY_LEN)
                for q in range(len(str_slots)):
                    out[b, 1] += ent[b, e, str_slots[q] + 1]
    return out


@njit(nogil=True, cache=True)
def select(T, max_wstart):
    """(bins, entries) of live window entries with start <= ``max_wstart``, bin-major."""
    ent, arena, meta = T
    n = 0
    for b in range(meta.shape[0]):
        n += meta[b, N_LIVE]
    ob = np.empty(n, np.int64)
    oe = np.empty(n, np.int64)
    m = 0
    for b in range(meta.shape[0]):
        if meta[b, N_LIVE] == 0:
            continue
        for e in range(ent.shape[1]):
            w = ent[b, e, WSTART]
            if ent[b, e, KEY] < 0 or w == COUNTER or w > max_wstart:
                continue
            ob[m] = b
            oe[m] = e
            m += 1
    return ob[:m], oe[:m]


class BinnedTable:
    """Entries keyed by (key bytes, window start) in ``bins`` bins, with accumulator slots.

    Each entry is one row of ``ent``: its key and window columns, then
    ``n_int`` int slots and ``n_float`` float slots (``entf`` is the same
    memory seen as float64). ``str_slots`` lists the int slots holding an
    arena offset of a string value (its length is in the next slot), so
    copies move the bytes too.
    """

    def __init__(self, bins: int, n_int: int, n_float: int, str_slots=(), entries: int = 8, arena_bytes: int = 256):
        self.n_bins, self.n_int, self.n_float = bins, n_int, n_float
        self.str_slots = np.asarray(str_slots, np.int64)
        self.arrays = _arrays(bins, _slots_for(entries), ACC + n_int + n_float, arena_bytes)
        self.unswept = np.zeros(bins, np.bool_)  # bins :meth:`take_expired` left tombstones in

    @property
    def ent(self) -> np.ndarray:
        return self.arrays[0]

    @property
    def entf(self) -> np.ndarray:
        """The entry rows seen as float64 (for the float accumulator slots)."""
        return self.arrays[0].view(np.float64)

    def kernel_state(self) -> tuple:
        """(entries, entries as float64, arena, meta): what the accumulate kernels take."""
        ent, arena, meta = self.arrays
        return ent, ent.view(np.float64), arena, meta

    @property
    def acc_i(self) -> np.ndarray:
        return self.ent[:, :, ACC:ACC + self.n_int]

    @property
    def acc_f(self) -> np.ndarray:
        return self.entf[:, :, ACC + self.n_int:]

    @property
    def arena(self) -> np.ndarray:
        return self.arrays[1]

    @property
    def meta(self) -> np.ndarray:
        return self.arrays[2]

    @property
    def n_live(self) -> int:
        return int(self.meta[:, N_LIVE].sum())

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)

    def grow(self, entries: int = 0, arena_bytes: int = 0) -> None:
        """Make room for ``entries`` more entries and ``arena_bytes`` more bytes in every bin.

        Rebuilds (rehashing) when the slots are too few; otherwise only
        compacts the arenas, dropping the bytes of deleted entries.
        """
        live = live_bytes(self.arrays, self.str_slots + ACC)
        want = int(live[:, 0].max()) + entries
        arena = zeroed((self.n_bins, max(64, 2 * int(live[:, 1].max()) + arena_bytes)), np.uint8)
        if want * 2 <= self.ent.shape[1] and int(self.meta[:, N_TOMB].max()) * 4 <= self.ent.shape[1]:
            compact_arena(self.arrays, arena, self.str_slots + ACC)
            self.arrays = (self.arrays[0], arena, self.arrays[2])
            return
        self._reshape(_slots_for(want), arena.shape[1])

    def _reshape(self, slots: int, arena_bytes: int) -> None:
        """Rebuild with ``slots`` slots and ``arena_bytes`` arena bytes per bin, rehashing the live entries."""
        fresh = _arrays(self.n_bins, slots, self.ent.shape[2], arena_bytes)
        held = self.bins()
        insert_bins(self.arrays, held, fresh, held, self.str_slots + ACC)
        self.arrays = fresh

    def _widen(self, arena_bytes: int) -> None:
        """Make every bin's arena ``arena_bytes`` wide; entries keep their slots and offsets."""
        arena = zeroed((self.n_bins, arena_bytes), np.uint8)
        arena[:, :self.arena.shape[1]] = self.arena
        self.arrays = (self.arrays[0], arena, self.arrays[2])

    def grow_for(self, entries: int, inserts: int, key_offsets: np.ndarray, value_bytes: int = 0) -> None:
        """Make room for ``entries`` more entries in the fullest bin and the arena bytes of ``inserts``
        inserts there: one rebuild where doubling would take several.

        Sized by the fullest bin, not by the average: an instance holds only
        the bins routed to it (:func:`fullest` counts them). An insert takes
        the arena bytes of an average key of ``key_offsets`` (the batch's
        encoded keys) plus ``value_bytes`` (a string value may be appended
        at every insert). A rebuild leaves the slots at most half full.
        """
        lengths = np.diff(key_offsets)
        each = int(lengths[lengths > 16].sum()) // max(len(lengths), 1) + value_bytes + 1
        self.grow(entries + 8, (inserts + 8) * each + 64)

    def reserve(self, bins: np.ndarray, nbytes: np.ndarray) -> None:
        """Make room for rows to append ``nbytes[i]`` arena bytes each to bin ``bins[i]``."""
        need = np.bincount(bins, weights=nbytes, minlength=self.n_bins)
        if (need > self.arena.shape[1] - self.meta[:, ARENA_USED]).any():
            self.grow(0, int(need.max()))

    def rows_to_reserve(self, bins: np.ndarray, nbytes: np.ndarray) -> int:
        """How many rows of :meth:`reserve`'s ``bins``, ``nbytes`` to add at once: every arena widens to the
        fullest bin's need, so a batch of long strings on few keys (1,000 rows of 10 KB on one key took
        1.3 GB with 128 bins) goes in parts of at most :data:`ARENA_PART_BYTES` over all bins."""
        fullest = np.bincount(bins, weights=nbytes, minlength=self.n_bins).max()
        if fullest * self.n_bins <= ARENA_PART_BYTES:
            return len(bins)
        return max(1, int(len(bins) * ARENA_PART_BYTES / (fullest * self.n_bins)))

    def take(self, bins: np.ndarray, entries: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Delete entries; returns their columns as a (columns, n) array (floats: view as float64)
        and their key bytes (offsets, bytes).

        Their string values stay readable in the arena until the next :meth:`grow`.
        """
        return take_entries(self.arrays, bins, entries)

    def take_expired(self, max_wstart: int, lo: int = 0, hi: int | None = None):
        """Delete the window entries of bins ``[lo, hi)`` starting at or before ``max_wstart``;
        returns their bins and what :meth:`take` returns, in one pass over those bins.

        The slots they leave stay tombstones until :meth:`sweep`: freeing them
        here took 0.18 of 0.80 ms (HiBench fixwindow's fire of 39K entries
        from 131K slots), which the window close waited for."""
        hi = self.n_bins if hi is None else hi
        self.unswept[lo:hi] = True
        return take_expired(self.arrays, max_wstart, lo, hi)

    def sweep(self) -> None:
        """Free the tombstones :meth:`take_expired` left since the last sweep."""
        if self.unswept.any():
            sweep_bins(self.arrays, np.flatnonzero(self.unswept))
            self.unswept[:] = False

    def select(self, max_wstart: int = np.iinfo(np.int64).max):
        """(bins, entries) of live window entries starting at or before ``max_wstart``."""
        return select(self.arrays, max_wstart)

    def copy_bins(self, bins: np.ndarray | None = None) -> "TableBins":
        """The state of distinct ``bins`` (None: all), the table unchanged: one fancy-index copy of the
        slices of those holding entries (the arena's up to the most bytes one of them uses)."""
        if bins is None:
            b = self.bins()
        else:
            b = np.asarray(bins, np.int64)
            b = b[self.meta[b, N_LIVE] > 0]
        ent, arena, meta = self.arrays
        width = int(meta[b, ARENA_USED].max()) if len(b) else 0
        return TableBins(b, ent[b], arena[b, :width], meta[b])

    def take_bins(self, bins: np.ndarray | None = None) -> "TableBins":
        """Remove and return the state of distinct ``bins`` (None: all); only their slices are touched."""
        part = self.copy_bins(bins)
        self.ent[part.bins, :, KEY] = EMPTY
        self.meta[part.bins] = 0
        return part

    def put_bins(self, part: "TableBins") -> None:
        """Install bins taken from a table of the same layout; this table holds no entry of them.

        With as many slots per bin as the sender, their slices are assigned
        (the arenas widened first if needed, without rehashing); otherwise
        their entries are rehashed in, the table first rebuilt with the
        sender's slots if its own are too few. An empty table takes the
        sender's shape.
        """
        b = part.bins
        if not len(b):
            return
        if part.ent.shape[2] != self.ent.shape[2]:
            raise EngineError(f"bin state of entries with {part.ent.shape[2]} columns cannot go into a table of "
                              f"{self.ent.shape[2]}: it comes from another operator", code="BIN_STATE_MISMATCH")
        held = b[self.meta[b, N_LIVE] > 0]
        if len(held):
            raise EngineError(f"bins {held[:8].tolist()} are already held here: a bin has one owner at a time",
                              code="BIN_HELD")
        slots, width = part.ent.shape[1], part.arena.shape[1]
        if slots != self.ent.shape[1] and self.n_live == 0:
            self.arrays = _arrays(self.n_bins, slots, self.ent.shape[2], width)
        elif slots > self.ent.shape[1] and int(part.meta[:, N_LIVE].max()) * 2 > self.ent.shape[1]:
            self._reshape(slots, max(width, self.arena.shape[1]))
        elif width > self.arena.shape[1]:
            self._widen(width)
        ent, arena, meta = self.arrays
        if ent.shape[1] == slots:
            ent[b] = part.ent
            arena[b, :width] = part.arena
            meta[b] = part.meta
            self.unswept[b] |= part.meta[:, N_TOMB] > 0  # a fire's, not swept before it left
            return
        ent[b, :, KEY] = EMPTY
        meta[b] = 0
        insert_bins(part.arrays, np.arange(len(b)), self.arrays, b, self.str_slots + ACC)

    def bins(self) -> np.ndarray:
        """The bins holding live entries."""
        return np.flatnonzero(self.meta[:, N_LIVE] > 0)


@dataclass
class TableBins:
    """Bins of a :class:`BinnedTable` on the move: row ``i`` of each array is bin ``bins[i]``'s slice."""

    bins: np.ndarray
    ent: np.ndarray
    arena: np.ndarray
    meta: np.ndarray

    def __len__(self) -> int:
        return len(self.bins)

    @property
    def arrays(self) -> tuple:
        return self.ent, self.arena, self.meta

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.bins, *self.arrays))


def fullest(bins: np.ndarray, entries: np.ndarray | None = None, weights: np.ndarray | None = None) -> int:
    """How many of the pending inserts falling in ``bins`` the fullest bin takes: each distinct one of
    ``entries`` (what identifies the entry an insert makes: a hash) counted once, weighted by ``weights``."""
    if entries is not None:
        first = np.unique(entries, return_index=True)[1]
        bins, weights = bins[first], None if weights is None else weights[first]
    return int(np.bincount(bins, weights=weights, minlength=1).max())


def _slots_for(entries: int) -> int:
    """Slots per bin of a table built for ``entries`` entries a bin: load <= 1/2 when built."""
    return 1 << max(4, int(2 * entries - 1).bit_length())


def _arrays(bins: int, slots: int, columns: int, arena_bytes: int) -> tuple:
    """Empty (entries, arena, meta) arrays of a table."""
    ent = zeroed((bins, slots, columns), np.int64, huge=True)  # probed at random
    ent[:, :, KEY] = EMPTY
    return (ent,
            zeroed((bins, max(64, int(arena_bytes))), np.uint8),  # key bytes and string values
            np.zeros((bins, 3), np.int64))                          # meta per bin
