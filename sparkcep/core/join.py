"""Windowed join: each input keeps its tuples of the open windows; when the
watermark closes a window instance, the pairs of that instance whose keys are
equal (and for which ``where`` holds) are emitted once.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from numba import njit

from sparkcep.core import columns
from sparkcep.core.evaluate import evaluate
from sparkcep.core.hashing import derive_ids, hash_rows, key_bins, operator_salt
from sparkcep.query.operators import Join
from sparkcep.schema import Schema

BIN = "__bin"


@njit(nogil=True, cache=True)
def hash_join(lhash, loff, ldata, rhash, roff, rdata):
    """Index pairs (l, r) with equal encoded keys, in (l, r) order."""
    nr = len(rhash)
    cap = 1
    while cap < nr * 2:
        cap *= 2
    head = np.full(cap, -1, np.int64)
    nxt = np.full(nr, -1, np.int64)
    mask = np.uint64(cap - 1)
    for r in range(nr - 1, -1, -1):  # prepend in reverse: chains list r ascending
        s = np.int64(rhash[r] & mask)
        nxt[r] = head[s]
        head[s] = r
    li = np.empty(16, np.int64)
    ri = np.empty(16, np.int64)
    m = 0
    for l in range(len(lhash)):
        r = head[np.int64(lhash[l] & mask)]
        while r >= 0:
            if rhash[r] == lhash[l]:
                a0, a1, b0, b1 = loff[l], loff[l + 1], roff[r], roff[r + 1]
                same = a1 - a0 == b1 - b0
                if same:
                    for k in range(a1 - a0):
                        if ldata[a0 + k] != rdata[b0 + k]:
                            same = False
                            break
                if same:
                    if m == len(li):
                        li = np.concatenate((li, np.empty(m, np.int64)))
                        ri = np.concatenate((ri, np.empty(m, np.int64)))
                    li[m] = l
                    ri[m] = r
                    m += 1
            r = nxt[r]
    return li[:m], ri[:m]


@njit(nogil=True, cache=True)
def window_rows(ts, wm, start, size, lateness):
    """Rows of window [start, start+size) that were admitted (not late for it)."""
    out = np.empty(len(ts), np.int64)
    m = 0
    for i in range(len(ts)):
        if start <= ts[i] < start + size and start + size > wm[i] - lateness:
            out[m] = i
            m += 1
    return out[:m]


class WindowJoin:
    """The state of one Join operator instance: the buffered rows of each input."""

    def __init__(self, op: Join, bins: int):
        self.op, self.window = op, op.window
        self.left_keys = [lk for lk, _ in op.on]
        self.right_keys = [rk for _, rk in op.on]
        self.schemas: tuple[Schema, Schema] = (op.inputs[0].schema, op.inputs[1].schema)
        self.bins = bins
        self.buffers: list[list[pa.RecordBatch]] = [[], []]
        self.next_start: int | None = None  # smallest window start that may hold buffered rows
        self.fired = -(2 ** 63)  # every window starting before this has fired: never fire it again
        self.salt = operator_salt(op.name)  # output ids: (operator, window, left id, right id)

    def add(self, port: int, batch: pa.RecordBatch) -> np.ndarray:
        """Buffer a batch of input ``port`` (0 left, 1 right), tagged with each row's bin; returns the
        bins of its late tuples (one per tuple that missed a window)."""
        if batch.num_rows == 0:
            return np.zeros(0, np.int64)
        keys = self.left_keys if port == 0 else self.right_keys
        if keys:
            b = key_bins(*columns.encode_keys(batch, keys), self.bins)
        else:
            b = np.zeros(batch.num_rows, np.int64)
        w = self.window
        ts = batch.column(columns.TS).to_numpy()
        wm = batch.column(columns.WM).to_numpy()
        first_end = ((ts - w.size_us) // w.advance_us + 1) * w.advance_us + w.size_us
        late = b[first_end <= wm - w.lateness_us]
        first = max(int(first_end.min() - w.size_us), self.fired)
        self.next_start = first if self.next_start is None else min(self.next_start, first)
        self.buffers[port].append(batch.append_column(BIN, pa.array(b)))
        return late

    def fire(self, watermark: int | None) -> list[pa.RecordBatch]:
        """Join and emit every window instance closed by ``watermark`` (None: all), then drop dead rows."""
        if self.next_start is None:
            return []
        w = self.window
        limit = None if watermark is None else watermark - w.lateness_us - w.size_us
        if limit is not None and limit < self.next_start:
            # no window closes: the buffers are not gathered (at every advance, that made a long window's
            # rows cost quadratic time); the rows no window reads stay until a fire drops them
            if self.buffers[0] and self.buffers[1]:
                self.fired = max(self.fired, (limit // w.advance_us + 1) * w.advance_us)
            return []
        sides = [pa.Table.from_batches(b).combine_chunks().to_batches() if b else [] for b in self.buffers]
        sides = [s[0] if s else None for s in sides]
        if sides[0] is None or sides[1] is None:
            if watermark is None:
                self.buffers, self.next_start = [[], []], None
            return self._prune(watermark, sides)
        ts = sides[0].column(columns.TS).to_numpy()
        limit = int(ts.max()) if limit is None else limit
        out = []
        for start in _window_starts(ts, w.size_us, w.advance_us):
            if self.next_start <= start <= limit:
                batch = self._join_window(int(start), *sides)
                if batch is not None and batch.num_rows:
                    out.append(batch)
        closed = (limit // w.advance_us + 1) * w.advance_us  # every window starting before this has fired
        self.next_start = max(self.next_start, closed)
        self.fired = max(self.fired, closed)  # from the watermark alone: the same in every instance
        return out + self._prune(watermark, sides)

    def _prune(self, watermark, sides) -> list:
        if watermark is None:
            self.buffers, self.next_start = [[], []], None
            return []
        if self.next_start is None:
            return []
        for port, s in enumerate(sides):
            if s is not None:
                keep = s.column(columns.TS).to_numpy() >= self.next_start
                s = s.filter(pa.array(keep))
                self.buffers[port] = [s] if s.num_rows else []
        return []

    def _join_window(self, start: int, left: pa.RecordBatch, right: pa.RecordBatch):
        w = self.window
        li_all = window_rows(left.column(columns.TS).to_numpy(), left.column(columns.WM).to_numpy(),
                             start, w.size_us, w.lateness_us)
        ri_all = window_rows(right.column(columns.TS).to_numpy(), right.column(columns.WM).to_numpy(),
                             start, w.size_us, w.lateness_us)
        if not len(li_all) or not len(ri_all):
            return None
        lw, rw = columns.take(left, li_all), columns.take(right, ri_all)
        if self.left_keys:
            lw, rw = _non_null_keys(lw, self.left_keys), _non_null_keys(rw, self.right_keys)
            loff, ldata = columns.encode_keys(lw, self.left_keys)
            roff, rdata = columns.encode_keys(rw, self.right_keys)
            li, ri = hash_join(hash_rows(loff, ldata), loff, ldata, hash_rows(roff, rdata), roff, rdata)
        else:
            li = np.repeat(np.arange(lw.num_rows), rw.num_rows)
            ri = np.tile(np.arange(rw.num_rows), lw.num_rows)
        if not len(li):
            return None
        return self._pairs(start, columns.take(lw, li), columns.take(rw, ri))

    def _pairs(self, start: int, l: pa.RecordBatch, r: pa.RecordBatch) -> pa.RecordBatch:
        op, n, end = self.op, l.num_rows, start + self.window.size_us
        cols = {"window_start": pa.array(np.full(n, start), pa.timestamp("us")),
                "window_end": pa.array(np.full(n, end), pa.timestamp("us"))}
        for name, out in op.left_names.items():
            cols[out] = l.column(name)
        for name, out in op.right_names.items():
            cols[out] = r.column(name)
        (lseq, lid), (rseq, rid) = [(side.column(columns.SEQ).to_numpy(), side.column(columns.ID).to_numpy())
                                    for side in (l, r)]
        ids = derive_ids(self.salt, np.full(n, start, np.int64), lseq, lid, rseq, rid)
        ts = np.full(n, end - 1, np.int64)
        cols.update({columns.SEQ: pa.array(np.maximum(lseq, rseq)), columns.ID: pa.array(ids),
                     columns.TS: pa.array(ts), columns.WM: pa.array(ts)})
        batch = pa.RecordBatch.from_pydict(cols)
        if op.where is not None:
            value, ok = evaluate(op.where, batch, op.schema)
            batch = batch.filter(pa.array(value & ok))
        return batch

    def take_bins(self, bins: np.ndarray | None, keep: bool = False) -> list[pa.RecordBatch | None]:
        """Per input, the buffered rows of ``bins`` (None: all) as one batch or None; removed unless ``keep``."""
        taken = []
        for port in (0, 1):
            buffered = self.buffers[port]
            batch = None if not buffered else buffered[0] if len(buffered) == 1 else pa.concat_batches(buffered)
            if batch is not None and bins is not None:
                mine = np.isin(batch.column(BIN).to_numpy(), bins)
                if not keep:
                    rest = batch.filter(pa.array(~mine))
                    self.buffers[port] = [rest] if rest.num_rows else []
                batch = batch.filter(pa.array(mine))
            elif not keep:
                self.buffers[port] = []
            taken.append(batch if batch is not None and batch.num_rows else None)
        return taken

    def put_bins(self, rows: list[pa.RecordBatch | None], fired: int, next_start: int | None) -> None:
        """Buffer rows of bins taken from another instance, whose :attr:`fired` and :attr:`next_start`
        were ``fired`` and ``next_start``.

        Its windows before ``fired`` have fired, with these rows in them:
        this instance never fires them (the later of both ``fired`` counts),
        and no window before it holds a row of its own to emit any more.
        """
        self.fired = max(self.fired, fired)
        if any(b is not None for b in rows):
            self.next_start = next_start if self.next_start is None else min(self.next_start, next_start)
        if self.next_start is not None:
            self.next_start = max(self.next_start, self.fired)
        for port, b in enumerate(rows):
            if b is not None:
                self.buffers[port].append(b)


def _window_starts(ts: np.ndarray, size: int, advance: int) -> np.ndarray:
    """The distinct starts of the windows holding any of the event times ``ts``."""
    last = np.unique((ts // advance) * advance)
    per = (size + advance - 1) // advance
    starts = np.unique((last[:, None] - advance * np.arange(per)[None, :]).ravel())
    return starts


def _non_null_keys(batch: pa.RecordBatch, keys: list[str]) -> pa.RecordBatch:
    """Null never equals anything: rows with a null key take no part in an equi-join."""
    ok = np.ones(batch.num_rows, np.bool_)
    for k in keys:
        if batch.column(k).null_count:
            ok &= batch.column(k).is_valid().to_numpy(zero_copy_only=False)
    return batch if ok.all() else batch.filter(pa.array(ok))
