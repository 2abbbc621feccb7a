"""wordcount's running count against a Counter: batches that grow the table mid-batch,
keys sharing long prefixes, and bins moved to another table between batches."""

from collections import Counter

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkcep.bench.kernels import count_table, parse_ip, running_count
from sparkcep.core import columns
from sparkcep.core.hashing import hash_words

BINS = 4
KEYS = [b"", b"a", b"1.2.3.4", b"abcdefghijklmnopq", b"abcdefghijklmnopr"] + [b"10.0.%d.%d" % (i % 7, i)
                                                                              for i in range(300)]


def kernel_input(keys):
    koff, kdata = columns.encode_keys(pa.record_batch({"ip": pa.array(keys, pa.binary()).cast(pa.string())}),
                                      ["ip"])
    h, w0, w1 = hash_words(koff, kdata)
    return h, w0, w1, koff, kdata, (h & np.uint64(BINS - 1)).astype(np.int64)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.sampled_from(KEYS), min_size=1, max_size=400),
                          st.sampled_from([None, 0, 1, 3])), min_size=1, max_size=6))
def test_running_count_matches_a_counter(batches):
    """Each batch returns, per key it holds, (last row of the key, count so far), in last-row order."""
    tables = [count_table(BINS), count_table(BINS)]
    home = {b: 0 for b in range(BINS)}  # which table holds each bin
    want = Counter()
    for keys, move in batches:
        if move is not None:  # migrate one bin to the other table
            src = home[move]
            tables[1 - src].install(move, tables[src].extract(move))
            home[move] = 1 - src
        K = kernel_input(keys)
        got = {}
        for t in (0, 1):
            rows = np.flatnonzero([home[int(b)] == t for b in K[5]])
            if len(rows):
                sub = tuple(np.ascontiguousarray(a[rows]) for a in K[:3]) + \
                    tuple(kernel_input([keys[r] for r in rows])[3:])
                last, count = running_count(tables[t], sub)
                assert (np.diff(last) > 0).all()
                got.update({keys[rows[r]]: (int(rows[r]), int(c)) for r, c in zip(last, count)})
        want.update(keys)
        expected = {k: (max(i for i, x in enumerate(keys) if x == k), want[k]) for k in set(keys)}
        assert got == expected


def test_parse_ip_takes_the_first_field_and_refuses_nulls():
    assert parse_ip(pa.array(["1.2.3.4,x,y", "no comma", ",empty"])).to_pylist() == ["1.2.3.4", "no comma", ""]
    try:
        parse_ip(pa.array(["1.2.3.4,x", None]))
    except ValueError as e:
        assert "null" in str(e)
    else:
        raise AssertionError("a null value was parsed")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="1.,ab\u00e9", max_size=40), max_size=30), st.integers(0, 3))
def test_parse_ip_equals_splitting_at_the_first_comma(values, skip):
    """Words searched 8 bytes at a time, and the bytes near the buffer's end one by one, find the
    same first field as ``str.split`` (sliced arrays included)."""
    arr = pa.array(values, pa.string()).slice(min(skip, len(values)))
    assert parse_ip(arr).to_pylist() == [v.split(",")[0] for v in arr.to_pylist()]
