"""Round-robin: a batch is spread over every instance at once, in slices of bounded size, rows in order;
routers hand in-process queues batches of their own."""

import numpy as np
import pyarrow as pa
import pytest

import sparkcep as cep
from sparkcep.query.planner import plan
from sparkcep.runtime.balancers import MIN_SLICE_ROWS, SLICE_ROWS, RoundRobin, Router, bin_tables
from sparkcep.runtime.channels import Data, LocalChannel
from sparkcep.runtime.layout import ENGINE, Layout


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


def _buffers(batch: pa.RecordBatch) -> set[int]:
    return {b.address for col in batch.columns for b in col.buffers() if b is not None}


@pytest.mark.parametrize("keeps", [False, True])
@pytest.mark.parametrize("parallelism", [1, 2])
def test_a_channel_that_keeps_batches_gets_them_in_memory_of_their_own(keeps, parallelism):
    """Into an in-process queue of an instance manager a batch goes copied (its input may point into a
    ring about to be reused), unless its balancer made the part afresh (route-key); elsewhere as it is."""
    q = cep.Query("keeps")
    s = q.stream("s", "k string, v int64")
    q.output("out", s.map(k="k", v="v").aggregate(cep.TupleWindow(2), by="k", n=cep.count()))
    layout = Layout(plan(q), {sq.name: parallelism for sq in plan(q).subqueries})
    first = layout.consumers(ENGINE)[0]
    chans = {c: LocalChannel(keeps_batches=keeps) for c in layout.consumers(first)}
    router = Router(layout.routes(first), chans, bin_tables(layout, 8))
    batch = pa.record_batch({"k": ["a", "b", "c", "d"], "v": np.arange(4), "__seq": np.arange(4),
                             "__id": np.zeros(4, np.int64), "__ts": np.arange(4), "__wm": np.zeros(4, np.int64)})
    router.send(next(iter(layout.routes(first))), batch, (1, 3, 0))
    sent = [m.batch for ch in chans.values() for m in ch.queue if isinstance(m, Data)]
    assert sum(b.num_rows for b in sent) == 4
    for b in sent:
        if keeps or parallelism > 1:  # copied into the queue, or cut afresh by route-key
            assert not _buffers(b) & _buffers(batch)
        else:
            assert b is batch
