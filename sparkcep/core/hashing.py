"""Key encoding and hashing kernels.

A composite key (one or more fields) is encoded per row into bytes, so one
hash function, one comparison and one hash table serve every key shape. A
single non-null string key is used as is (its Arrow bytes, zero copy); other
keys use, per field, a null flag byte then either 8 value bytes (numbers,
bools, timestamps) or a 4-byte length and the string bytes. The route-key
balancer and stateful operators hash the same encoding, so a tuple's bin is
the same wherever it is computed.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sparkcep.core.memory import load8

SEED = np.uint64(0x9E3779B97F4A7C15)


@njit(nogil=True, cache=True, inline="always")
def _mix(h):
    # splitmix64 finaliser: every input bit reaches every output bit
    h ^= h >> np.uint64(30)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(27)
    h *= np.uint64(0x94D049BB133111EB)
    h ^= h >> np.uint64(31)
    return h


@njit(nogil=True, cache=True)
def mix64(x):
    """splitmix64's finaliser over an array of uint64 (the generators' random numbers)."""
    out = np.empty_like(x)
    for i in range(len(x)):
        out[i] = _mix(x[i])
    return out


@njit(nogil=True, cache=True, inline="always")
def fold(h, x):
    """``h`` (uint64) with the 64-bit value ``x`` mixed in: for a fixed ``h`` a bijection of ``x``,
    so values folded into one prefix never collide. Output ids are chains of folds
    (:mod:`sparkcep.core.ids`)."""
    return _mix(h ^ np.uint64(x))


@njit(nogil=True, cache=True)
def _derive(salt, parts):
    k, n = parts.shape
    out = np.empty(n, np.int64)
    for i in range(n):
        h = salt
        for j in range(k):
            h = fold(h, parts[j, i])
        out[i] = np.int64(h)
    return out


def derive_ids(salt: np.uint64, *parts: np.ndarray) -> np.ndarray:
    """Per row ``i``: ``salt`` folded with ``parts[0][i]``, ``parts[1][i]``, ... (64-bit arrays of
    one length), as int64 bits; what each operator folds is in :mod:`sparkcep.core.ids`.

    The parts are stacked into one (k, n) array: one compiled kernel for
    every operator, whatever its arrays' layout or writability.
    """
    return _derive(np.uint64(salt), np.stack([p.view(np.int64) for p in parts]))


def fold_in(h: np.uint64, *parts: int) -> np.uint64:
    """:func:`fold` of the ints ``parts`` (their 64-bit two's complement) into ``h``, one after the
    other, in Python."""
    h = np.uint64(h)
    for p in parts:
        h = np.uint64(fold(h, np.uint64(int(p) & 0xFFFF_FFFF_FFFF_FFFF)))
    return h


def operator_salt(name: str, *parts: int) -> np.uint64:
    """An operator's stable number: :func:`hash_key` of its name (names are unique in a query),
    folded with ``parts`` (an input port, say)."""
    data = np.frombuffer(name.encode(), np.uint8)
    return fold_in(hash_rows(np.array([0, len(data)], np.int64), data)[0], *parts)


@njit(nogil=True, cache=True, inline="always")
def _word(data, s, e):
    """The bytes data[s:e] (at most 8) packed little-endian into a uint64."""
    n = e - s
    if n <= 0:
        return np.uint64(0)
    if s + 8 <= len(data):  # one load, the bytes past e masked off
        return load8(data, s) & (np.uint64(0xFFFFFFFFFFFFFFFF) >> np.uint64(64 - 8 * n))
    w = np.uint64(0)
    for k in range(n):
        w |= np.uint64(data[s + k]) << np.uint64(8 * k)
    return w


@njit(nogil=True, cache=True, inline="always")
def hash_key(data, s, e):
    """(hash, first 8 bytes, next 8 bytes) of the key ``data[s:e]``.

    The hash mixes the key 8 bytes at a time, with its length (so keys that
    differ only in trailing zero bytes differ). The two words let tables
    compare keys of up to 16 bytes without touching their key arena. Every
    place that needs a key's hash or bin uses this one function.
    """
    a = _word(data, s, min(e, s + 8))
    c = _word(data, min(e, s + 8), min(e, s + 16))
    x = hash_head(a, c, e - s)
    k = s + 16
    while k < e:
        x = _mix(x ^ _word(data, k, min(e, k + 8)))
        k += 8
    return x, np.int64(a), np.int64(c)


@njit(nogil=True, cache=True, inline="always")
def hash_head(a, c, n):
    """:func:`hash_key` of a key of ``n`` bytes whose first 16 are the words ``a``, ``c`` (uint64):
    the whole hash when ``n <= 16``, else its start."""
    return _mix(_mix(a ^ (np.uint64(n) * SEED)) ^ c)


@njit(nogil=True, cache=True)
def hash_words(offsets, data):
    """:func:`hash_key` of each encoded key: (hashes, first words, second words)."""
    n = len(offsets) - 1
    h = np.empty(n, np.uint64)
    w0 = np.empty(n, np.int64)
    w1 = np.empty(n, np.int64)
    for i in range(n):
        h[i], w0[i], w1[i] = hash_key(data, np.int64(offsets[i]), np.int64(offsets[i + 1]))
    return h, w0, w1


@njit(nogil=True, cache=True)
def key_hashes(offsets, data, bins):
    """:func:`hash_words` of each encoded key and its bin (``bins`` a power of two) in one pass:
    (hashes, first words, second words, bins) as :func:`bin_ids` gives them."""
    n = len(offsets) - 1
    mask = np.uint64(bins - 1)
    h = np.empty(n, np.uint64)
    w0 = np.empty(n, np.int64)
    w1 = np.empty(n, np.int64)
    b = np.empty(n, np.int64)
    for i in range(n):
        x, a, c = hash_key(data, np.int64(offsets[i]), np.int64(offsets[i + 1]))
        h[i], w0[i], w1[i], b[i] = x, a, c, np.int64(x & mask)
    return h, w0, w1, b


def hash_rows(offsets, data) -> np.ndarray:
    """64-bit hash of each encoded key (the route-key hash)."""
    return hash_words(offsets, data)[0]


def bin_ids(hashes: np.ndarray, bins: int) -> np.ndarray:
    """The bin of each key hash (``bins``: a power of two): the one key -> bin function of the engine.

    Routers, stateful operators and migration all place a key by it.
    """
    return (hashes & np.uint64(bins - 1)).astype(np.int64)


def key_bins(offsets, data, bins: int) -> np.ndarray:
    """The bin of each encoded key (see :func:`sparkcep.core.columns.encode_keys`)."""
    return bin_ids(hash_rows(offsets, data), bins)


@njit(nogil=True, cache=True)
def fixed_lengths(lengths):
    for i in range(len(lengths)):
        lengths[i] += 9


@njit(nogil=True, cache=True)
def string_lengths(lengths, offsets):
    for i in range(len(lengths)):
        lengths[i] += 5 + offsets[i + 1] - offsets[i]


@njit(nogil=True, cache=True)
def write_fixed(out, cursor, bits, valid):
    """Append a null flag and the 8 bytes of ``bits[i]`` at ``cursor[i]`` (advanced)."""
    for i in range(len(bits)):
        c = cursor[i]
        ok = valid[i]
        out[c] = 1 if ok else 0
        v = bits[i] if ok else np.uint64(0)
        for k in range(8):
            out[c + 1 + k] = np.uint8((v >> np.uint64(8 * k)) & np.uint64(0xFF))
        cursor[i] = c + 9


@njit(nogil=True, cache=True)
def write_string(out, cursor, offsets, data, valid):
    for i in range(len(cursor)):
        c = cursor[i]
        ok = valid[i]
        s, e = offsets[i], offsets[i + 1]
        n = e - s if ok else 0
        out[c] = 1 if ok else 0
        for k in range(4):
            out[c + 1 + k] = np.uint8((n >> (8 * k)) & 0xFF)
        for k in range(n):
            out[c + 5 + k] = data[s + k]
        cursor[i] = c + 5 + n


@njit(nogil=True, cache=True)
def read_fixed(a, starts, skip_kinds, col):
    """Decode field ``col`` (fixed width) of keys at ``a[starts[i]:]``: (bits, valid)."""
    n = len(starts)
    bits = np.zeros(n, np.uint64)
    valid = np.zeros(n, np.bool_)
    for i in range(n):
        c = _skip(a, starts[i], skip_kinds, col)
        valid[i] = a[c] == 1
        v = np.uint64(0)
        for k in range(8):
            v |= np.uint64(a[c + 1 + k]) << np.uint64(8 * k)
        bits[i] = v
    return bits, valid


@njit(nogil=True, cache=True)
def read_string(a, starts, skip_kinds, col):
    """Decode string field ``col`` of keys at ``a[starts[i]:]``: (offsets, data, valid)."""
    n = len(starts)
    offsets = np.zeros(n + 1, np.int64)
    valid = np.zeros(n, np.bool_)
    total = 0
    for i in range(n):
        c = _skip(a, starts[i], skip_kinds, col)
        ln = 0
        for k in range(4):
            ln |= np.int64(a[c + 1 + k]) << (8 * k)
        valid[i] = a[c] == 1
        total += ln
        offsets[i + 1] = total
    data = np.empty(total, np.uint8)
    for i in range(n):
        c = _skip(a, starts[i], skip_kinds, col)
        s = offsets[i]
        for k in range(offsets[i + 1] - s):
            data[s + k] = a[c + 5 + k]
    return offsets, data, valid


@njit(nogil=True, cache=True, inline="always")
def _skip(arena, c, kinds, col):
    for j in range(col):
        if kinds[j] == 0:
            c += 9
        else:
            ln = 0
            for k in range(4):
                ln |= np.int64(arena[c + 1 + k]) << (8 * k)
            c += 5 + ln
    return c


NULL_BYTE = 0xFF  # a raw string key that is null: one 0xFF byte, never valid UTF-8


@njit(nogil=True, cache=True)
def write_raw_nullable(offsets, data, valid):
    """Raw encoding of a single string key column holding nulls."""
    n = len(valid)
    out_off = np.zeros(n + 1, np.int64)
    for i in range(n):
        out_off[i + 1] = out_off[i] + (offsets[i + 1] - offsets[i] if valid[i] else 1)
    out = np.empty(out_off[n], np.uint8)
    for i in range(n):
        d = out_off[i]
        if valid[i]:
            s = offsets[i]
            for k in range(offsets[i + 1] - s):
                out[d + k] = data[s + k]
        else:
            out[d] = NULL_BYTE
    return out_off, out


@njit(nogil=True, cache=True)
def gather_binned(arena, bins, starts, lengths):
    """Offsets and bytes of ``arena[bins[i], starts[i]:starts[i]+lengths[i]]``."""
    n = len(starts)
    out_off = np.zeros(n + 1, np.int64)
    for i in range(n):
        out_off[i + 1] = out_off[i] + lengths[i]
    out = np.empty(out_off[n], np.uint8)
    for i in range(n):
        b, s, d = bins[i], starts[i], out_off[i]
        for k in range(lengths[i]):
            out[d + k] = arena[b, s + k]
    return out_off, out
