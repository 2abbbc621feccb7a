"""Windowed aggregation: numba kernels over a :class:`~sparkcep.core.table.KeyTable`.

Each function of an aggregate becomes an opcode reading one value column and
owning a few accumulator slots of its entry (window, group). Rows are
processed in source sequence order, so float sums, tuple windows and
first/last ties come out the same in every deployment.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from numba import njit

from sparkcep.core import columns
from sparkcep.core.hashing import hash_rows
from sparkcep.core.strings import compare_bytes
from sparkcep.core.table import COUNTER, KeyTable, find_or_insert
from sparkcep.query.aggregates import AggFunc
from sparkcep.query.windows import TimeWindow, TupleWindow
from sparkcep.schema import TYPES, Schema

(COUNT_ALL, COUNT, SUM_I, SUM_F, MIN_I, MAX_I, MIN_F, MAX_F, MIN_S, MAX_S,
 FIRST, LAST, FIRST_S, LAST_S) = range(14)
# int slots / float slots each opcode owns
SLOTS = {COUNT_ALL: (1, 0), COUNT: (1, 0), SUM_I: (2, 0), SUM_F: (1, 1), MIN_I: (2, 0), MAX_I: (2, 0),
         MIN_F: (1, 1), MAX_F: (1, 1), MIN_S: (3, 0), MAX_S: (3, 0), FIRST: (4, 0), LAST: (4, 0),
         FIRST_S: (5, 0), LAST_S: (5, 0)}


@njit(nogil=True, cache=True, inline="always")
def _later(ts, seq, t0, s0):
    return ts > t0 or (ts == t0 and seq > s0)


@njit(nogil=True, cache=True)
def _update(e, r, ts, seq, ops, cols, sis, sfs, vals_i, vals_f, valid, soff, slen, sdata, acc_i, acc_f, arena, meta):
    for j in range(len(ops)):
        op, c, si, sf = ops[j], cols[j], sis[j], sfs[j]
        if op == COUNT_ALL:
            acc_i[e, si] += 1
            continue
        if not valid[c, r]:
            continue
        if op == COUNT:
            acc_i[e, si] += 1
        elif op == SUM_I:
            acc_i[e, si] += vals_i[c, r]
            acc_i[e, si + 1] += 1
        elif op == SUM_F:
            acc_f[e, sf] += vals_f[c, r]
            acc_i[e, si] += 1
        elif op == MIN_I or op == MAX_I:
            v = vals_i[c, r]
            if acc_i[e, si + 1] == 0 or (v < acc_i[e, si] if op == MIN_I else v > acc_i[e, si]):
                acc_i[e, si] = v
            acc_i[e, si + 1] += 1
        elif op == MIN_F or op == MAX_F:
            v = vals_f[c, r]
            if acc_i[e, si] == 0 or (v < acc_f[e, sf] if op == MIN_F else v > acc_f[e, sf]):
                acc_f[e, sf] = v
            acc_i[e, si] += 1
        elif op == MIN_S or op == MAX_S:
            s0, n = soff[c, r], slen[c, r]
            better = acc_i[e, si + 2] == 0
            if not better:
                o = acc_i[e, si]
                cmp = compare_bytes(sdata, s0, s0 + n, arena, o, o + acc_i[e, si + 1])
                better = cmp < 0 if op == MIN_S else cmp > 0
            if better:
                _put_string(e, si, sdata, s0, n, acc_i, arena, meta)
            acc_i[e, si + 2] += 1
        elif op == FIRST or op == LAST:
            has = acc_i[e, si + 2]
            newer = _later(ts[r], seq[r], acc_i[e, si], acc_i[e, si + 1])
            if has == 0 or (newer if op == LAST else not newer):
                acc_i[e, si] = ts[r]
                acc_i[e, si + 1] = seq[r]
                acc_i[e, si + 2] = 1
                acc_i[e, si + 3] = vals_i[c, r]
        else:  # FIRST_S / LAST_S
            has = acc_i[e, si + 4]
            newer = _later(ts[r], seq[r], acc_i[e, si + 2], acc_i[e, si + 3])
            if has == 0 or (newer if op == LAST_S else not newer):
                _put_string(e, si, sdata, soff[c, r], slen[c, r], acc_i, arena, meta)
                acc_i[e, si + 2] = ts[r]
                acc_i[e, si + 3] = seq[r]
                acc_i[e, si + 4] = 1


@njit(nogil=True, cache=True, inline="always")
def _put_string(e, si, sdata, s0, n, acc_i, arena, meta):
    o = meta[1]
    for k in range(n):
        arena[o + k] = sdata[s0 + k]
    meta[1] = o + n
    acc_i[e, si] = o
    acc_i[e, si + 1] = n


@njit(nogil=True, cache=True, inline="always")
def _full(meta, koff, rowstr, r, nwin, n_entries_cap, arena_cap, n_slots):
    need = nwin * (koff[r + 1] - koff[r] + rowstr[r])
    return (meta[0] + nwin > n_entries_cap or meta[1] + need > arena_cap
            or (meta[2] + meta[3] + nwin) * 10 > n_slots * 7)


@njit(nogil=True, cache=True)
def accumulate_time(r0, khash, koff, kdata, kbin, ts, wm, seq, size, adv, lateness, rowstr,
                    ops, cols, sis, sfs, vals_i, vals_f, valid, soff, slen, sdata,
                    slots, e_hash, e_wstart, e_koff, e_klen, e_bin, e_live, e_aux, e_ts, acc_i, acc_f, arena, meta,
                    late):
    """Add rows ``r0..`` to their time windows; returns the row where it stopped for room (n when done)."""
    n = len(ts)
    nwin = (size + adv - 1) // adv
    for r in range(r0, n):
        if _full(meta, koff, rowstr, r, nwin, len(e_hash), len(arena), len(slots)):
            return r
        t = ts[r]
        limit = wm[r] - lateness
        s = (t // adv) * adv
        missed = False
        while s > t - size:
            if s + size > limit:
                fresh = meta[0]
                e = find_or_insert(slots, e_hash, e_wstart, e_koff, e_klen, e_bin, e_live, arena, meta,
                                   khash[r], s, kdata, koff[r], koff[r + 1], kbin[r])
                if e == fresh or seq[r] > e_aux[e]:
                    e_aux[e] = seq[r]
                _update(e, r, ts, seq, ops, cols, sis, sfs, vals_i, vals_f, valid, soff, slen, sdata,
                        acc_i, acc_f, arena, meta)
            else:
                missed = True
            s -= adv
        late[r] = missed
    return n


@njit(nogil=True, cache=True)
def accumulate_tuples(r0, khash, koff, kdata, kbin, ts, wm, seq, size, adv, rowstr,
                      ops, cols, sis, sfs, vals_i, vals_f, valid, soff, slen, sdata,
                      slots, e_hash, e_wstart, e_koff, e_klen, e_bin, e_live, e_aux, e_ts, acc_i, acc_f, arena, meta,
                      ready, ready_wm, nready):
    """Add rows to their groups' tuple windows; full windows go to ``ready``. Returns the stop row."""
    n = len(ts)
    nwin = (size + adv - 1) // adv + 1
    for r in range(r0, n):
        if _full(meta, koff, rowstr, r, nwin, len(e_hash), len(arena), len(slots)):
            return r
        ks, ke = koff[r], koff[r + 1]
        c = find_or_insert(slots, e_hash, e_wstart, e_koff, e_klen, e_bin, e_live, arena, meta,
                           khash[r], COUNTER, kdata, ks, ke, kbin[r])
        p = e_aux[c]
        e_aux[c] = p + 1
        k = p // adv
        while k >= 0 and k * adv + size > p:
            w = k * adv
            fresh = meta[0]
            e = find_or_insert(slots, e_hash, e_wstart, e_koff, e_klen, e_bin, e_live, arena, meta,
                               khash[r], w, kdata, ks, ke, kbin[r])
            if e == fresh or ts[r] > e_ts[e]:
                e_ts[e] = ts[r]
            if e == fresh or seq[r] > e_aux[e]:
                e_aux[e] = seq[r]
            _update(e, r, ts, seq, ops, cols, sis, sfs, vals_i, vals_f, valid, soff, slen, sdata,
                    acc_i, acc_f, arena, meta)
            if p == w + size - 1:
                ready[nready[0]] = e
                ready_wm[nready[0]] = wm[r]
                nready[0] += 1
            k -= 1
    return n


