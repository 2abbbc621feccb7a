"""Bin tables: which instance owns each bin of a route-key stateful operator.

A key's bin comes from :func:`sparkcep.core.hashing.bin_ids` (one function
for the whole engine); the state of a stateful operator is kept per bin
(DESIGN §5). Every router that sends into the operator holds a copy of its
table; the engine holds the authoritative one, and changes travel as
:class:`~sparkcep.runtime.channels.Configure` records that take effect at an
epoch, so a bin never has two owners at one point of the input.
"""

from __future__ import annotations

import numpy as np

from sparkcep.errors import QueryError


class BinTable:
    """Owner (instance index) of each of ``bins`` bins of stateful operator ``operator``.

    It starts as Megaphone does: contiguous ranges of bins per instance.

    >>> BinTable("agg", 8, 2).owners.tolist()
    [0, 0, 0, 0, 1, 1, 1, 1]
    """

    def __init__(self, operator: str, bins: int, instances: int, owners=None):
        self.operator, self.bins, self.instances = operator, bins, instances
        if owners is None:
            owners = np.arange(bins) * instances // bins
        self.owners = np.asarray(owners, np.int64)
        if self.owners.shape != (bins,) or (self.owners < 0).any() or (self.owners >= instances).any():
            raise QueryError(f"bin table of {operator!r}: expected {bins} owners in [0, {instances}), "
                             f"got {list(self.owners)[:8]}...")

    def instances_of(self, bin_ids: np.ndarray) -> np.ndarray:
        """The owning instance of each bin in ``bin_ids``."""
        return self.owners[bin_ids]

    def assign(self, bins, owners) -> None:
        """Bin ``bins[i]`` to instance ``owners[i]`` (a Configure record's change), the others as they are."""
        bins, owners = np.asarray(bins, np.int64), np.asarray(owners, np.int64)
        if bins.shape != owners.shape or ((bins < 0) | (bins >= self.bins)).any() \
                or ((owners < 0) | (owners >= self.instances)).any():
            raise QueryError(f"bin table of {self.operator!r}: expected bins in [0, {self.bins}) and owners in "
                             f"[0, {self.instances}), got {bins.tolist()[:8]}... -> {owners.tolist()[:8]}...")
        table = self.owners.copy()  # a new array: a table handed out before stays as it was
        table[bins] = owners
        self.owners = table

    def copy(self) -> "BinTable":
        return BinTable(self.operator, self.bins, self.instances, self.owners.copy())

    def __repr__(self) -> str:
        return f"BinTable({self.operator!r}, {self.bins} bins over {self.instances} instances)"
