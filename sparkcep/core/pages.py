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
plain 4 KiB pages, populated when mapped. Except with ``huge``: a hash
table's slots, probed at random, are advised huge pages (2 MiB), so a probe
misses the TLB far less often (``benchmarks/kernels.py``' window aggregate,
16 MiB of slots, ran 6-28% faster in three runs in turn). The compaction
such advice may wait for is paid when a mapping is new, not when a spare is
reused, so spares of each kind are kept apart.
"""

from __future__ import annotations

import mmap
import threading
import weakref

import numpy as np

SPARE_BYTES = 1 << 30  # spare mappings kept for reuse, at most
POOLED_BYTES = 1 << 20  # arrays this large or larger go back to the pool
HUGE_BYTES = 2 << 20  # huge pages are advised for arrays of at least one huge page
MADV_POPULATE_WRITE = 23  # Linux >= 5.14: fault the pages in writable now (huge ones where advised)

_spares: list[tuple[mmap.mmap, bool]] = []  # (mapping, huge pages advised), the most recently released last
_lock = threading.Lock()


def zeroed(shape: tuple[int, ...], dtype, huge: bool = False) -> np.ndarray:
    """A zeroed array of ``shape``, page-aligned (so entry rows start on cache lines); ``huge``: on
    huge pages when at least one fits."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape))
    size = max(n * dtype.itemsize, 1)
    flat, fresh = _carve(size, huge and size >= HUGE_BYTES)
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
        return sum(len(m) for m, _ in _spares)


def _carve(size: int, huge: bool = False) -> tuple[np.ndarray, bool]:
    """``size`` bytes over a page-aligned mapping, a spare when one fits; and whether it is fresh (zero)."""
    mm = _spare(size, huge) if size >= POOLED_BYTES else None
    fresh = mm is None
    if fresh:
        mm = _map(size, huge)
    flat = np.frombuffer(mm, np.uint8, count=size)
    if size >= POOLED_BYTES:
        weakref.finalize(flat, _release, mm, huge)
    return flat, fresh


def _map(size: int, huge: bool) -> mmap.mmap:
    """A new populated anonymous mapping of ``size`` bytes; ``huge``: advised huge pages first."""
    if not huge:
        return mmap.mmap(-1, size, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)
    mm = mmap.mmap(-1, size, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for advice in (mmap.MADV_HUGEPAGE, MADV_POPULATE_WRITE):
        try:
            mm.madvise(advice)
        except OSError:  # a kernel without huge pages, or before 5.14: plain pages, or faulted in by first writes
            pass
    return mm


def _spare(size: int, huge: bool) -> mmap.mmap | None:
    """The most recently released spare of the kind and of ``size`` to ``2 * size`` bytes, taken out of
    the pool."""
    with _lock:
        for k in range(len(_spares) - 1, -1, -1):
            mm, kind = _spares[k]
            if kind == huge and size <= len(mm) <= 2 * size:
                return _spares.pop(k)[0]
    return None


def _release(mm: mmap.mmap, huge: bool) -> None:
    """An array over ``mm`` died: keep ``mm`` as a spare, dropping the oldest ones over the budget."""
    with _lock:
        _spares.append((mm, huge))
        total = sum(len(m) for m, _ in _spares)
        while total > SPARE_BYTES:
            total -= len(_spares.pop(0)[0])
