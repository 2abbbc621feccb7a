"""BinnedTable under churn: inserts, deletes (tombstones freed in runs, wrap-around
included), takes, rebuilds and bins moved or copied between tables of other shapes,
against a dict of (bin, key, window) -> count; a fire leaves its tombstones for the sweep,
which leaves none that no probe needs."""

import os
import re

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sparkcep as cep
from sparkcep.core.hashing import hash_key
from sparkcep.core.pages import zeroed
from sparkcep.core.table import (ACC, EMPTY, K0, K1, KEY, KEY_BITS, KEY_LEN, MAX_LOAD, N_TOMB, TOMB, WSTART,
                                 BinnedTable, find_slot, fullest, key_bytes, place, room, slot_hash)

BINS = 4
KEYS = [b"", b"a", b"b", b"abcdefghijklmnopq", b"abcdefghijklmnopr", b"1.2.3.4", b"\x00", b"\x00\x00"] + \
    [b"10.0.0.%d" % i for i in range(12)]

op = st.one_of(
    st.tuples(st.just("add"), st.integers(0, BINS - 1), st.sampled_from(KEYS), st.integers(0, 5)),
    st.tuples(st.just("fire"), st.integers(0, 5)),
    st.tuples(st.just("take"), st.integers(0, 5)),
    st.tuples(st.just("move"), st.sets(st.integers(0, BINS - 1)), st.integers(0, 1)),
    st.tuples(st.just("copy"), st.one_of(st.none(), st.sets(st.integers(0, BINS - 1))), st.integers(0, 1)),
    st.tuples(st.just("renew"), st.integers(1, 64), st.integers(1, 300)),
    st.tuples(st.just("grow"),),
    st.tuples(st.just("sweep"),),
)


def add(table, b, key, w):
    data = np.frombuffer(key, np.uint8) if key else np.zeros(0, np.uint8)
    h, w0, w1 = hash_key(data, 0, len(key))
    ent, arena, meta = table.arrays
    if not room(ent, arena, meta, b, 1, key_bytes(len(key))):
        table.grow(1, key_bytes(len(key)))
        ent, arena, meta = table.arrays
    e, i = find_slot(ent, arena, b, slot_hash(np.uint64(h), np.int64(w)), np.int64(w), np.int64(w0), np.int64(w1),
                     data, 0, len(key))
    if e < 0:
        e = place(ent, arena, meta, b, i, np.int64(w0), np.int64(w1), np.int64(w), data, 0, len(key))
    assert e >= 0
    ent[b, e, ACC] += 1


def stored_key(table, b, row) -> bytes:
    """A key as the table holds it: up to 16 bytes in K0, K1 alone, longer ones in the bin's arena."""
    n = int(row[KEY] & KEY_LEN)
    if n <= 16:
        return row[[K0, K1]].astype("<i8").tobytes()[:n]
    o = int(row[KEY] >> KEY_BITS)
    return bytes(table.arena[b, o:o + n])


def needless_tombstones(table, b) -> int:
    """Tombstones of bin ``b`` a probe never has to pass: no live entry follows before a free slot."""
    keys = table.ent[b, :, KEY]
    n, needless = len(keys), 0
    for i in np.flatnonzero(keys == TOMB):
        j = (i + 1) % n
        while keys[j] == TOMB:
            j = (j + 1) % n
        needless += keys[j] == EMPTY
    return needless


def contents(table):
    b, e = table.select()
    return {(int(bb), stored_key(table, bb, r), int(r[WSTART])): int(r[ACC]) for bb, r in zip(b, table.ent[b, e])}


def check(table, ref) -> None:
    assert contents(table) == ref
    assert table.n_live == len(ref)
    assert (table.meta[:, N_TOMB] == (table.ent[:, :, KEY] == TOMB).sum(axis=1)).all()