class Program:
    """The opcodes, value columns and slots of an aggregate's functions."""

    def __init__(self, funcs: dict[str, AggFunc], schema: Schema):
        self.funcs, self.schema = funcs, schema
        self.fields: list[str] = []  # value columns, in column-index order
        ops, cols, sis, sfs, str_slots = [], [], [], [], []
        n_int = n_float = 0
        for fn in funcs.values():
            t = schema.fields.get(fn.field) if fn.field else None
            op = _opcode(fn.kind, t)
            if fn.field and fn.field not in self.fields:
                self.fields.append(fn.field)
            ops.append(op)
            cols.append(self.fields.index(fn.field) if fn.field else 0)
            sis.append(n_int)
            sfs.append(n_float)
            if op in (MIN_S, MAX_S, FIRST_S, LAST_S):
                str_slots.append(n_int)
            ni, nf = SLOTS[op]
            n_int, n_float = n_int + ni, n_float + nf
        self.ops, self.cols = np.array(ops, np.int64), np.array(cols, np.int64)
        self.sis, self.sfs = np.array(sis, np.int64), np.array(sfs, np.int64)
        self.n_int, self.n_float, self.str_slots = n_int, n_float, str_slots
        self.has_strings = bool(str_slots)

    def inputs(self, batch: pa.RecordBatch):
        """(vals_i, vals_f, valid, soff, slen, sdata, rowstr): the value columns as kernel arrays."""
        n, k = batch.num_rows, max(1, len(self.fields))
        vals_i = np.zeros((k, n), np.int64)
        vals_f = np.zeros((k, n), np.float64)
        valid = np.ones((k, n), np.bool_)
        soff = np.zeros((k, n), np.int64)
        slen = np.zeros((k, n), np.int64)
        rowstr = np.zeros(n, np.int64)
        datas, base = [], 0
        for c, f in enumerate(self.fields):
            arr = batch.column(f)
            if self.schema.fields[f] == "string":
                off, data, valid[c] = columns.strings(arr)
                off = off.astype(np.int64)
                soff[c] = off[:-1] + (base - off[0])
                slen[c] = np.diff(off)
                rowstr += slen[c]
                datas.append(data[off[0]:off[-1]])
                base += int(off[-1] - off[0])
            else:
                v, valid[c] = columns.values(arr)
                if v.dtype.kind == "f":
                    vals_f[c] = v
                    vals_i[c] = v.astype(np.float64).view(np.int64)
                else:
                    vals_i[c] = v
                    vals_f[c] = v
        sdata = np.concatenate(datas) if datas else np.zeros(1, np.uint8)
        return vals_i, vals_f, valid, soff, slen, sdata, rowstr

    def results(self, table: KeyTable, idx: np.ndarray) -> list[pa.Array]:
        """One Arrow column per function for entries ``idx``."""
        out = []
        ai, af, arena = table.acc_i[idx], table.acc_f[idx], table.arena
        for j, fn in enumerate(self.funcs.values()):
            op, si, sf = self.ops[j], self.sis[j], self.sfs[j]
            t = self.schema.fields.get(fn.field) if fn.field else None
            if op in (COUNT_ALL, COUNT):
                out.append(pa.array(ai[:, si], pa.int64()))
            elif op == SUM_I:
                out.append(pa.array(ai[:, si], pa.int64(), mask=ai[:, si + 1] == 0))
            elif op == SUM_F:
                cnt = ai[:, si]
                v = af[:, sf] / np.maximum(cnt, 1) if fn.kind == "avg" else af[:, sf]
                out.append(pa.array(v, pa.float64(), mask=cnt == 0))
            elif op in (MIN_I, MAX_I):
                out.append(columns.from_bits(ai[:, si].view(np.uint64), ai[:, si + 1] > 0, t))
            elif op in (MIN_F, MAX_F):
                out.append(pa.array(af[:, sf], mask=ai[:, si] == 0).cast(TYPES[t]))
            elif op in (FIRST, LAST):
                bits = ai[:, si + 3].view(np.uint64)
                out.append(columns.from_bits(bits, ai[:, si + 2] > 0, t))
            else:  # string min/max/first/last
                has = ai[:, si + 2] > 0 if op in (MIN_S, MAX_S) else ai[:, si + 4] > 0
                lens = np.where(has, ai[:, si + 1], 0)
                off, data = _gather(arena, ai[:, si], lens)
                out.append(columns.string_array(off, data, has))
        return out


