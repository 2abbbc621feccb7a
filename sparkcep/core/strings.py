"""Numba kernels over Arrow string layout (offsets + bytes): no Python str per tuple."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def compare_bytes(a, a0, a1, b, b0, b1):
    """-1, 0 or 1: bytewise order of a[a0:a1] and b[b0:b1]."""
    la, lb = a1 - a0, b1 - b0
    n = la if la < lb else lb
    for i in range(n):
        x, y = a[a0 + i], b[b0 + i]
        if x != y:
            return -1 if x < y else 1
    if la == lb:
        return 0
    return -1 if la < lb else 1


@njit(nogil=True, cache=True)
def compare_columns(oa, da, ob, db, b_is_scalar):
    """Row-wise order of two string columns; ``b_is_scalar`` broadcasts b's row 0."""
    n = len(oa) - 1
    out = np.empty(n, np.int8)
    for i in range(n):
        j = 0 if b_is_scalar else i
        out[i] = compare_bytes(da, oa[i], oa[i + 1], db, ob[j], ob[j + 1])
    return out


@njit(nogil=True, cache=True)
def startswith(offsets, data, prefix):
    n = len(offsets) - 1
    m = len(prefix)
    out = np.zeros(n, np.bool_)
    for i in range(n):
        s = offsets[i]
        if offsets[i + 1] - s >= m:
            ok = True
            for k in range(m):
                if data[s + k] != prefix[k]:
                    ok = False
                    break
            out[i] = ok
    return out
