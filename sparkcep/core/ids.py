"""Output ids: every row's ``(__seq, __id)``, the same at every parallelism and in every replica.

The id of a row comes from how it was derived, never from arrival order or
from which instance made it, so a duplicate-filtering sink can key on it
and stateful operators can consume in ``(__seq, __id)`` order. ``__id``
holds 64 bits (an int64 column); ``salt`` is the operator's stable number
(:func:`~sparkcep.core.hashing.operator_salt` of its name), and each id is a
chain of :func:`~sparkcep.core.hashing.fold` over:

============================  ==========================================  =============================
operator                      ``__seq``                                   ``__id`` folds
============================  ==========================================  =============================
source                        the engine's sequence number                0 (not folded)
filter, map, demux, late      kept                                        kept
union, input port ``p``       kept                                        salt, p, input id
apply                         kept                                        kept; the k-th repeat (k >= 1)
                                                                          of an id: salt, id, k
aggregate (time, tuple)       largest of the window's rows                salt, window start, key hash
running aggregate             the group's last row of the batch           salt, step, key hash
join                          larger of the pair's                        salt, window start, left
                                                                          (seq, id), right (seq, id)
``stateful()``                the frontier it was emitted at              salt, step, call, content
                                                                          hash, k (:func:`content_ids`)
============================  ==========================================  =============================

The step of a running aggregate's update or of a user operator's call is
the advance's (frontier, round): an upstream window may emit rows of old
sequence numbers at any later advance, so a sequence number alone does not
tell two updates apart. Two rows of one output collide only if two
different derivations hash alike (2^-64 a pair).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from numba import njit

from sparkcep.core import columns
from sparkcep.core.hashing import derive_ids, fold_in, hash_rows


@njit(nogil=True, cache=True)
def in_order(seq, ids):
    """Whether (seq, id) strictly increases along the rows: then nothing needs sorting.

    Whether seq rises or falls anywhere is scanned branch-free (the loop
    vectorises: a quarter of a branching scan's time); only a batch whose
    seq never falls but repeats has its ids compared.
    """
    rises, falls = True, False
    for i in range(1, len(seq)):
        rises &= seq[i] > seq[i - 1]
        falls |= seq[i] < seq[i - 1]
    if rises or falls:
        return rises
    for i in range(1, len(seq)):
        if seq[i] == seq[i - 1] and ids[i] <= ids[i - 1]:
            return False
    return True


@njit(nogil=True, cache=True)
def order_ties(perm, seq, ids):
    """Sort each run of equal sequence numbers of ``perm`` (rows sorted by seq) by id, stably."""
    n = len(perm)
    i = 0
    while i < n:
        s = seq[perm[i]]
        j = i + 1
        while j < n and seq[perm[j]] == s:
            j += 1
        if j - i > 1:
            run = perm[i:j].copy()
            perm[i:j] = run[np.argsort(ids[run], kind="mergesort")]
        i = j


def consume_order(seq: np.ndarray, ids: np.ndarray) -> np.ndarray | None:
    """The permutation putting rows in (seq, id) order, or None when they already are (no sort)."""
    if in_order(seq, ids):
        return None
    perm = np.argsort(seq, kind="stable")
    if ids.any():  # rows that all have id 0 (source tuples) never share a sequence number
        order_ties(perm, seq, ids)
    return perm


@njit(nogil=True, cache=True)
def _repeats(order, a, b):
    """Per row, how many rows before it (in row order) have its (a, b); ``order`` sorts rows by
    (a, b) stably. Returns (those counts, whether any is not 0)."""
    k = np.zeros(len(order), np.int64)
    any_ = False
    for j in range(1, len(order)):
        r, p = order[j], order[j - 1]
        if a[r] == a[p] and b[r] == b[p]:
            k[r] = k[p] + 1
            any_ = True
    return k, any_


def repeats(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """Per row, its occurrence among the rows with equal (a, b) (0 for the first), or None when
    every (a, b) is distinct."""
    k, any_ = _repeats(np.lexsort((b, a)), a, b)
    return k if any_ else None


def apply_ids(salt: np.uint64, seq: np.ndarray, ids: np.ndarray) -> np.ndarray | None:
    """The ids of an ``apply()`` output batch with repeated ids numbered by occurrence (a function
    that emitted a row twice), or None when its ids are distinct."""
    if in_order(seq, ids):
        return None
    k = repeats(seq, ids)
    if k is None:
        return None
    return np.where(k > 0, derive_ids(salt, ids, k), ids)


def content_ids(salt: np.uint64, step: tuple[int, int], call: int, batch: pa.RecordBatch,
                names: list[str]) -> np.ndarray:
    """Ids of the rows a user ``stateful()`` operator emitted in one call.

    ``step``: the advance's (frontier, round), see
    :class:`~sparkcep.core.operators.StatefulOp`; ``call``: 0 ``process``, 1
    ``on_watermark``, 2 ``on_end``. Equal rows are numbered by occurrence.
    """
    h = hash_rows(*columns.encode_keys(batch, names)).view(np.int64)
    k = repeats(h, h)
    return derive_ids(fold_in(salt, *step, call), h, np.zeros(len(h), np.int64) if k is None else k)
