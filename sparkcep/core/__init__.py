"""The operator core: numba kernels over columnar batches and the physical operators."""

from sparkcep.core.kernel_cache import drop_stale

drop_stale()  # before any kernel is loaded from numba's cache
