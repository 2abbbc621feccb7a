"""The operator core: numba kernels over columnar batches and the physical operators."""
