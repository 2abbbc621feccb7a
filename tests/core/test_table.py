"""BinnedTable under churn: inserts, deletes (tombstones freed in runs, wrap-around
included), takes, rebuilds and bin moves, against a dict of (bin, key, window) -> count."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkcep.core.hashing import hash_key
from sparkcep.core.table import ACC, K0, K1, KEY, KEY_BITS, KEY_LEN, N_TOMB, WSTART, BinnedTable, find_slot, key_bytes, place, room, slot_hash

BINS = 2
KEYS = [b"", b"a", b"b", b"abcdefghijklmnopq", b"abcdefghijklmnopr", b"1.2.3.4", b"\x00", b"\x00\x00"] + \
    [b"10.0.0.%d" % i for i in range(12)]

op = st.one_of(
    st.tuples(st.just("add"), st.integers(0, BINS - 1), st.sampled_from(KEYS), st.integers(0, 5)),
    st.tuples(st.just("fire"), st.integers(0, 5)),
    st.tuples(st.just("take"), st.integers(0, 5)),
    st.tuples(st.just("move"), st.integers(0, BINS - 1), st.integers(0, BINS - 1)),
    st.tuples(st.just("grow"),),
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


def contents(table):
    b, e = table.select()
    return {(int(bb), stored_key(table, bb, r), int(r[WSTART])): int(r[ACC]) for bb, r in zip(b, table.ent[b, e])}


@settings(max_examples=150, deadline=None)
@given(st.lists(op, max_size=200))
def test_table_matches_a_dict(ops):
    table, ref = BinnedTable(BINS, 1, 0, entries=2, arena_bytes=8), {}
    for o in ops:
        if o[0] == "add":
            _, b, key, w = o
            add(table, b, key, w)
            ref[(b, key, w)] = ref.get((b, key, w), 0) + 1
        elif o[0] in ("fire", "take"):  # one pass over the table, or chosen entries
            if o[0] == "fire":
                b, rows, koff, kdata = table.take_expired(o[1])
            else:
                b, e = table.select(max_wstart=o[1])
                rows, koff, kdata = table.take(b, e)
            got = {(int(b[j]), bytes(kdata[koff[j]:koff[j + 1]]), int(rows[WSTART, j])): int(rows[ACC, j])
                   for j in range(len(b))}
            assert len(got) == len(b)
            assert got == {k: v for k, v in ref.items() if k[2] <= o[1]}
            ref = {k: v for k, v in ref.items() if k[2] > o[1]}
        elif o[0] == "move":
            _, src, dst = o
            state = table.extract(src)
            table.install(dst, state)
            moved = {(dst, k, w): v for (b, k, w), v in ref.items() if b == src}
            ref = {k: v for k, v in ref.items() if k[0] != src}
            ref.update(moved)  # an installed entry replaces the one it meets
        else:
            table.grow()
        assert contents(table) == ref
        assert table.n_live == len(ref)


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
    b, e = table.select(max_wstart=0)
    table.delete(b, e)
    assert table.meta[0, N_TOMB] == 0
    for k in keys[1::2]:
        add(table, 0, k, 1)
    assert contents(table) == {(0, k, 1): 2 for k in keys[1::2]}
    _, rows, koff, kdata = table.take_expired(1)
    assert sorted(bytes(kdata[koff[j]:koff[j + 1]]) for j in range(len(koff) - 1)) == sorted(keys[1::2])
