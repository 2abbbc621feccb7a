"""Zeroed arrays reuse the mappings of dead ones: zeroed again, never shared with a live array; an
engine gives its state back when it closes or a query goes."""

import gc

import numpy as np
import pyarrow as pa
import pytest

import sparkcep as cep
from sparkcep.core import pages
from sparkcep.core.pages import zeroed

BIG = (4, 1 << 16)  # 2 MiB of int64: pooled


def test_a_dead_arrays_mapping_is_reused_zeroed():
    a = zeroed(BIG, np.int64)
    address = a.ctypes.data
    a[:] = 7
    del a
    gc.collect()
    b = zeroed(BIG, np.int64)
    assert b.ctypes.data == address  # the same pages, not fresh ones
    assert not b.any() and b.ctypes.data % 4096 == 0 and b.flags.writeable


def test_a_live_arrays_mapping_is_never_handed_out():
    a, b = zeroed(BIG, np.int64), zeroed(BIG, np.int64)
    a[:] = 1
    b[:] = 2
    c = zeroed(BIG, np.int64)
    assert len({a.ctypes.data, b.ctypes.data, c.ctypes.data}) == 3
    assert (a == 1).all() and (b == 2).all() and not c.any()


def test_a_view_keeps_the_mapping_out_of_the_pool():
    a = zeroed(BIG, np.int64)
    view = a[1]
    address = a.ctypes.data
    del a
    gc.collect()
    c = zeroed(BIG, np.int64)
    assert c.ctypes.data != address
    view[:] = 5  # still its own memory
    assert not c.any()


def test_the_pool_keeps_at_most_its_budget(monkeypatch):
    monkeypatch.setattr(pages, "SPARE_BYTES", 3 << 20)
    monkeypatch.setattr(pages, "_spares", [])
    arrays = [zeroed(BIG, np.int64) for _ in range(4)]
    del arrays
    gc.collect()
    assert pages.spare_bytes() <= 3 << 20 and len(pages._spares) == 1


def test_spares_of_huge_pages_and_of_plain_pages_are_kept_apart(monkeypatch):
    monkeypatch.setattr(pages, "_spares", [])
    plain, huge = zeroed(BIG, np.int64), zeroed(BIG, np.int64, huge=True)
    addresses = {"plain": plain.ctypes.data, "huge": huge.ctypes.data}
    plain[:] = 3
    huge[:] = 4
    del plain, huge
    gc.collect()
    again_huge, again_plain = zeroed(BIG, np.int64, huge=True), zeroed(BIG, np.int64)
    assert again_huge.ctypes.data == addresses["huge"] and again_plain.ctypes.data == addresses["plain"]
    assert not again_huge.any() and not again_plain.any()


def test_small_arrays_are_mapped_fresh_and_zeroed():
    z = zeroed((3, 5), np.float64)
    assert z.shape == (3, 5) and not z.any()


def test_scratch_reuses_a_dead_buffer_and_small_ones_are_plain():
    a = pages.scratch(3 << 20)
    address = a.ctypes.data
    del a
    gc.collect()
    assert pages.scratch(3 << 20).ctypes.data == address
    small = pages.scratch(100)
    assert small.nbytes == 100 and small.dtype == np.uint8


@pytest.mark.parametrize("how", ["close", "undeploy"])
def test_a_closed_engine_or_undeployed_query_gives_its_state_back_at_once(how, monkeypatch):
    """Without waiting for the cyclic collector (disabled here): the next engine reuses the pages."""
    q = cep.Query("w")
    q.output("out", q.stream("ev", {"k": "string", "ts": "timestamp"}).aggregate(cep.TimeWindow("10s"), by="k",
                                                                                  n=cep.count()))
    n = 50_000
    data = {"k": [f"key-{i}" for i in range(n)], "ts": pa.array(np.arange(n, dtype=np.int64), pa.timestamp("us"))}
    gc.collect()
    monkeypatch.setattr(pages, "_spares", [])  # the table's pages come fresh, not from an earlier test's spares
    gc.disable()
    try:
        e = cep.Engine.local()
        e.deploy(q)
        e.send("ev", data)
        if how == "close":
            e.close()
        else:
            e.undeploy("w")
        assert pages.spare_bytes() >= 4 << 20  # its hash table's pages are spares again
        e.close()
    finally:
        gc.enable()
