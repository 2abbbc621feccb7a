"""Numba's on-disk kernel cache, dropped when any kernel source changed.

Numba checks a cached kernel against its own file only, but the engine's
kernels inline functions of other modules (``apply_group`` of
:mod:`sparkcep.core.accumulators` into the window and running aggregates):
after an update of a source checkout that changed only the inlined module,
the cached aggregate kernels kept the old code, with an old slot layout
(wrong results, or a crash writing past an entry). So the caches next to the
kernel sources are kept only while a digest of every kernel source matches
the one they were made with.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
# every module holding numba kernels, and every module they take inlined functions from
SOURCES = [*sorted((PACKAGE / "core").glob("*.py")), PACKAGE / "runtime" / "metrics.py",
           PACKAGE / "bench" / "generator.py"]
STAMP = "sparkcep-kernels.digest"


def digest(sources: list[Path]) -> str:
    h = hashlib.sha256()
    for path in sources:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def drop_stale(sources: list[Path] = SOURCES) -> bool:
    """Delete numba's cache files beside ``sources`` unless they were made from these very sources;
    True if it deleted them. A directory it may not write (an installed package's) is left to numba,
    whose per-file check holds there: an install rewrites every file."""
    caches = {path.parent / "__pycache__" for path in sources}
    stamp = sources[0].parent / "__pycache__" / STAMP
    now = digest(sources)
    try:
        if stamp.read_text() == now:
            return False
    except OSError:
        pass
    try:
        for cache in caches:
            modules = {s.stem for s in sources if s.parent == cache.parent}
            for path in cache.glob("*.nb[ic]"):  # <module>.<function>-<line>.py311[.n].nb[ic]
                if path.name.split(".")[0] in modules:
                    path.unlink(missing_ok=True)
        stamp.parent.mkdir(exist_ok=True)
        tmp = stamp.with_suffix(f".{os.getpid()}")
        tmp.write_text(now)
        os.replace(tmp, stamp)
    except OSError:
        return False
    return True
