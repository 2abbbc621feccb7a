"""Cutting a batch by destination (core/partition.py) against the bins of ``key_bins`` and Arrow's take."""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkcep.core import columns
from sparkcep.core.hashing import key_bins
from sparkcep.core.partition import destinations, partition
from sparkcep.runtime.balancers import RouteKey
from sparkcep.runtime.bins import BinTable

BINS = 16


def mixed_batch(n: int, skip: int = 0, nulls: bool = False) -> pa.RecordBatch:
    """Every column kind the engine carries, sliced by ``skip`` rows (buffers then start mid-way)."""
    rng = np.random.default_rng(n + skip)
    words = [f"w{x}" * int(rng.integers(0, 7)) for x in rng.integers(0, 50, n + skip)]
    s = pa.array([None if nulls and i % 5 == 0 else w for i, w in enumerate(words)], pa.string())
    return pa.RecordBatch.from_arrays([
        s, pa.array(rng.integers(0, 9, n + skip), pa.int64()), pa.array(rng.integers(0, 9, n + skip), pa.int32()),
        pa.array(rng.random(n + skip)), pa.array(rng.random(n + skip), pa.float32()),
        pa.array(rng.integers(0, 2, n + skip).astype(bool)),
        pa.array(rng.integers(0, 1 << 40, n + skip), pa.timestamp("us")),
        pa.array([None if nulls and i % 3 == 0 else i for i in range(n + skip)], pa.int64())],
        names=["k", "g", "i", "x", "f", "b", "ts", "v"]).slice(skip)


def by_key(batch: pa.RecordBatch, parts: int) -> list[pa.RecordBatch]:
    """``batch`` cut by :func:`partition` into ``parts`` by its column ``k`` (the parts holding rows)."""
    owners = np.arange(BINS) * parts // BINS
    order, starts = destinations(*columns.encode_keys(batch, ["k"]), owners, parts)
    return [p for p in partition(batch, order, starts) if p is not None]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 300), skip=st.integers(0, 9), parts=st.integers(1, 4), nulls=st.booleans(),
       keys=st.sampled_from([["k"], ["g"], ["k", "g"], ["i", "x"]]))
def test_parts_are_the_rows_of_each_owner_in_row_order(n, skip, parts, nulls, keys):
    batch = mixed_batch(n, skip, nulls)
    owners = np.arange(BINS) * parts // BINS
    order, starts = destinations(*columns.encode_keys(batch, keys), owners, parts)
    want = owners[key_bins(*columns.encode_keys(batch, keys), BINS)]
    got = partition(batch, order, starts)
    assert len(got) == parts
    for p, part in enumerate(got):
        rows = np.flatnonzero(want == p)
        if not len(rows):
            assert part is None
            continue
        assert part.schema == batch.schema
        assert part.to_pylist() == pc.take(batch, pa.array(rows)).to_pylist()


def test_parts_share_no_memory_with_the_batch_split():
    batch = mixed_batch(1000)
    table = BinTable("agg", BINS, 2)
    before = {b.address for col in batch.columns for b in col.buffers() if b is not None}
    for _, part in RouteKey(["k"], table).split(batch):
        for col in part.columns:
            assert not {b.address for b in col.buffers() if b is not None} & before


@pytest.mark.parametrize("n", [1, 7, 4096])
def test_route_key_sends_every_row_once(n):
    batch = mixed_batch(n)
    split = RouteKey(["k", "g"], BinTable("agg", BINS, 3)).split(batch)
    assert sorted(v for _, part in split for v in part.column("v").to_pylist()) == batch.column("v").to_pylist()


def test_columns_of_read_only_and_writable_buffers_go_together():
    """A batch read from a channel has read-only buffers, one the engine stamped writable ones: the
    gather of their fixed-width columns takes both at once."""
    batch = mixed_batch(100)
    sent = pa.ipc.read_record_batch(pa.py_buffer(batch.serialize().to_pybytes()), batch.schema)  # read-only
    mixed = pa.RecordBatch.from_arrays([sent.column(i) if i % 2 else batch.column(i) for i in range(batch.num_columns)],
                                       schema=batch.schema)
    assert sorted(v for part in by_key(mixed, 2) for v in part.column("v").to_pylist()) == list(range(100))


def test_columns_over_one_buffer_are_gathered_once():
    """A stamped batch's event time and __ts view one buffer: each part's two columns share one
    gathered buffer too, and a column over that buffer from another row on is gathered on its own."""
    batch = mixed_batch(500, skip=3)
    ts = batch.column("ts")
    earlier = pa.Array.from_buffers(pa.int64(), len(ts), [None, ts.buffers()[1]], offset=ts.offset - 1)
    stamped = columns.stamp(batch.append_column("earlier", earlier), 0, columns.as_int64(ts), 7)
    split = by_key(stamped, 2)
    assert sum(part.num_rows for part in split) == 500
    for part in split:
        rows = pc.index_in(part.column(columns.SEQ), stamped.column(columns.SEQ))
        assert part.to_pylist() == pc.take(stamped, rows).to_pylist()
        same = part.column("ts").buffers()[1].address == part.column(columns.TS).buffers()[1].address
        assert same and part.column("earlier").buffers()[1].address != part.column("ts").buffers()[1].address
