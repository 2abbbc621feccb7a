"""Running aggregation (:class:`~sparkcep.query.running.Running`): numba kernels over a
:class:`~sparkcep.core.table.BinnedTable` holding one entry per group, never expired.

The functions are the windowed aggregate's (:class:`~sparkcep.core.accumulators.Program`
and its kernel ``apply_group``), applied in sequence order, so every deployment
computes the same values. Between batches, an entry's ``AUX`` column holds the
sequence number of the last tuple it took (-1 before its first). While a batch
is consumed, it holds ``-2 - r`` for the batch's last row ``r`` of the group so
far, so the first touch of an entry in a batch is seen (``AUX >= -1``) and lists
it once; :func:`updates` restores the sequence numbers.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pyarrow as pa
from numba import njit

from sparkcep.core import columns
from sparkcep.core.accumulators import COUNT_ALL, GROUP, Program, apply_group
from sparkcep.core.hashing import derive_ids, fold_in, key_hashes, operator_salt
from sparkcep.core.table import (ACC, AUX, BinnedTable, TableBins, find_slot, fullest, key_bytes, lookup, place,
                                  room, slot_hash, touch)
from sparkcep.query.aggregates import AggFunc
from sparkcep.schema import Schema

LINE = 8  # int64 columns in a cache line: entry rows are padded to whole lines


@njit(nogil=True, cache=True, inline="always")
def _take_row(ent, b, e, r, touched_b, touched_e, nt):
    """Mark entry ``e`` of bin ``b`` as updated by row ``r``; returns how many entries the batch
    has touched (a first touch lists the entry)."""
    if ent[b, e, AUX] >= -1:
        touched_b[nt] = b
        touched_e[nt] = e
        nt += 1
    ent[b, e, AUX] = -2 - r
    return nt


@njit(nogil=True, cache=True)
def accumulate_known(K, ts, seq, P, V, T, count_at, lo, hi, misses, touched_b, touched_e, nt):
    """Pass 1 over rows ``lo:hi``: apply the rows whose group has an entry, GROUP rows at a time (their
    first probes prefetched); the rows of new groups go, in order, to ``misses``. Returns (misses,
    entries touched).

    A group is new for all its rows of the batch or for none, so each group's
    rows are applied in sequence order whichever pass takes them. ``count_at``
    >= 0: the aggregate is a lone ``count()`` kept in that column, counted
    here rather than through ``apply_group`` (a quarter faster: wordcount's shape).
    """
    khash, kw0, kw1, koff, kdata, kbin = K
    ops, cols, sis, sfs = P
    vals_i, vals_f, valid, soff, slen, sdata = V
    ent, entf, arena, meta = T
    rows, bins, entries = np.empty(GROUP, np.int64), np.empty(GROUP, np.int64), np.empty(GROUP, np.int64)
    first = np.empty(GROUP, np.int64)
    m = 0
    for g in range(lo, hi, GROUP):
        ge = min(hi, g + GROUP)
        for r in range(g, ge):
            first[r - g] = slot_hash(khash[r], 0)
            touch(ent, kbin[r], first[r - g])
        k = 0
        for r in range(g, ge):
            b, ks = kbin[r], koff[r]
            e = lookup(ent, arena, b, first[r - g], 0, kw0[r], kw1[r], kdata, ks, koff[r + 1] - ks)
            if e >= 0:
                nt = _take_row(ent, b, e, r, touched_b, touched_e, nt)
                if count_at >= 0:
                    ent[b, e, count_at] += 1
                else:
                    rows[k], bins[k], entries[k] = r, b, e
                    k += 1
            else:
                misses[m] = r
                m += 1
        apply_group(ent, entf, arena, meta, rows, bins, entries, k, ts, seq, ops, cols, sis, sfs,
               vals_i, vals_f, valid, soff, slen, sdata)
    return m, nt


@njit(nogil=True, cache=True)
def insert_new(pos, m, misses, K, ts, seq, rowstr, P, V, T, count_at, touched_b, touched_e, nt):
    """Pass 2: the missed rows, inserting their groups, GROUP rows at a time; returns (where it
    stopped for room, entries touched).

    A row is checked for room together with the string bytes of the rows
    before it in the group (as :func:`~sparkcep.core.aggregate.insert_time`).
    """
    khash, kw0, kw1, koff, kdata, kbin = K
    ops, cols, sis, sfs = P
    vals_i, vals_f, valid, soff, slen, sdata = V
    ent, entf, arena, meta = T
    rows, bins, entries = np.empty(GROUP, np.int64), np.empty(GROUP, np.int64), np.empty(GROUP, np.int64)
    for g in range(pos, m, GROUP):
        ge = min(m, g + GROUP)
        k = pending = 0
        for q in range(g, ge):
            r = misses[q]
            b = kbin[r]
            ks, klen = koff[r], koff[r + 1] - koff[r]
            need = key_bytes(klen) + rowstr[r]
            if not room(ent, arena, meta, b, 1, need + pending):
                apply_group(ent, entf, arena, meta, rows, bins, entries, k, ts, seq, ops, cols, sis, sfs,
                       vals_i, vals_f, valid, soff, slen, sdata)
                k = pending = 0
                if not room(ent, arena, meta, b, 1, need):
                    return q, nt
            e, i = find_slot(ent, arena, b, slot_hash(khash[r], 0), 0, kw0[r], kw1[r], kdata, ks, klen)
            if e < 0:
                e = place(ent, arena, meta, b, i, kw0[r], kw1[r], 0, kdata, ks, klen)
                ent[b, e, AUX] = -1
            nt = _take_row(ent, b, e, r, touched_b, touched_e, nt)
            if count_at >= 0:
                ent[b, e, count_at] += 1
                continue
            rows[k], bins[k], entries[k] = r, b, e
            k += 1
            pending += rowstr[r]
        apply_group(ent, entf, arena, meta, rows, bins, entries, k, ts, seq, ops, cols, sis, sfs,
               vals_i, vals_f, valid, soff, slen, sdata)
    return m, nt


@njit(nogil=True, cache=True)
def locate(T, K, touched_b, touched_e, last_row, nt):
    """After a rebuild renumbered the entries: the entry of each touched group, found again from
    its last row (read before the rebuild)."""
    khash, kw0, kw1, koff, kdata, kbin = K
    ent, arena, meta = T
    for t in range(nt):
        r = last_row[t]
        ks = koff[r]
        touched_e[t] = lookup(ent, arena, touched_b[t], slot_hash(khash[r], 0), 0, kw0[r], kw1[r], kdata, ks,
                              koff[r + 1] - ks)


@njit(nogil=True, cache=True)
def updates(ent, touched_b, touched_e, nt, seq, wanted):
    """The touched entries in the order of their last row (a counting sort over the batch's rows):
    (last rows, bins, entry columns as a (columns, nt) array, only the ``wanted`` ones filled);
    restores their ``AUX``."""
    at = np.full(len(seq), -1, np.int64)
    for t in range(nt):
        b, e = touched_b[t], touched_e[t]
        r = -2 - ent[b, e, AUX]
        at[r] = t
        ent[b, e, AUX] = seq[r]
    last, bins = np.empty(nt, np.int64), np.empty(nt, np.int64)
    out = np.empty((ent.shape[2], nt), np.int64)
    j = 0
    for r in range(len(seq)):
        t = at[r]
        if t >= 0:
            b, e = touched_b[t], touched_e[t]
            last[j], bins[j] = r, b
            for c in wanted:
                out[c, j] = ent[b, e, c]
            j += 1
    return last, bins, out


class RunningAggregate:
    """The state and kernels of one running aggregate instance.

    :meth:`add` takes each consumed batch (sorted by sequence number) and
    returns its updates; :meth:`fire` has nothing to emit;
    :meth:`take_bins` / :meth:`copy_bins` / :meth:`put_bins` move bins' groups.
    """


    def __init__(self, window, by: list[str], funcs: dict[str, AggFunc], schema: Schema,
                 out_schema: Schema, bins: int, name: str = ""):
        self.by, self.out_schema, self.bins = by, out_schema, bins
        self.salt = operator_salt(name)  # output ids: (operator, the update's step, key)
        unpadded = Program(funcs, schema)
        pad = -(ACC + unpadded.n_int + unpadded.n_float) % LINE  # a probe touches one line, not two
        self.program = p = Program(funcs, schema, reserved=pad)
        self.table = BinnedTable(bins, p.n_int, p.n_float, p.str_slots)
        self.count_at = ACC + int(p.sis[0]) if p.ops.tolist() == [COUNT_ALL] else -1
        self.wanted = np.array([AUX] + list(range(ACC + pad, self.table.ent.shape[2])), np.int64)  # not the key

    def route(self, batch: pa.RecordBatch):
        """(hashes, key words, key offsets, key bytes, bins) of a batch: the kernels' ``K``."""
        if self.by:
            koff, kdata = columns.encode_keys(batch, self.by)
        else:
            koff, kdata = np.zeros(batch.num_rows + 1, np.int64), np.zeros(1, np.uint8)
        h, w0, w1, b = key_hashes(koff, kdata, self.bins)
        return h, w0, w1, koff, kdata, b

    def add(self, batch: pa.RecordBatch, step: tuple[int, int] = (0, 0)) -> list[pa.RecordBatch]:
        """Aggregate a batch; returns one row per group it held, with the group's values so far.
        ``step``: the advance consuming it (:class:`~sparkcep.core.operators.StatefulOp`), for the rows' ids."""
        n = batch.num_rows
        if n == 0:
            return []
        K = self.route(batch)
        ts, seq = batch.column(columns.TS).to_numpy(), batch.column(columns.SEQ).to_numpy()
        *V, rowstr = self.program.inputs(batch)
        P, V, table = self.program.kernel_args(), tuple(V), self.table
        misses, touched_b, touched_e = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
        lo = nt = 0
        while lo < n:  # in parts when long strings would widen every arena too far (rows_to_reserve)
            hi = n
            if rowstr.any():  # pass 1 does not check room: a string min/max/first/last may append at every hit
                hi = lo + table.rows_to_reserve(K[5][lo:], rowstr[lo:])
                with self._renumbering(K, touched_b, touched_e, nt):
                    table.reserve(K[5][lo:hi], rowstr[lo:hi])
            m, nt = accumulate_known(K, ts, seq, P, V, table.kernel_state(), self.count_at, lo, hi, misses,
                                     touched_b, touched_e, nt)
            pos = 0
            while pos < m:
                pos, nt = insert_new(pos, m, misses, K, ts, seq, rowstr, P, V, table.kernel_state(),
                                     self.count_at, touched_b, touched_e, nt)
                if pos < m:
                    need = fullest(K[5][misses[pos:m]]) // 2  # a batch repeats keys: half of the rows
                    with self._renumbering(K, touched_b, touched_e, nt):
                        table.grow_for(need, need, K[3], int(rowstr.max()))
            lo = hi
        last, b, rows = updates(table.ent, touched_b, touched_e, nt, seq, self.wanted)
        cols = [columns.take(batch.column(f), last) for f in self.by]
        cols += self.program.results(rows, table.arena, b)
        cols += [pa.array(rows[AUX], pa.int64()), pa.array(derive_ids(fold_in(self.salt, *step), K[0][last])),
                 pa.array(ts[last], pa.int64()),
                 pa.array(batch.column(columns.WM).to_numpy()[last], pa.int64())]
        return [pa.RecordBatch.from_arrays(cols, names=self.out_schema.names + list(columns.HIDDEN))]

    @contextmanager
    def _renumbering(self, K, touched_b: np.ndarray, touched_e: np.ndarray, nt: int):
        """Around a call that may rebuild the table, renumbering its entries: finds the ``nt`` entries
        the batch has touched again, from their last rows."""
        last_row = -2 - self.table.ent[touched_b[:nt], touched_e[:nt], AUX]
        yield
        locate(self.table.arrays, K, touched_b, touched_e, last_row, nt)

    def fire(self, watermark: int | None) -> list[pa.RecordBatch]:
        """Nothing: every row left with the batch that updated it."""
        return []

    def take_bins(self, bins: np.ndarray | None) -> TableBins:
        """Remove and return the groups of ``bins`` (None: all)."""
        return self.table.take_bins(bins)

    def copy_bins(self, bins: np.ndarray | None) -> TableBins:
        """The groups of ``bins`` (None: all), this instance unchanged."""
        return self.table.copy_bins(bins)

    def put_bins(self, part: TableBins) -> None:
        """Install the groups of bins taken from another instance."""
        self.table.put_bins(part)
