"""What an engine process sets up for itself: shared-memory directories, memory reuse, GC pause accounting."""

from __future__ import annotations

import ctypes
import gc
import os
import re
import shutil
import tempfile
import time

import pyarrow as pa

SHM = "/dev/shm"
SHM_NAME = re.compile(r"sparkcep-(?:im-)?(\d+)-")  # an engine's or an instance manager's directory, by pid
KEEP_BYTES = 256 << 20  # freed memory an instance manager keeps for reuse (glibc malloc)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (glibc malloc.h)


def shared_dir(prefix: str) -> str:
    """A new directory (mode 0700) for this process's rings and doorbells, in shared memory where there is
    some: ``sparkcep-<prefix><pid>-*``. First removes the ones of processes that died without removing
    theirs (an engine killed with SIGKILL cannot)."""
    root = SHM if os.path.isdir(SHM) else None
    reclaim(root or tempfile.gettempdir())
    return tempfile.mkdtemp(prefix=f"sparkcep-{prefix}{os.getpid()}-", dir=root)


def reclaim(root: str) -> list[str]:
    """Remove the sparkcep directories under ``root`` whose process is gone; returns their paths."""
    gone = []
    for name in os.listdir(root):
        m = SHM_NAME.match(name)
        if m and not _alive(int(m.group(1))):
            path = os.path.join(root, name)
            shutil.rmtree(path, ignore_errors=True)
            gone.append(path)
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


class GCPauses:
    """Python's garbage-collector pauses in this process (a ``gc.callbacks`` entry)."""

    def __init__(self):
        self.collections = self.total_ns = self.max_ns = self._start = 0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter_ns()
            return
        pause = time.perf_counter_ns() - self._start
        self.collections += 1
        self.total_ns += pause
        self.max_ns = max(self.max_ns, pause)

    def snapshot(self) -> dict:
        return {"collections": self.collections, "pause_ms_total": round(self.total_ns / 1e6, 3),
                "pause_ms_max": round(self.max_ns / 1e6, 3), "frozen_objects": gc.get_freeze_count()}


def keep_freed_memory() -> None:
    """Allocate Arrow buffers with malloc, and let malloc keep what is freed for the next batch.

    Arrow's default mimalloc pool hands freed pages back and faults them in
    again as 2 MiB huge pages (THP), zeroing each: a third of fixwindow's
    time. glibc's malloc, left alone, maps large blocks fresh each time and
    trims its heap; raising both thresholds keeps the memory of the last
    batches (up to about ``KEEP_BYTES``) instead of faulting it in again.
    ``KEEP_BYTES // 8`` of heap is faulted in now, so the first large batches
    (a window closing over 50K keys allocates some MB) do not fault either.
    """
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        libc = ctypes.CDLL(None)
        mallopt, malloc, free = libc.mallopt, libc.malloc, libc.free
    except (OSError, AttributeError):  # not glibc
        return
    mallopt(M_MMAP_THRESHOLD, KEEP_BYTES // 4)
    mallopt(M_TRIM_THRESHOLD, KEEP_BYTES)
    malloc.restype, free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    block = malloc(KEEP_BYTES // 8)  # below the mmap threshold: from the heap, which keeps it once freed
    if block:
        ctypes.memset(block, 0, KEEP_BYTES // 8)
        free(block)