@settings(max_examples=150, deadline=None)
@given(st.lists(op, max_size=200))
def test_table_matches_a_dict(ops):
    """Two tables of other shapes hold the bins between them (``owner``); ``ref`` has every entry."""
    tables = [BinnedTable(BINS, 1, 0, entries=2, arena_bytes=8), BinnedTable(BINS, 1, 0, entries=40)]
    owner, ref = np.zeros(BINS, np.int64), {}
    for o in ops:
        if o[0] == "add":
            _, b, key, w = o
            add(tables[owner[b]], b, key, w)
            ref[(b, key, w)] = ref.get((b, key, w), 0) + 1
        elif o[0] in ("fire", "take"):  # one pass over the table, or chosen entries
            got = {}
            for table in tables:
                if o[0] == "fire":
                    b, rows, koff, kdata = table.take_expired(o[1])
                    assert table.unswept.all()
                else:
                    b, e = table.select(max_wstart=o[1])
                    rows, koff, kdata = table.take(b, e)
                mine = {(int(b[j]), bytes(kdata[koff[j]:koff[j + 1]]), int(rows[WSTART, j])): int(rows[ACC, j])
                        for j in range(len(b))}
                assert len(mine) == len(b)
                got.update(mine)
            assert got == {k: v for k, v in ref.items() if k[2] <= o[1]}
            ref = {k: v for k, v in ref.items() if k[2] > o[1]}
        elif o[0] == "move":  # bins of the other table to table dst
            _, bins, dst = o
            moving = np.array(sorted(b for b in bins if owner[b] != dst), np.int64)
            tables[dst].put_bins(tables[1 - dst].take_bins(moving))
            owner[moving] = dst
        elif o[0] == "copy":  # a fresh table gets a copy of bins of table src; src is unchanged
            _, bins, src = o
            fresh = BinnedTable(BINS, 1, 0)
            fresh.put_bins(tables[src].copy_bins(None if bins is None else np.array(sorted(bins), np.int64)))
            check(fresh, {k: v for k, v in ref.items() if owner[k[0]] == src and (bins is None or k[0] in bins)})
        elif o[0] == "renew":  # table 1 hands every bin to a new table of another shape
            _, entries, arena = o
            fresh = BinnedTable(BINS, 1, 0, entries=entries, arena_bytes=arena)
            fresh.put_bins(tables[1].take_bins())
            assert tables[1].n_live == 0
            tables[1] = fresh
        elif o[0] == "sweep":
            for table in tables:  # tombstones of bins moved before a sweep are swept where they went
                table.sweep()
                assert not table.unswept.any()
                assert all(needless_tombstones(table, b) == 0 for b in range(BINS))
        else:
            tables[0].grow()
        for i, table in enumerate(tables):
            check(table, {k: v for k, v in ref.items() if owner[k[0]] == i})


def test_bins_go_by_slices_into_a_table_of_the_same_shape_and_are_rehashed_into_another():
    """Same slots per bin: the slices are assigned as they are (the arena widened without rehashing);
    other slots: the entries are rehashed in, a table with too few slots growing first."""
    keys = [b"key %d of more than sixteen bytes" % i for i in range(60)]
    src = BinnedTable(BINS, 1, 0, entries=64, arena_bytes=4096)
    for i, k in enumerate(keys):
        add(src, i % BINS, k, 0)
    ref = contents(src)
    part = src.copy_bins(np.array([0, 2]))
    assert part.ent.shape == (2, 128, ACC + 1) and part.arena.shape[1] == max(src.meta[[0, 2], 2])
    same = BinnedTable(BINS, 1, 0, entries=64, arena_bytes=8)
    add(same, 1, b"other", 3)
    same.put_bins(part)
    assert same.ent.shape[1] == 128 and (same.ent[[0, 2]] == src.ent[[0, 2]]).all()
    assert contents(same) == {**{k: v for k, v in ref.items() if k[0] in (0, 2)}, (1, b"other", 3): 1}
    small = BinnedTable(BINS, 1, 0, entries=2)  # 16 slots, one entry held: grows to the sender's slots
    add(small, 1, b"other", 3)
    small.put_bins(part)
    assert small.ent.shape[1] == 128 and contents(small) == contents(same)
    large = BinnedTable(BINS, 1, 0, entries=512)  # rehashed into 1024 slots
    add(large, 3, b"other", 3)
    large.put_bins(src.take_bins(np.array([0, 2])))
    assert large.ent.shape[1] == 1024
    assert contents(large) == {**{k: v for k, v in ref.items() if k[0] in (0, 2)}, (3, b"other", 3): 1}
    assert contents(src) == {k: v for k, v in ref.items() if k[0] not in (0, 2)}
    with pytest.raises(cep.EngineError) as held:
        large.put_bins(src.copy_bins(np.array([3])))
    assert held.value.code == "BIN_HELD"


