"""``split_part``: one field of a delimited string, over Arrow offsets + bytes.

Called by :func:`sparkcep.core.evaluate.evaluate` for
:class:`~sparkcep.query.expressions.SplitPart`; its semantics are Spark's
``split_part`` (and Python's ``value.split(delimiter)[part - 1]``): fields
are cut at non-overlapping matches from the left, ``part`` counts from 1
(negative: from the end), a part past the last field is the empty string,
and an empty delimiter leaves the value whole (part 1 or -1).

A one-byte delimiter, the common case (CSV, HiBench's records), is searched
for eight bytes at a time with the has-zero-byte test on
``word ^ delimiter * ONES`` (its lowest flag is exact), and the field is
copied eight bytes at a time into an output with eight bytes of slack.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sparkcep.core.memory import load8, store8, trailing_zeros

ONES = np.uint64(0x0101010101010101)
HIGHS = ONES * np.uint64(0x80)


@njit(nogil=True, cache=True, inline="always")
def _find_byte(data, k, e, sep, pattern):
    """Position of the first ``sep`` byte in ``data[k:e]``, or ``e``."""
    end_words = len(data) - 8  # a word may be loaded at or before this offset
    while k < e:
        if k > end_words:  # the last bytes of the buffer, one at a time
            while k < e and data[k] != sep:
                k += 1
            return k
        x = load8(data, k) ^ pattern
        hit = (x - ONES) & ~x & HIGHS
        if hit:
            return min(k + np.int64(trailing_zeros(hit) >> np.uint64(3)), e)
        k += 8
    return e


@njit(nogil=True, cache=True, inline="always")
def _find(data, k, e, delim, pattern):
    """Position of the first match of ``delim`` (not empty) in ``data[k:e]``, or ``e``."""
    m = len(delim)
    if m == 1:
        return _find_byte(data, k, e, delim[0], pattern)
    for i in range(k, e - m + 1):
        j = 0
        while j < m and data[i + j] == delim[j]:
            j += 1
        if j == m:
            return i
    return e


@njit(nogil=True, cache=True, inline="always")
def _copy(out, d, data, j, k):
    """Copy ``data[j:k]`` to ``out[d:]`` (``out`` has 8 bytes of slack past it)."""
    end_words = len(data) - 8
    for q in range(0, k - j, 8):
        if j + q <= end_words:
            store8(out, d + q, load8(data, j + q))
        else:  # the rest, near the buffer's end
            for t in range(q, k - j):
                out[d + t] = data[j + t]
            break


@njit(nogil=True, cache=True)
def split_part_kernel(offsets, data, delim, part):
    """(offsets, bytes) of field ``part`` of every string ``data[offsets[i]:offsets[i+1]]``."""
    n = len(offsets) - 1
    out_off = np.empty(n + 1, np.int64)
    out_off[0] = 0
    out = np.empty(offsets[n] - offsets[0] + 8, np.uint8)
    m = len(delim)
    pattern = ONES * np.uint64(delim[0] if m else 0)
    d = 0
    for i in range(n):
        s, e = np.int64(offsets[i]), np.int64(offsets[i + 1])
        p = part
        if m == 0:  # not split: the whole value is field 1 (and -1)
            j, k = s, (e if p == 1 or p == -1 else s)
        else:
            if p < 0:  # count the fields, then take the same field from the left
                fields, k = 1, _find(data, s, e, delim, pattern)
                while k < e:
                    fields += 1
                    k = _find(data, k + m, e, delim, pattern)
                p = fields + p + 1
            j, k, q = s, _find(data, s, e, delim, pattern), 1
            while q < p and k < e:
                j = k + m
                k = _find(data, j, e, delim, pattern)
                q += 1
            if q != p:  # fewer fields than that (or p < 1): empty
                j = k = s
        _copy(out, d, data, j, k)
        d += k - j
        out_off[i + 1] = d
    return out_off, out[:d]


def split_part(offsets: np.ndarray, data: np.ndarray, delimiter: str, part: int) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, bytes) of ``split_part(value, delimiter, part)`` of every string of a column."""
    return split_part_kernel(offsets, data, np.frombuffer(delimiter.encode(), np.uint8), part)
