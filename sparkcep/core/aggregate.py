"""Windowed aggregation: numba kernels over a :class:`~sparkcep.core.table.BinnedTable`.

An entry is a (window, group); its accumulator slots belong to the
aggregate's functions (:mod:`sparkcep.core.accumulators`). Rows are
processed in (sequence number, output id) order, so float sums, tuple windows
and first/last come out the same in every deployment: first/last go by
(event time, sequence number), rows equal in both by that order (the first
of them is first, the last is last).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pyarrow as pa
from numba import njit

from sparkcep.core import columns
from sparkcep.core.accumulators import GROUP, Program, apply_group
from sparkcep.core.hashing import fold, hash_head, key_hashes, operator_salt
from sparkcep.core.table import (ACC, AUX, COUNTER, GOLDEN, K0, K1, KEY, KEY_LEN, WSTART, BinnedTable,
                                  TableBins, find_slot, fullest, key_bytes, lookup, place, room, slot_hash,
                                  stored_hash, touch)
from sparkcep.query.aggregates import AggFunc
from sparkcep.query.windows import TupleWindow
from sparkcep.schema import Schema

_INT64 = np.iinfo(np.int64)
FIRE_ROWS = 32_768  # a fire yields batches of about this many rows
TS_SLOT = ACC  # tuple windows: the int slot before the functions' holds the window's largest event time
AHEAD = 32  # tuples between prefetching a tuple's first slots and finding its entries
SCRATCH = 1 << 20  # (row, window) pairs an add takes at once: a sliding window's rows go in parts


@njit(nogil=True, cache=True)
def accumulate_time(K, ts, wm, seq, size, adv, lateness, P, V, T, miss_r, miss_s, late_rows, insert):
    """Pass 1: add rows to their time windows; returns (misses, late rows).

    A row is late when one of its windows had already fired (the stamp of
    its watermark says so); the late rows go, in order, to ``late_rows``.

    With ``insert`` (no function appends string bytes), a (row, window start)
    pair whose entry does not exist yet gets one here when its bin has room,
    the probe walked again while its lines are in cache; otherwise it goes,
    in order, to ``miss_r``/``miss_s`` for :func:`insert_time`, whose room
    check counts the string bytes. A key's rows are either all added here or
    all deferred (its bin's room only shrinks within a pass), so each entry
    still sees its rows in sequence order. Deferring every new entry cost a
    probe from memory in each pass: 100 ms windows of HiBench records in
    5K-row batches, where 6 rows in 10 start an entry, went 9.0 -> 10.0 M
    rows/s inserting here, 10 s windows (1 in 10) 21.0 -> 21.5.
    One pass over the rows: row ``r + AHEAD``'s first slots are prefetched
    (:func:`~sparkcep.core.table.touch`) as row ``r``'s entries are found,
    and :func:`~sparkcep.core.accumulators.apply_group` updates them
    ``GROUP`` at a time. (Prefetching a group of rows, then finding their
    entries in a second loop, took 13 ns a row where this takes 8.5 with the
    table in cache, 21-27 where this takes 15-17 with HiBench's 100K keys.)
    """
    khash, kw0, kw1, koff, kdata, kbin = K
    ops, cols, sis, sfs = P
    vals_i, vals_f, valid, soff, slen, sdata = V
    ent, entf, arena, meta = T
    m = late = k = 0
    n = len(ts)
    nwin = (size + adv - 1) // adv
    cap = GROUP * nwin if nwin <= 16 else max(GROUP * 16, nwin)  # updates buffered: a group of rows'
    rows, bins, entries = np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64)
    full = cap - nwin  # buffered updates beyond which the next row's might not fit
    lo = hi = plo = phi = 0  # [lo, hi): event times whose last window starts at lo, for rows r and r + AHEAD
    for r in range(-AHEAD, n):
        p = r + AHEAD
        if p < n:
            t = ts[p]
            if t < plo or t >= phi:  # an integer division only when the time leaves the current step
                plo = (t // adv) * adv
                phi = plo + adv
            touch(ent, kbin[p], slot_hash(khash[p], plo))
        if r < 0:
            continue
        b = kbin[r]
        t = ts[r]
        if t < lo or t >= hi:
            lo = (t // adv) * adv
            hi = lo + adv
        limit = wm[r] - lateness
        s = lo
        missed = False
        while s > t - size:
            if s + size > limit:
                ks = koff[r]
                klen = koff[r + 1] - ks
                hw = slot_hash(khash[r], s)
                e = lookup(ent, arena, b, hw, s, kw0[r], kw1[r], kdata, ks, klen)
                if e < 0 and insert and room(ent, arena, meta, b, 1, key_bytes(klen)):
                    e, i = find_slot(ent, arena, b, hw, s, kw0[r], kw1[r], kdata, ks, klen)  # its lines are in cache now
                    e = place(ent, arena, meta, b, i, kw0[r], kw1[r], s, kdata, ks, klen)
                if e >= 0:
                    if seq[r] > ent[b, e, AUX]:
                        ent[b, e, AUX] = seq[r]
                    rows[k], bins[k], entries[k] = r, b, e
                    k += 1
                else:
                    miss_r[m] = r
                    miss_s[m] = s
                    m += 1
            else:
                missed = True
            s -= adv
        if missed:
            late_rows[late] = r
            late += 1
        if k > full or r == n - 1:
            apply_group(ent, entf, arena, meta, rows, bins, entries, k, ts, seq, ops, cols, sis, sfs,
                   vals_i, vals_f, valid, soff, slen, sdata)
            k = 0
    return m, late


@njit(nogil=True, cache=True)
def insert_time(pos, m, miss_r, miss_s, K, ts, seq, rowstr, P, V, T):
    """Pass 2: the deferred (row, window start) pairs, inserting entries, prefetched and applied as in
    pass 1; returns where it stopped for room.

    A row's values are applied with its group's, so the room a row is
    checked for includes the string bytes of the rows before it in the
    group (any bin: a bound, not a count); when that bound fails, those
    rows are applied first and the row is checked alone.
    """
    khash, kw0, kw1, koff, kdata, kbin = K
    ops, cols, sis, sfs = P
    vals_i, vals_f, valid, soff, slen, sdata = V
    ent, entf, arena, meta = T
    rows, bins, entries = np.empty(GROUP, np.int64), np.empty(GROUP, np.int64), np.empty(GROUP, np.int64)
    k = pending = 0
    for q in range(pos - AHEAD, m):
        p = q + AHEAD
        if pos <= p < m:
            touch(ent, kbin[miss_r[p]], slot_hash(khash[miss_r[p]], miss_s[p]))
        if q < pos:
            continue
        r, s = miss_r[q], miss_s[q]
        b = kbin[r]
        ks, klen = koff[r], koff[r + 1] - koff[r]
        need = key_bytes(klen) + rowstr[r]
        if not room(ent, arena, meta, b, 1, need + pending):
            apply_group(ent, entf, arena, meta, rows, bins, entries, k, ts, seq, ops, cols, sis, sfs,
                   vals_i, vals_f, valid, soff, slen, sdata)
            k = pending = 0
            if not room(ent, arena, meta, b, 1, need):
                return q
        e, i = find_slot(ent, arena, b, slot_hash(khash[r], s), s, kw0[r], kw1[r], kdata, ks, klen)
        if e < 0:
            e = place(ent, arena, meta, b, i, kw0[r], kw1[r], s, kdata, ks, klen)
        if seq[r] > ent[b, e, AUX]:
            ent[b, e, AUX] = seq[r]
        rows[k], bins[k], entries[k] = r, b, e
        k += 1
        pending += rowstr[r]
        if k == GROUP or q == m - 1:
            apply_group(ent, entf, arena, meta, rows, bins, entries, k, ts, seq, ops, cols, sis, sfs,
                   vals_i, vals_f, valid, soff, slen, sdata)
            k = pending = 0
    return m


@njit(nogil=True, cache=True)
def accumulate_tuples(pos, K, ts, wm, seq, size, adv, rowstr, P, V, T, ready_b, ready_e, ready_wm, nready):
    """Add rows to their groups' tuple windows; full windows go to ``ready``. Returns the stop position.

    A window's largest event time is kept in its int slot 0 (``TS_SLOT``).
    """
    khash, kw0, kw1, koff, kdata, kbin = K
    ops, cols, sis, sfs = P
    vals_i, vals_f, valid, soff, slen, sdata = V
    ent, entf, arena, meta = T
    n = len(ts)
    nwin = (size + adv - 1) // adv + 1
    rows, bins, entries = np.empty(nwin, np.int64), np.empty(nwin, np.int64), np.empty(nwin, np.int64)
    for r in range(pos, n):
        b = kbin[r]
        ks, ke = koff[r], koff[r + 1]
        if not room(ent, arena, meta, b, nwin, nwin * (key_bytes(ke - ks) + rowstr[r])):
            return r
        c, i = find_slot(ent, arena, b, slot_hash(khash[r], COUNTER), COUNTER, kw0[r], kw1[r], kdata, ks, ke - ks)
        if c < 0:
            c = place(ent, arena, meta, b, i, kw0[r], kw1[r], COUNTER, kdata, ks, ke - ks)
        q = ent[b, c, AUX]
        ent[b, c, AUX] = q + 1
        k = q // adv
        j = 0
        while k >= 0 and k * adv + size > q:
            w = k * adv
            e, i = find_slot(ent, arena, b, slot_hash(khash[r], w), w, kw0[r], kw1[r], kdata, ks, ke - ks)
            if e < 0:
                e = place(ent, arena, meta, b, i, kw0[r], kw1[r], w, kdata, ks, ke - ks)
                ent[b, e, TS_SLOT] = ts[r]
            elif ts[r] > ent[b, e, TS_SLOT]:
                ent[b, e, TS_SLOT] = ts[r]
            if seq[r] > ent[b, e, AUX]:
                ent[b, e, AUX] = seq[r]
            rows[j], bins[j], entries[j] = r, b, e
            j += 1
            k -= 1
        apply_group(ent, entf, arena, meta, rows, bins, entries, j, ts, seq, ops, cols, sis, sfs,
               vals_i, vals_f, valid, soff, slen, sdata)
        for i in range(j):  # the windows this row filled
            if q == ent[b, entries[i], WSTART] + size - 1:
                m = nready[0]
                ready_b[m] = b
                ready_e[m] = entries[i]
                ready_wm[m] = wm[r]
                nready[0] = m + 1
    return n


@njit(nogil=True, cache=True)
def window_ids(salt, keys, w0, w1, starts, arena, bins):
    """Output ids of the window entries taken out of ``bins`` (their KEY, K0, K1 and WSTART columns):
    ``salt`` folded with the window start, then the key's hash (:mod:`sparkcep.core.ids`), the hash
    from the stored key words (the arena's bytes past 16). Hashing the keys' bytes again and stacking
    the parts for :func:`~sparkcep.core.hashing.derive_ids` took a quarter of a 31K-row fire.

    Columns, not the (columns, n) block: a block holding only some of its entries is not contiguous,
    and numba compiled a second kernel for it at the first fire that left entries in the table
    (0.85 s on a fresh machine, 4 ms to load from the cache in every new process).

    The salt is folded with each start once per run of entries of that start, and a bin's arena row
    is taken only for a key longer than 16 bytes: 0.234 -> 0.166 ms for a fire of 39K entries."""
    n = len(keys)
    out = np.empty(n, np.int64)
    start, head = 0, fold(salt, 0)  # the salt folded with the window start, for runs of one start
    for j in range(n):
        if starts[j] != start:
            start, head = starts[j], fold(salt, starts[j])
        n_bytes = keys[j] & KEY_LEN  # a key of up to 16 bytes is all in its words
        h = hash_head(np.uint64(w0[j]), np.uint64(w1[j]), n_bytes) if n_bytes <= 16 else \
            stored_hash(keys[j], w0[j], w1[j], arena[bins[j]])
        out[j] = np.int64(fold(head, h))
    return out


class WindowAggregate:
    """The state and kernels of one Aggregate operator instance.

    :meth:`add` takes rows in (sequence number, id) order; :meth:`fire` emits the windows
    the watermark has closed; :meth:`take_bins` / :meth:`copy_bins` /
    :meth:`put_bins` move bins' state.
    """

    def __init__(self, window, by: list[str], funcs: dict[str, AggFunc], schema: Schema,
                 out_schema: Schema, bins: int, name: str = ""):
        self.window, self.by, self.schema, self.out_schema = window, by, schema, out_schema
        self.salt = operator_salt(name)  # output ids: (operator, window start, key)
        self.key_fields = {f: schema.fields[f] for f in by}
        self.tuple_window = isinstance(window, TupleWindow)
        self.program = Program(funcs, schema, reserved=1 if self.tuple_window else 0)
        p = self.program
        self.table = BinnedTable(bins, p.n_int, p.n_float, p.str_slots)
        self.bins = bins
        self.late_rows = np.empty(0, np.int64)  # rows of the last batch added that were late
        self.lowest_start = None  # no open window starts before this (time windows)
        # rows may be added in any order: the windows come out the same (the largest sequence
        # number of a window, its output __seq, is a maximum too)
        self.order_free = not self.tuple_window and self.program.order_free

    def route(self, batch: pa.RecordBatch):
        """(hashes, key words, key offsets, key bytes, bins) of a batch: the kernels' ``K``."""
        if self.by:
            koff, kdata = columns.encode_keys(batch, self.by)
        else:
            koff, kdata = np.zeros(batch.num_rows + 1, np.int64), np.zeros(1, np.uint8)
        h, w0, w1, b = key_hashes(koff, kdata, self.bins)
        return h, w0, w1, koff, kdata, b

    def add(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        """Add a batch sorted by (sequence number, id) (in any order when :attr:`order_free`); returns
        the tuple windows it filled."""
        n = batch.num_rows
        if n == 0:
            return []
        w = self.window
        per_row = -(-w.size // w.advance) + 1 if self.tuple_window else -(-w.size_us // w.advance_us)
        if n * per_row > SCRATCH:
            return self._add_in_parts(batch, max(1, SCRATCH // per_row))
        self.table.sweep()  # what the last fire left: its close did not wait for it
        K = self.route(batch)
        ts = batch.column(columns.TS).to_numpy()
        wm = batch.column(columns.WM).to_numpy()
        seq = batch.column(columns.SEQ).to_numpy()
        *V, rowstr = self.program.inputs(batch)
        P, V = self.program.kernel_args(), tuple(V)
        pos = 0
        if self.tuple_window:
            cap = n * ((w.size + w.advance - 1) // w.advance + 1)
            ready_b, ready_e, ready_wm = np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64)
            nready = np.zeros(1, np.int64)
            out = []
            while pos < n:
                pos = accumulate_tuples(pos, K, ts, wm, seq, w.size, w.advance, rowstr, P, V,
                                        self.table.kernel_state(), ready_b, ready_e, ready_wm, nready)
                m = int(nready[0])
                if m:  # emit before growing: a rebuild renumbers entries, the ready list would go stale
                    out += self._emit(ready_b[:m], *self.table.take(ready_b[:m], ready_e[:m]), ready_wm[:m])
                    nready[0] = 0
                if pos < n:
                    need = self._tuple_entries(K, pos)
                    self.table.grow_for(need, need, K[3], int(rowstr.max()))
            return out
        nwin = (w.size_us + w.advance_us - 1) // w.advance_us
        miss_r, miss_s = np.empty(n * nwin, np.int64), np.empty(n * nwin, np.int64)
        if self.program.reads_strings and rowstr.any():  # pass 1 does not check room: a string
            need = rowstr * nwin                            # min/max/first/last may append its value at every hit
            rows = self.table.rows_to_reserve(K[5], need)
            if rows < n:
                return self._add_in_parts(batch, rows)
            self.table.reserve(K[5], need)
        late_rows = np.empty(n, np.int64)
        m, late = accumulate_time(K, ts, wm, seq, w.size_us, w.advance_us, w.lateness_us, P, V,
                                  self.table.kernel_state(), miss_r, miss_s, late_rows, not self.program.reads_strings)
        self.late_rows = late_rows[:late]
        while pos < m:
            pos = insert_time(pos, m, miss_r, miss_s, K, ts, seq, rowstr, P, V, self.table.kernel_state())
            if pos < m:  # a row's windows and the rows of its key share entries: count each once
                rows, starts = miss_r[pos:m], miss_s[pos:m]
                entries = (K[0][rows] ^ (starts.view(np.uint64) * GOLDEN)).view(np.int64)
                self.table.grow_for(fullest(K[5][rows], entries), fullest(K[5][rows]) // 2, K[3], int(rowstr.max()))
        first = int(((ts.min() - w.size_us) // w.advance_us + 1) * w.advance_us)
        self.lowest_start = first if self.lowest_start is None else min(self.lowest_start, first)
        return []

    def _tuple_entries(self, K, pos: int) -> int:
        """Entries the rows from ``pos`` on may make in the fullest bin (tuple windows): per key, a window
        every ``advance`` of its rows, the windows its next row's room is checked for, and its counter."""
        w = self.window
        _, first, rows = np.unique(K[0][pos:], return_index=True, return_counts=True)
        return fullest(K[5][pos:][first], weights=rows // w.advance + -(-w.size // w.advance) + 2)

    def _add_in_parts(self, batch: pa.RecordBatch, rows: int) -> list[pa.RecordBatch]:
        """:meth:`add` ``rows`` rows at a time, so that its scratch (rows x windows a row) stays bounded."""
        out, late = [], []
        for start in range(0, batch.num_rows, rows):
            out += self.add(batch.slice(start, rows))
            late.append(self.late_rows + start)
        self.late_rows = np.concatenate(late)
        return out

    def fire(self, watermark: int | None) -> Iterator[pa.RecordBatch]:
        """Emit and drop the time windows ending at or before ``watermark - lateness`` (None: all).

        Yields one batch per range of bins holding about ``FIRE_ROWS`` entries,
        so the first rows leave while the rest are taken out; consume it whole.
        The ranges are counted over the bins holding entries: an instance owns
        only some of the bins.
        """
        if self.tuple_window or self.lowest_start is None:
            return
        w = self.window
        if watermark is None:
            limit = np.iinfo(np.int64).max
        else:
            limit = watermark - w.lateness_us - w.size_us
            if limit < self.lowest_start:
                return
        self.lowest_start = None if watermark is None else (limit // w.advance_us + 1) * w.advance_us
        live = self.table.bins()
        ranges = max(1, round(self.table.n_live / FIRE_ROWS))  # no short last range: each costs ~0.1 ms
        step = max(1, -(-len(live) // ranges))
        for i in range(0, len(live), step):
            lo, hi = live[i], live[min(i + step, len(live)) - 1] + 1
            b, rows, koff, kdata = self.table.take_expired(limit, lo, hi)
            if len(b):
                yield from self._emit(b, rows, koff, kdata, None)

    def open_after_fire(self, ts: np.ndarray, watermark: int) -> np.ndarray:
        """For each event time of ``ts``: whether every window holding it stays open after ``fire(watermark)``."""
        if self.tuple_window:
            return np.zeros(len(ts), np.bool_)
        w = self.window
        # fire() takes the windows starting at or before ``limit``; the first window holding ts starts after
        # it exactly when ts >= first: one comparison a row (the start of each row's first window took 6x as long)
        limit = watermark - w.lateness_us - w.size_us
        first = (limit // w.advance_us) * w.advance_us + w.size_us
        return ts >= max(first, _INT64.min) if first <= _INT64.max else np.zeros(len(ts), np.bool_)

    def _emit(self, b: np.ndarray, rows: np.ndarray, koff: np.ndarray, kdata: np.ndarray,
              wm: np.ndarray | None) -> list[pa.RecordBatch]:
        """Output rows of entries taken out of bins ``b`` (columns ``rows``, keys ``koff``/``kdata``)."""
        starts = rows[WSTART]
        if self.tuple_window:
            ends = starts + self.window.size
            cols = [pa.array(starts, pa.int64()), pa.array(ends, pa.int64())]
            ts = rows[TS_SLOT]
        else:
            ends = starts + self.window.size_us
            cols = [pa.array(starts, pa.timestamp("us")), pa.array(ends, pa.timestamp("us"))]
            ts = ends - 1
            wm = ts
        if self.by:
            cols += columns.decode_keys(koff, kdata, self.key_fields)
        cols += self.program.results(rows, self.table.arena, b)
        ids = window_ids(self.salt, rows[KEY], rows[K0], rows[K1], starts, self.table.arena, b)
        cols += [pa.array(rows[AUX], pa.int64()), pa.array(ids), pa.array(ts, pa.int64()), pa.array(wm, pa.int64())]
        return [pa.RecordBatch.from_arrays(cols, names=self.out_schema.names + list(columns.HIDDEN))]

    def take_bins(self, bins: np.ndarray | None) -> TableBins:
        """Remove and return the windows (and tuple counters) of ``bins`` (None: all)."""
        return self.table.take_bins(bins)

    def copy_bins(self, bins: np.ndarray | None) -> TableBins:
        """The windows (and tuple counters) of ``bins`` (None: all), this instance unchanged."""
        return self.table.copy_bins(bins)

    def put_bins(self, part: TableBins, lowest_start: int | None) -> None:
        """Install bins taken from another instance, whose :attr:`lowest_start` was ``lowest_start``."""
        self.table.put_bins(part)
        if lowest_start is not None:
            self.lowest_start = lowest_start if self.lowest_start is None else min(self.lowest_start, lowest_start)