def test_firing_a_window_keeps_the_probe_chains_of_the_next():
    """Entries of window 1 placed after window 0's in probe runs stay reachable when window 0 leaves."""
    table = BinnedTable(1, 1, 0, entries=40, arena_bytes=4096)
    keys = [b"192.168.0.%d" % i for i in range(30)]
    for w in (0, 1):
        for k in keys:
            add(table, 0, k, w)
    assert table.ent.shape[1] == 128  # 60 entries in 128 slots: runs of several entries
    table.take_expired(0)
    for k in keys:
        add(table, 0, k, 1)
    assert contents(table) == {(0, k, 1): 2 for k in keys}
    assert table.n_live == len(keys)


def test_a_bin_left_crowded_with_tombstones_is_rehashed_without_them():
    """Deletes that leave tombstones between live entries rehash the bin: no tombstone is left,
    and every remaining entry is found, counted and taken out as before."""
    table = BinnedTable(1, 1, 0, entries=100, arena_bytes=8192)  # 256 slots, 180 entries
    keys = [b"10.1.%d.%d" % (i, i * 7 % 13) for i in range(170)] + [b"a long key of more than 16 bytes %d" % i
                                                                      for i in range(10)]
    for i, k in enumerate(keys):
        add(table, 0, k, i % 2)  # windows 0 and 1 interleave in the probe runs
    table.take(*table.select(max_wstart=0))
    assert table.meta[0, N_TOMB] == 0
    for k in keys[1::2]:
        add(table, 0, k, 1)
    assert contents(table) == {(0, k, 1): 2 for k in keys[1::2]}
    _, rows, koff, kdata = table.take_expired(1)
    assert sorted(bytes(kdata[koff[j]:koff[j + 1]]) for j in range(len(koff) - 1)) == sorted(keys[1::2])


def test_growth_is_sized_by_the_fullest_bin_not_the_average():
    """An instance holds a few of the bins: room for the rows pending in its fullest bin comes in
    one rebuild (an average over all bins would ask for a sixteenth of it here)."""
    table = BinnedTable(128, 1, 0)
    pending = np.repeat(np.arange(8), 2000)  # 2,000 rows in each of 8 bins of 128
    need = fullest(pending) // 2  # half the rows: a batch repeats keys
    table.grow_for(need, need, np.zeros(len(pending) + 1, np.int64))
    assert table.ent.shape[1] * MAX_LOAD >= 1000


def test_the_fullest_bin_counts_each_distinct_entry_once():
    bins = np.array([3, 3, 3, 3, 5, 5, 5])
    assert fullest(bins) == 4
    assert fullest(bins, entries=np.array([7, 7, 8, 7, 1, 2, 3])) == 3  # bin 3: entries 7 and 8
    assert fullest(bins, weights=np.array([1, 1, 1, 1, 2, 2, 2])) == 6