def _gather(arena, starts, lens):
    from sparkcep.core.hashing import gather_ranges
    return gather_ranges(arena, np.ascontiguousarray(starts), np.ascontiguousarray(lens))


def _opcode(kind: str, t: str | None) -> int:
    if kind == "count":
        return COUNT_ALL if t is None else COUNT
    if kind == "sum":
        return SUM_F if t.startswith("float") else SUM_I
    if kind == "avg":
        return SUM_F
    if kind in ("min", "max"):
        base = {"string": MIN_S}.get(t, MIN_F if t.startswith("float") else MIN_I)
        return base + (1 if kind == "max" else 0)
    if kind in ("first", "last"):
        base = FIRST_S if t == "string" else FIRST
        return base + (1 if kind == "last" else 0)
    raise ValueError(kind)


class WindowAggregate:
    """The state and kernels of one Aggregate operator instance.

    :meth:`add` takes rows in sequence order; :meth:`fire` emits the windows
    that the watermark has closed; :meth:`extract` / :meth:`install` move
    one bin's state.
    """

    def __init__(self, window, by: list[str], funcs: dict[str, AggFunc], schema: Schema,
                 out_schema: Schema, bins: int):
        self.window, self.by, self.schema, self.out_schema = window, by, schema, out_schema
        self.key_fields = {f: schema.fields[f] for f in by}
        self.program = Program(funcs, schema)
        self.table = KeyTable(self.program.n_int, self.program.n_float, self.program.str_slots)
        self.bin_mask = bins - 1
        self.late = 0
        self.tuple_window = isinstance(window, TupleWindow)
        self._ready = np.zeros(0, np.int64)
        self._ready_wm = np.zeros(0, np.int64)

    def route(self, batch: pa.RecordBatch):
        """(key offsets, key bytes, hashes, bins) of a batch."""
        if self.by:
            koff, kdata = columns.encode_keys(batch, self.by)
        else:
            koff, kdata = np.zeros(batch.num_rows + 1, np.int64), np.zeros(1, np.uint8)
        h = hash_rows(koff, kdata)
        return koff, kdata, h, (h & np.uint64(self.bin_mask)).astype(np.int64)

    def add(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        """Add a batch (sorted by sequence number); returns full tuple windows, if any."""
        n = batch.num_rows
        if n == 0:
            return []
        koff, kdata, h, b = self.route(batch)
        ts = batch.column(columns.TS).to_numpy()
        wm = batch.column(columns.WM).to_numpy()
        seq = batch.column(columns.SEQ).to_numpy()
        vals = self.program.inputs(batch)
        rowstr = vals[-1]
        p, t = self.program, self.table
        r = 0
        if self.tuple_window:
            w = self.window
            nwin = (w.size + w.advance - 1) // w.advance + 1
            ready = np.empty(n * nwin, np.int64)
            ready_wm = np.empty(n * nwin, np.int64)
            nready = np.zeros(1, np.int64)
        else:
            late = np.zeros(n, np.bool_)
        while r < n:
            chunk = min(n - r, 4096)
            t.reserve(chunk * 2, int(np.sum(np.diff(koff[r:r + chunk + 1]))) + int(rowstr[r:r + chunk].sum()) * 2)
            t = self.table
            common = (h, koff, kdata, b, ts, wm, seq)
            state = (p.ops, p.cols, p.sis, p.sfs) + vals[:-1] + (
                t.slots, t.e_hash, t.e_wstart, t.e_koff, t.e_klen, t.e_bin, t.e_live, t.e_aux, t.e_ts,
                t.acc_i, t.acc_f, t.arena, t.meta)
            if self.tuple_window:
                r = accumulate_tuples(r, *common, w.size, w.advance, rowstr, *state, ready, ready_wm, nready)
            else:
                w = self.window
                r = accumulate_time(r, *common, w.size_us, w.advance_us, w.lateness_us, rowstr, *state, late)
        if self.tuple_window:
            m = int(nready[0])
            return self._emit(ready[:m], ready_wm[:m]) if m else []
        self.late += int(late.sum())
        return []

    def fire(self, watermark: int | None) -> list[pa.RecordBatch]:
        """Emit and drop the time windows that end at or before ``watermark - lateness`` (None: all)."""
        if self.tuple_window:
            return []
        w = self.window
        limit = np.iinfo(np.int64).max if watermark is None else watermark - w.lateness_us - w.size_us
        idx = self.table.select(max_wstart=limit)
        return self._emit(idx, None) if len(idx) else []

    def _emit(self, idx: np.ndarray, wm: np.ndarray | None) -> list[pa.RecordBatch]:
        t = self.table
        starts = t.e_wstart[idx]
        if self.tuple_window:
            ends = starts + self.window.size
            cols = [pa.array(starts, pa.int64()), pa.array(ends, pa.int64())]
            ts = t.e_ts[idx]
        else:
            ends = starts + self.window.size_us
            cols = [pa.array(starts, pa.timestamp("us")), pa.array(ends, pa.timestamp("us"))]
            ts = ends - 1
            wm = ts
        if self.by:
            cols += columns.decode_keys(t.arena, t.e_koff[idx], t.e_klen[idx], self.key_fields)
        cols += self.program.results(t, idx)
        cols += [pa.array(t.e_aux[idx], pa.int64()), pa.array(ts, pa.int64()), pa.array(wm, pa.int64())]
        names = self.out_schema.names + list(columns.HIDDEN)
        out = pa.RecordBatch.from_arrays(cols, names=names)
        t.delete(idx)
        return [out]

    def extract(self, bin: int) -> KeyTable:
        return self.table.extract(bin)

    def install(self, state: KeyTable) -> None:
        self.table.install(state)
