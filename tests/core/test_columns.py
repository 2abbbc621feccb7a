"""The numpy views kernels get of Arrow columns."""

import numpy as np
import pyarrow as pa

from sparkcep.core import columns


def test_string_views_are_read_only_whoever_owns_the_buffers():
    """Buffers read from a channel are mutable, those pyarrow builds are not; kernels must see one
    array type for both, or numba compiles a second version mid-run (seconds without output)."""
    built = pa.array(["10.0.0.1", "10.0.0.22"])
    _, off, data = built.buffers()
    mutable = pa.Array.from_buffers(pa.string(), 2, [None, pa.py_buffer(np.frombuffer(off, np.uint8).copy()),
                                                     pa.py_buffer(np.frombuffer(data, np.uint8).copy())])
    for arr in (built, mutable):
        o, d, valid = columns.strings(arr)
        assert not o.flags.writeable and not d.flags.writeable
        assert [bytes(d[o[i]:o[i + 1]]) for i in range(2)] == [b"10.0.0.1", b"10.0.0.22"]
        assert valid.all()
