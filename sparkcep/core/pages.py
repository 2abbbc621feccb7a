"""Zeroed, page-aligned arrays for operator state, carved from mappings this process reuses.

On a virtual machine the dearest part of building a large table can be the
first touch of its memory: pages the guest has not used lately are backed by
the host on that touch. Measured on the project's 2-core machines: ~0.4 GB/s
once a process touches more than ~2 GB of fresh memory (a 256 MiB table
took 0.65 s to map) against ~3 GB/s for recently used pages (0.085 s), and
memset of a mapping already touched runs faster still. So the mapping of a
large array returns to a pool of spares when the array dies, and the next
array that fits reuses it, zeroed with memset. The endpoint reads large
frames into such mappings too (:func:`scratch`): a Spark micro-batch staged
in the engine is hundreds of MiB. The pool holds at most
:data:`SPARE_BYTES`; smaller arrays are mapped fresh every time.

Not ``np.zeros``: numpy advises huge pages for arrays of 4 MiB and more, and
where the kernel defragments for such advice (THP ``defrag=madvise``) the
first touch of a huge page can wait for memory compaction; these arrays use
plain 4 KiB pages, populated when mapped.
"""

from __future__ import annotations

import mmap
import threading
import weakref

import numpy as np

SPARE_BYTES = 1 << 30  # spare mappings kept for reuse, at most
POOLED_BYTES = 1 << 20  # arrays this large or larger go back to the pool

_spares: list[mmap.mmap] = []  # the most recently released last
_lock = threading.Lock()


def zeroed(shape: tuple[int, ...], dtype) -> np.ndarray:
    """A zeroed array of ``shape``, page-aligned (so entry rows start on cache lines)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape))
    flat, fresh = _carve(max(n * dtype.itemsize, 1))
    if not fresh:
        flat.fill(0)
    return flat.view(dtype)[:n].reshape(shape)


def scratch(nbytes: int) -> np.ndarray:
    """An uninitialised byte array of ``nbytes`` for a buffer filled at once (a frame read from a
    socket); a large one is carved like :func:`zeroed`'s arrays."""
    if nbytes < POOLED_BYTES:
        return np.empty(nbytes, np.uint8)
    return _carve(nbytes)[0]


def spare_bytes() -> int:
    """Bytes of spare mappings held for reuse."""
    with _lock:
        return sum(len(m) for m in _spares)


def _carve(size: int) -> tuple[np.ndarray, bool]:
    """``size`` bytes over a page-aligned mapping, a spare when one fits; and whether it is fresh (zero)."""
    mm = _spare(size) if size >= POOLED_BYTES else None
    fresh = mm is None
    if fresh:
        mm = mmap.mmap(-1, size, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)
    flat = np.frombuffer(mm, np.uint8, count=size)
    if size >= POOLED_BYTES:
        weakref.finalize(flat, _release, mm)
    return flat, fresh


def _spare(size: int) -> mmap.mmap | None:
    """The most recently released spare of ``size`` to ``2 * size`` bytes, taken out of the pool."""
    with _lock:
        for k in range(len(_spares) - 1, -1, -1):
            if size <= len(_spares[k]) <= 2 * size:
                return _spares.pop(k)
    return None


def _release(mm: mmap.mmap) -> None:
    """An array over ``mm`` died: keep ``mm`` as a spare, dropping the oldest ones over the budget."""
    with _lock:
        _spares.append(mm)
        total = sum(len(m) for m in _spares)
        while total > SPARE_BYTES:
            total -= len(_spares.pop(0))
