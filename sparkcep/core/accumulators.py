"""The functions of an aggregate as opcodes over accumulator slots, shared by the windowed
(:mod:`sparkcep.core.aggregate`) and the running (:mod:`sparkcep.core.running`) aggregates.

:class:`Program` turns an aggregate's functions into opcodes, the value
columns they read and the int and float slots each owns in a table entry;
:func:`apply_group` folds a group of rows into their entries, one function at
a time; :meth:`Program.results` turns the slots of entries taken out of the
table into Arrow columns.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from numba import njit

from sparkcep.core import columns
from sparkcep.core.hashing import gather_binned
from sparkcep.core.strings import compare_bytes
from sparkcep.core.table import ACC, ARENA_USED
from sparkcep.query.aggregates import AggFunc
from sparkcep.schema import Schema

(COUNT_ALL, COUNT, SUM_I, SUM_F, MIN_I, MAX_I, MIN_F, MAX_F, MIN_S, MAX_S,
 FIRST, LAST, FIRST_S, LAST_S) = range(14)
# whose result does not depend on the order rows come in: integer sums wrap around, float min/max
# compare in a total order, equal strings are the same bytes (float sums round, first/last break
# ties by order)
ORDER_FREE = (COUNT_ALL, COUNT, SUM_I, MIN_I, MAX_I, MIN_F, MAX_F, MIN_S, MAX_S)
# int slots / float slots each opcode owns
SLOTS = {COUNT_ALL: (1, 0), COUNT: (1, 0), SUM_I: (2, 0), SUM_F: (1, 1), MIN_I: (2, 0), MAX_I: (2, 0),
         MIN_F: (2, 0), MAX_F: (2, 0), MIN_S: (3, 0), MAX_S: (3, 0), FIRST: (4, 0), LAST: (4, 0),
         FIRST_S: (5, 0), LAST_S: (5, 0)}
_MAGNITUDE = 0x7FFF_FFFF_FFFF_FFFF  # the bits of a float64 but its sign
_INF = 0x7FF0_0000_0000_0000  # +inf; magnitudes above it are NaNs
_NAN = 0x7FF8_0000_0000_0000  # the one NaN min/max keep (Java's Double.NaN)


@njit(nogil=True, cache=True, inline="always")
def _later(ts, seq, t0, s0):
    return ts > t0 or (ts == t0 and seq > s0)


@njit(nogil=True, cache=True, inline="always")
def _float_key(bits):
    """The int64 key of the float64 with ``bits``, ordered as Java's ``Double.compare``: -0.0 below
    0.0, every NaN one key above +inf. Its bits come back by :func:`_key_bits`."""
    if (bits & _MAGNITUDE) > _INF:
        bits = _NAN
    return bits ^ (bits >> 63 & _MAGNITUDE)  # negatives: larger magnitudes sort lower


def _key_bits(keys: np.ndarray) -> np.ndarray:
    """The float64 bits of :func:`_float_key` keys (the flip is its own inverse)."""
    return keys ^ (keys >> 63 & _MAGNITUDE)


@njit(nogil=True, cache=True, inline="always")
def apply_group(acc_i, acc_f, arena, meta, rows, bins, entries, k, ts, seq, ops, cols, sis, sfs,
                vals_i, vals_f, valid, soff, slen, sdata):
    """Apply every function of the aggregate to rows ``rows[:k]``, row ``rows[q]`` to entry
    ``entries[q]`` of bin ``bins[q]``, in that order.

    One function at a time over all the rows: the opcode is dispatched once
    per group of rows, and each loop below is the whole per-row work of one
    function. ``acc_i``/``acc_f`` are the entry rows as int64/float64;
    ``sis``/``sfs`` their columns.
    """
    for j in range(len(ops)):
        op, c, si, sf = ops[j], cols[j], sis[j], sfs[j]
        if op == COUNT_ALL:
            for q in range(k):
                acc_i[bins[q], entries[q], si] += 1
        elif op == COUNT:
            for q in range(k):
                acc_i[bins[q], entries[q], si] += valid[c, rows[q]]
        elif op == SUM_I:
            for q in range(k):
                r, b, e = rows[q], bins[q], entries[q]
                if valid[c, r]:
                    acc_i[b, e, si] += vals_i[c, r]
                    acc_i[b, e, si + 1] += 1
        elif op == SUM_F:
            for q in range(k):
                r, b, e = rows[q], bins[q], entries[q]
                if valid[c, r]:
                    acc_f[b, e, sf] += vals_f[c, r]
                    acc_i[b, e, si] += 1
        elif op == MIN_I or op == MAX_I:
            lower = op == MIN_I
            for q in range(k):
                r, b, e = rows[q], bins[q], entries[q]
                if valid[c, r]:
                    v = vals_i[c, r]
                    if acc_i[b, e, si + 1] == 0 or (v < acc_i[b, e, si] if lower else v > acc_i[b, e, si]):
                        acc_i[b, e, si] = v
                    acc_i[b, e, si + 1] += 1
        elif op == MIN_F or op == MAX_F:  # MIN_I/MAX_I over the keys of the values' bits
            lower = op == MIN_F
            for q in range(k):
                r, b, e = rows[q], bins[q], entries[q]
                if valid[c, r]:
                    v = _float_key(vals_i[c, r])
                    if acc_i[b, e, si + 1] == 0 or (v < acc_i[b, e, si] if lower else v > acc_i[b, e, si]):
                        acc_i[b, e, si] = v
                    acc_i[b, e, si + 1] += 1
        elif op == MIN_S or op == MAX_S:
            for q in range(k):
                r, b, e = rows[q], bins[q], entries[q]
                if valid[c, r]:
                    s0, n = soff[c, r], slen[c, r]
                    better = acc_i[b, e, si + 2] == 0
                    if not better:
                        o = acc_i[b, e, si]
                        cmp = compare_bytes(sdata, s0, s0 + n, arena[b], o, o + acc_i[b, e, si + 1])
                        better = cmp < 0 if op == MIN_S else cmp > 0
                    if better:
                        _put_string(acc_i, arena, meta, b, e, si, sdata, s0, n)
                    acc_i[b, e, si + 2] += 1
        elif op == FIRST or op == LAST:
            for q in range(k):
                r, b, e = rows[q], bins[q], entries[q]
                if valid[c, r]:
                    earlier = _later(acc_i[b, e, si], acc_i[b, e, si + 1], ts[r], seq[r])
                    if acc_i[b, e, si + 2] == 0 or (earlier if op == FIRST else not earlier):
                        acc_i[b, e, si] = ts[r]
                        acc_i[b, e, si + 1] = seq[r]
                        acc_i[b, e, si + 2] = 1
                        acc_i[b, e, si + 3] = vals_i[c, r]
        else:  # FIRST_S / LAST_S
            for q in range(k):
                r, b, e = rows[q], bins[q], entries[q]
                if valid[c, r]:
                    earlier = _later(acc_i[b, e, si + 2], acc_i[b, e, si + 3], ts[r], seq[r])
                    if acc_i[b, e, si + 4] == 0 or (earlier if op == FIRST_S else not earlier):
                        _put_string(acc_i, arena, meta, b, e, si, sdata, soff[c, r], slen[c, r])
                        acc_i[b, e, si + 2] = ts[r]
                        acc_i[b, e, si + 3] = seq[r]
                        acc_i[b, e, si + 4] = 1


@njit(nogil=True, cache=True, inline="always")
def _put_string(acc_i, arena, meta, b, e, si, sdata, s0, n):
    o = meta[b, ARENA_USED]
    for k in range(n):
        arena[b, o + k] = sdata[s0 + k]
    meta[b, ARENA_USED] = o + n
    acc_i[b, e, si] = o
    acc_i[b, e, si + 1] = n


_NO_BYTES = np.zeros(1, np.uint8)  # the string bytes of a batch no function reads strings of
_ZEROS = [np.zeros(1 << 16, np.int64)]  # grown on demand: read-only to every kernel


def _zeros(n: int) -> np.ndarray:
    """``n`` int64 zeros (arena bytes a row appends, when no function appends any)."""
    if len(_ZEROS[0]) < n:
        _ZEROS[0] = np.zeros(n, np.int64)
    return _ZEROS[0][:n]


GROUP = 256  # tuples whose entries are updated together, one function at a time


class Program:
    """The opcodes, value columns and slots of an aggregate's functions.

    ``reserved``: int slots kept before the functions' own (a tuple window's largest event time).
    """

    def __init__(self, funcs: dict[str, AggFunc], schema: Schema, reserved: int = 0):
        self.funcs, self.schema = funcs, schema
        self.fields: list[str] = []  # value columns, in column-index order
        ops, cols, sis, sfs, str_slots = [], [], [], [], []
        n_int, n_float = reserved, 0
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
        # per value column: how many string functions copy its values into the arena
        self.string_uses = [sum(1 for op, c in zip(ops, cols) if c == i and op in (MIN_S, MAX_S, FIRST_S, LAST_S))
                            for i in range(len(self.fields))]
        self.reads_floats = SUM_F in ops
        self.reads_strings = any(self.string_uses)
        k = max(1, len(self.fields))
        self._no_floats, self._no_strings = np.zeros((k, 0), np.float64), np.zeros((k, 0), np.int64)
        self.order_free = all(op in ORDER_FREE for op in ops)

    def inputs(self, batch: pa.RecordBatch):
        """(vals_i, vals_f, valid, soff, slen, sdata, rowstr): the value columns as kernel arrays.

        Float and string views have no rows when no function reads them: at
        tens of thousands of rows a batch, filling them cost more than some
        kernels. What does not depend on the batch is made once.
        """
        n, k = batch.num_rows, max(1, len(self.fields))
        vals_i = np.zeros((k, n), np.int64) if not self.fields else np.empty((k, n), np.int64)
        vals_f = np.zeros((k, n), np.float64) if self.reads_floats else self._no_floats
        valid = np.ones((k, n), np.bool_)
        if self.reads_strings:
            soff, slen, rowstr = np.zeros((k, n), np.int64), np.zeros((k, n), np.int64), np.zeros(n, np.int64)
        else:
            soff = slen = self._no_strings
            rowstr = _zeros(n)
        datas, base = [], 0
        for c, f in enumerate(self.fields):
            arr = batch.column(f)
            if self.schema.fields[f] == "string":
                vals_i[c] = 0
                off, data, valid[c] = columns.strings(arr)
                if not self.string_uses[c]:
                    continue
                off = off.astype(np.int64)
                soff[c] = off[:-1] + (base - off[0])
                slen[c] = np.diff(off)
                rowstr += slen[c] * self.string_uses[c]  # arena bytes each window may append
                datas.append(data[off[0]:off[-1]])
                base += int(off[-1] - off[0])
            else:
                if arr.null_count:
                    v, valid[c] = columns.values(arr)
                else:
                    v = (arr.view(pa.int64()) if pa.types.is_timestamp(arr.type) else arr).to_numpy(zero_copy_only=False)
                vals_i[c] = v.astype(np.float64).view(np.int64) if v.dtype.kind == "f" else v  # as bits (min/max: keys)
                if self.reads_floats:  # sums of floats; avg of an int column sums it as float
                    vals_f[c] = v
        sdata = np.concatenate(datas) if datas else _NO_BYTES
        return vals_i, vals_f, valid, soff, slen, sdata, rowstr

    def kernel_args(self):
        """(opcodes, value columns, int slot columns, float slot columns) in the table's entry rows."""
        return (self.ops, self.cols, self.sis + ACC, self.sfs + ACC + self.n_int)

    def results(self, rows: np.ndarray, arena: np.ndarray, b: np.ndarray) -> list[pa.Array]:
        """One Arrow column per function of entries taken from the table (:meth:`BinnedTable.take`)
        of bins ``b``; their string values are still in ``arena``."""
        out = []
        ai, af = rows[ACC:], rows.view(np.float64)[ACC + self.n_int:]
        for j, fn in enumerate(self.funcs.values()):
            op, si, sf = self.ops[j], self.sis[j], self.sfs[j]
            t = self.schema.fields.get(fn.field) if fn.field else None
            if op in (COUNT_ALL, COUNT):
                out.append(pa.array(ai[si], pa.int64()))
            elif op == SUM_I:
                out.append(pa.array(ai[si], pa.int64(), mask=ai[si + 1] == 0))
            elif op == SUM_F:
                cnt = ai[si]
                v = af[sf] / np.maximum(cnt, 1) if fn.kind == "avg" else af[sf]
                out.append(pa.array(v, pa.float64(), mask=cnt == 0))
            elif op in (MIN_I, MAX_I):
                out.append(columns.from_bits(ai[si].view(np.uint64), ai[si + 1] > 0, t))
            elif op in (MIN_F, MAX_F):
                out.append(columns.from_bits(_key_bits(ai[si]).view(np.uint64), ai[si + 1] > 0, t))
            elif op in (FIRST, LAST):
                out.append(columns.from_bits(ai[si + 3].view(np.uint64), ai[si + 2] > 0, t))
            else:  # string min/max/first/last
                has = ai[si + 2] > 0 if op in (MIN_S, MAX_S) else ai[si + 4] > 0
                lens = np.where(has, ai[si + 1], 0)
                off, data = gather_binned(arena, b, ai[si], lens)
                out.append(columns.string_array(off, data, has))
        return out


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
