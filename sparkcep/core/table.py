"""The keyed state table of windowed operators.

One open-addressing hash table per operator instance, over plain numpy
arrays. An entry is (encoded key bytes, window start) plus accumulator slots;
each entry is tagged with its bin (route-key bucket), so the entries of one
bin can be extracted into a new table and installed into another — the
single state interface that migration and replication build on
(DESIGN.md §5). Deleted entries leave tombstones; the table compacts itself
when they or the key arena grow past the live data.

Kernels take the table's arrays explicitly (numba caches plain functions,
not classes); :class:`KeyTable` owns the arrays and grows them.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sparkcep.core.hashing import hash_range

EMPTY, TOMB = -1, -2
COUNTER = np.iinfo(np.int64).min  # window start of a per-group tuple counter entry
# meta fields
N_ENTRIES, ARENA_USED, N_LIVE, N_TOMB = 0, 1, 2, 3


@njit(nogil=True, cache=True)
def find_or_insert(slots, e_hash, e_wstart, e_koff, e_klen, e_bin, e_live, arena, meta,
                   h, wstart, kdata, ks, ke, b):
    """Entry index of (key, wstart), inserting it if absent. Caller ensured capacity."""
    mask = len(slots) - 1
    i = np.int64(h & np.uint64(mask))
    tomb = -1
    klen = ke - ks
    while True:
        e = slots[i]
        if e == EMPTY:
            break
        if e == TOMB:
            if tomb < 0:
                tomb = i
        elif e_hash[e] == h and e_wstart[e] == wstart and e_klen[e] == klen:
            o = e_koff[e]
            same = True
            for k in range(klen):
                if arena[o + k] != kdata[ks + k]:
                    same = False
                    break
            if same:
                return e
        i = (i + 1) & mask
    if tomb >= 0:
        i = tomb
        meta[N_TOMB] -= 1
    e = meta[N_ENTRIES]
    meta[N_ENTRIES] = e + 1
    meta[N_LIVE] += 1
    slots[i] = e
    o = meta[ARENA_USED]
    for k in range(klen):
        arena[o + k] = kdata[ks + k]
    meta[ARENA_USED] = o + klen
    e_hash[e] = h
    e_wstart[e] = wstart
    e_koff[e] = o
    e_klen[e] = klen
    e_bin[e] = b
    e_live[e] = True
    return e


@njit(nogil=True, cache=True)
def delete_entries(slots, e_hash, e_live, meta, idx):
    mask = len(slots) - 1
    for j in range(len(idx)):
        e = idx[j]
        i = np.int64(e_hash[e] & np.uint64(mask))
        while slots[i] != e:
            i = (i + 1) & mask
        slots[i] = TOMB
        e_live[e] = False
    meta[N_LIVE] -= len(idx)
    meta[N_TOMB] += len(idx)


@njit(nogil=True, cache=True)
def copy_entries(src_wstart, src_koff, src_klen, src_hash, src_bin, src_aux, src_ts, src_acc_i, src_acc_f,
                 src_arena, idx, str_slots,
                 slots, e_hash, e_wstart, e_koff, e_klen, e_bin, e_live, e_aux, e_ts, acc_i, acc_f, arena, meta):
    """Insert entries ``idx`` of a source table (keys, accumulators, string values) into a table."""
    for j in range(len(idx)):
        s = idx[j]
        ks = src_koff[s]
        e = find_or_insert(slots, e_hash, e_wstart, e_koff, e_klen, e_bin, e_live, arena, meta,
                           src_hash[s], src_wstart[s], src_arena, ks, ks + src_klen[s], src_bin[s])
        e_aux[e] = src_aux[s]
        e_ts[e] = src_ts[s]
        acc_i[e, :] = src_acc_i[s, :]
        acc_f[e, :] = src_acc_f[s, :]
        for q in range(len(str_slots)):
            c = str_slots[q]
            n = src_acc_i[s, c + 1]
            o = meta[ARENA_USED]
            so = src_acc_i[s, c]
            for k in range(n):
                arena[o + k] = src_arena[so + k]
            acc_i[e, c] = o
            meta[ARENA_USED] = o + n


@njit(nogil=True, cache=True)
def live_where(e_live, e_wstart, e_bin, n, max_wstart, want_bin, counters):
    """Live entries with window start <= ``max_wstart`` (and bin ``want_bin`` when >= 0).

    ``counters``: include tuple-counter entries (only when extracting bins).
    """
    out = np.empty(n, np.int64)
    m = 0
    for e in range(n):
        if not e_live[e]:
            continue
        w = e_wstart[e]
        if w == COUNTER:
            if not counters:
                continue
        elif w > max_wstart:
            continue
        if want_bin >= 0 and e_bin[e] != want_bin:
            continue
        out[m] = e
        m += 1
    return out[:m]


class KeyTable:
    """Entries keyed by (key bytes, window start) with ``n_int``/``n_float`` accumulator slots.

    ``str_slots`` lists the int slots holding an arena offset of a string
    value (its length is in the next slot), so copies and compaction move the
    bytes with them.
    """

    def __init__(self, n_int: int, n_float: int, str_slots=(), capacity: int = 1024, arena_bytes: int = 1 << 16):
        self.n_int, self.n_float = n_int, n_float
        self.str_slots = np.asarray(str_slots, np.int64)
        cap = 1 << max(4, int(capacity - 1).bit_length())
        self.slots = np.full(cap * 2, EMPTY, np.int64)
        self.e_hash = np.zeros(cap, np.uint64)
        self.e_wstart = np.zeros(cap, np.int64)
        self.e_koff = np.zeros(cap, np.int64)
        self.e_klen = np.zeros(cap, np.int64)
        self.e_bin = np.zeros(cap, np.int64)
        self.e_live = np.zeros(cap, np.bool_)
        self.e_aux = np.zeros(cap, np.int64)   # counter entries: tuples seen; windows: max sequence number
        self.e_ts = np.zeros(cap, np.int64)    # windows: max event time
        self.acc_i = np.zeros((cap, n_int), np.int64)
        self.acc_f = np.zeros((cap, n_float), np.float64)
        self.arena = np.zeros(arena_bytes, np.uint8)
        self.meta = np.zeros(4, np.int64)

    # --- sizes -------------------------------------------------------------
    @property
    def n_entries(self) -> int:
        return int(self.meta[N_ENTRIES])

    @property
    def n_live(self) -> int:
        return int(self.meta[N_LIVE])

    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self.arrays()) + self.slots.nbytes + self.arena.nbytes)

    def arrays(self):
        return (self.e_hash, self.e_wstart, self.e_koff, self.e_klen, self.e_bin, self.e_live,
                self.e_aux, self.e_ts, self.acc_i, self.acc_f)

    def reserve(self, entries: int, arena_bytes: int) -> None:
        """Make room for ``entries`` more entries and ``arena_bytes`` more key/value bytes."""
        need_e = self.n_entries + entries
        need_a = int(self.meta[ARENA_USED]) + arena_bytes
        load = self.n_live + int(self.meta[N_TOMB]) + entries
        if need_e <= len(self.e_hash) and need_a <= len(self.arena) and load * 10 <= len(self.slots) * 7:
            return
        live_arena = need_a - int(self.meta[ARENA_USED]) + self._live_arena_estimate()
        cap = len(self.e_hash)
        while (self.n_live + entries) * 2 > cap:
            cap *= 2
        arena = len(self.arena)
        while live_arena * 2 > arena:
            arena *= 2
        self._rebuild(cap, arena)

    def _live_arena_estimate(self) -> int:
        n = self.n_entries
        used = int(self.e_klen[:n][self.e_live[:n]].sum())
        for c in self.str_slots:
            used += int(self.acc_i[:n, c + 1][self.e_live[:n]].sum())
        return used

    def _rebuild(self, cap: int, arena_bytes: int) -> None:
        fresh = KeyTable(self.n_int, self.n_float, self.str_slots, cap, arena_bytes)
        idx = np.flatnonzero(self.e_live[: self.n_entries])
        fresh.copy_from(self, idx)
        self.__dict__.update(fresh.__dict__)

    # --- entries -----------------------------------------------------------
    def copy_from(self, src: "KeyTable", idx: np.ndarray) -> None:
        """Insert ``src``'s entries ``idx`` (keys, accumulators, string values)."""
        idx = np.asarray(idx, np.int64)
        if len(idx) == 0:
            return
        extra = int(src.e_klen[idx].sum()) + sum(int(src.acc_i[idx, c + 1].sum()) for c in self.str_slots)
        self.reserve(len(idx), extra)
        copy_entries(src.e_wstart, src.e_koff, src.e_klen, src.e_hash, src.e_bin, src.e_aux, src.e_ts,
                     src.acc_i, src.acc_f, src.arena, idx, self.str_slots,
                     self.slots, self.e_hash, self.e_wstart, self.e_koff, self.e_klen, self.e_bin, self.e_live,
                     self.e_aux, self.e_ts, self.acc_i, self.acc_f, self.arena, self.meta)

    def delete(self, idx: np.ndarray) -> None:
        delete_entries(self.slots, self.e_hash, self.e_live, self.meta, np.asarray(idx, np.int64))

    def select(self, max_wstart: int = np.iinfo(np.int64).max, bin: int = -1, counters: bool = False) -> np.ndarray:
        """Live window entries with start <= ``max_wstart`` (optionally of one ``bin``), in creation order."""
        return live_where(self.e_live, self.e_wstart, self.e_bin, self.n_entries, max_wstart, bin, counters)

    def extract(self, bin: int) -> "KeyTable":
        """Remove and return the entries of ``bin`` (windows and tuple counters) as a new table."""
        idx = self.select(bin=bin, counters=True)
        out = KeyTable(self.n_int, self.n_float, self.str_slots, max(16, len(idx)))
        out.copy_from(self, idx)
        self.delete(idx)
        return out

    def install(self, other: "KeyTable") -> None:
        """Add every entry of ``other`` (from :meth:`extract`) to this table."""
        self.copy_from(other, other.select(counters=True))

    def bins(self) -> np.ndarray:
        """The bins that have live entries."""
        n = self.n_entries
        return np.unique(self.e_bin[:n][self.e_live[:n]])


@njit(nogil=True, cache=True)
def key_hash(kdata, ks, ke):
    return hash_range(kdata, ks, ke)
