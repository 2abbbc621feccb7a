"""Round-robin: a batch is spread over every instance at once, in slices of bounded size, rows in order."""

import numpy as np
import pyarrow as pa
import pytest

from sparkcep.runtime.balancers import MIN_SLICE_ROWS, SLICE_ROWS, RoundRobin


@pytest.mark.parametrize("instances", [2, 3])
@pytest.mark.parametrize("rows", [1, MIN_SLICE_ROWS, 3 * MIN_SLICE_ROWS, 10_000, 5 * SLICE_ROWS + 7])
def test_round_robin_gives_every_instance_a_slice_of_a_batch_in_turn(instances, rows):
    rr = RoundRobin(instances)
    batch = pa.record_batch({"v": np.arange(rows)})
    parts = rr.split(batch)
    sizes = [p.num_rows for _, p in parts]
    assert np.concatenate([p.column("v").to_numpy() for _, p in parts]).tolist() == list(range(rows))
    assert [i for i, _ in parts] == [k % instances for k in range(len(parts))]
    assert max(sizes) <= SLICE_ROWS
    if rows >= instances * MIN_SLICE_ROWS:
        assert len(parts) >= instances  # a mid-size batch keeps every instance busy, not one
    if rows <= MIN_SLICE_ROWS:
        assert len(parts) == 1  # a small one is not cut
    following = rr.split(batch)[0][0]
    assert following == len(parts) % instances  # the rotation carries on over batches
