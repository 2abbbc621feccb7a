"""Bins on the move: what :meth:`~sparkcep.core.operators.StatefulOp.take_bins` and
:meth:`~sparkcep.core.operators.StatefulOp.copy_bins` return and
:meth:`~sparkcep.core.operators.StatefulOp.put_bins` installs (DESIGN.md §5).

Migration, State Transfer and replica catch-up send it between processes as
``pickle.dumps(state, protocol=5)``: its bulk is numpy arrays and Arrow
batches, which pickle as whole buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from sparkcep.core.table import TableBins
from sparkcep.errors import EngineError


@dataclass(frozen=True)
class Progress:
    """An instance's scalar progress that an instance taking over its bins must take into account, so
    that its output is the one the sender would have given. None: the operator has no such field.

    The receiver merges each with its own: the later step, fired and event
    time, the lower starts.
    """

    step: tuple[int | None, int] = (None, 0)  # StatefulOp.step: the same in every instance that has advanced
    lowest_start: int | None = None  # WindowAggregate: no open window starts before it
    fired: int | None = None  # WindowJoin: every window starting before it has fired
    next_start: int | None = None  # WindowJoin: smallest window start that may hold buffered rows
    ts: int | None = None  # CustomOp: the largest event time consumed


@dataclass
class BinState:
    """Bins taken or copied out of an instance of a stateful operator.

    ``bins``: the bins asked for (None: every bin the instance held);
    ``state``: the operator's state of them; ``pending``: per input port,
    their tuples not consumed yet (one batch or None); ``progress``: the
    sender's :class:`Progress`; ``late``: per input port, the late tuples
    counted in each of ``bins`` (every bin when None).
    """

    bins: np.ndarray | None
    state: object
    pending: list[pa.RecordBatch | None] = field(default_factory=list)
    progress: Progress = field(default_factory=Progress)
    late: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of its arrays and batches (a custom operator's values count if they are arrays or batches)."""
        return _nbytes(self.bins) + _nbytes(self.state) + _nbytes(self.pending)


def _nbytes(x) -> int:
    """Bytes of the arrays and batches of ``x``: one, or a list, tuple or dict of them."""
    items = x if isinstance(x, (list, tuple)) else x.values() if isinstance(x, dict) else [x]
    return sum(v.nbytes for v in items if isinstance(v, (np.ndarray, pa.RecordBatch, TableBins)))


def later_step(a: tuple[int | None, int], b: tuple[int | None, int]) -> tuple[int | None, int]:
    """The later of two :attr:`~sparkcep.core.operators.StatefulOp.step` values; (None, 0): none yet."""
    return max(a, b, key=lambda s: (s[0] is not None, s[0] or 0, s[1]))


def checked_bins(bins, n_bins: int) -> np.ndarray | None:
    """``bins`` (bin ids, or None for all) as distinct sorted int64 ids, checked against ``n_bins``."""
    if bins is None:
        return None
    b = np.unique(np.asarray(bins, np.int64))
    if len(b) and (b[0] < 0 or b[-1] >= n_bins):
        raise EngineError(f"bins to move must be in [0, {n_bins}), got {b[0] if b[0] < 0 else b[-1]}",
                          code="BAD_BIN")
    return b