def _vm_flags(address: int) -> list[str]:
    inside = False
    for line in open("/proc/self/smaps"):
        m = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
        if m:
            inside = int(m.group(1), 16) <= address < int(m.group(2), 16)
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux's /proc/self/smaps")
def test_the_slots_are_advised_huge_pages_and_the_arena_is_not():
    """Slots are probed at random: on 2 MiB pages a probe seldom misses the TLB. The arena is read
    in order, and its pages stay plain (numpy would advise huge pages for a large array)."""
    table = BinnedTable(16, 3, 0, entries=2048, arena_bytes=1 << 18)  # 4 MiB of slots, 4 MiB of arena
    assert table.ent.nbytes >= 4 << 20 and table.arena.nbytes >= 4 << 20
    assert "hg" in _vm_flags(table.ent.ctypes.data + table.ent.nbytes // 2)
    assert "hg" not in _vm_flags(table.arena.ctypes.data + table.arena.nbytes // 2)
    assert table.ent.ctypes.data % 64 == 0 and table.ent.flags.writeable
    assert (table.ent[:, :, KEY] == -1).all() and not table.ent[:, :, ACC:].any()
    z = zeroed((3, 5), np.float64, huge=True)  # smaller than a huge page: plain
    assert z.shape == (3, 5) and not z.any()


def test_a_bin_moved_between_a_fire_and_its_sweep_is_swept_where_it_went():
    """Tables of one shape take a bin's slots as they are, the fire's tombstones with them: the sweep
    that frees them is the receiving table's."""
    src, dst = BinnedTable(BINS, 1, 0, entries=64), BinnedTable(BINS, 1, 0, entries=64)
    for i in range(40):
        add(src, 0, b"10.0.0.%d" % i, i % 2)
    src.take_expired(0)
    assert needless_tombstones(src, 0) > 0
    dst.put_bins(src.take_bins(np.array([0])))
    assert dst.ent.shape == src.ent.shape and needless_tombstones(dst, 0) > 0
    dst.sweep()
    assert needless_tombstones(dst, 0) == 0
    check(dst, {(0, b"10.0.0.%d" % i, 1): 1 for i in range(1, 40, 2)})


def long_strings_on_one_key(window, aggregate_class):
    """100 rows of 10 KB on one key, their min and last, added to an ``aggregate_class`` of 128 bins in one
    batch: (the aggregate, what its add returned, the values)."""
    from sparkcep.core import columns
    q = cep.Query("long")
    op = q.stream("ev", "k string, ts timestamp, s string").aggregate(
        window, by="k", lo=cep.min("s"), last=cep.last("s")).op
    agg = aggregate_class(op.window, op.by, op.funcs, op.inputs[0].schema, op.schema, 128)
    n, ts = 100, np.arange(100, dtype=np.int64) * 1000
    values = [f"{(37 * i) % n:03d}" + "x" * 10_000 for i in range(n)]
    batch = pa.RecordBatch.from_arrays(
        [pa.array(["k"] * n), pa.array(ts, pa.timestamp("us")), pa.array(values), pa.array(np.arange(n)),
         pa.array(ts), pa.array(np.full(n, np.iinfo(np.int64).min))],
        names=["k", "ts", "s", columns.SEQ, columns.TS, columns.WM])
    return agg, agg.add(batch), values


def test_long_strings_on_one_key_widen_the_arenas_in_parts():
    """Every bin's arena is as wide as the fullest bin needs: 100 rows of 10 KB on one key, min and last,
    reserved 2 MB in each of 128 bins at once (256 MB of arenas); in parts, at most ARENA_PART_BYTES
    over all bins. The windows are the same."""
    from sparkcep.core.aggregate import WindowAggregate
    from sparkcep.core.table import ARENA_PART_BYTES
    agg, _, values = long_strings_on_one_key(cep.TimeWindow("10s"), WindowAggregate)
    assert agg.table.arena.nbytes <= ARENA_PART_BYTES + (1 << 20)
    out = pa.Table.from_batches(list(agg.fire(None))).to_pylist()
    assert [(r["lo"], r["last"]) for r in out] == [(min(values), values[-1])]


def test_a_running_aggregate_s_long_strings_widen_the_arenas_in_parts():
    """The same in a running aggregate, which reserved the same way (1,000 rows took 2.7 GB); in parts,
    it still emits one update row per group."""
    from sparkcep.core.running import RunningAggregate
    from sparkcep.core.table import ARENA_PART_BYTES
    agg, updates, values = long_strings_on_one_key(cep.Running(), RunningAggregate)
    assert agg.table.arena.nbytes <= ARENA_PART_BYTES + (1 << 20)
    out = pa.Table.from_batches(updates).to_pylist()
    assert [(r["k"], r["lo"], r["last"]) for r in out] == [("k", min(values), values[-1])]
