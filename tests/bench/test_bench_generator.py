"""The HiBench record generator: format and determinism."""

import ipaddress

import numpy as np
import pyarrow as pa
import pytest

from sparkcep.bench.generator import KEY_DIGITS, RECORD_SCHEMA, UserVisits, ip_pool, key_text

T0 = 1_700_000_000_000_000


def test_records_have_hibench_shape():
    g = UserVisits(seed=7, distinct_ips=500, cycle=1 << 16)
    b = g.records(0, 2000, start_us=T0, rate=1000)
    assert b.schema == RECORD_SCHEMA
    values = b.column("value").to_pylist()
    # key text (13 digits) + value = 200 bytes, as HiBench's fillArray makes them
    assert {len(v.encode()) for v in values} == {200 - KEY_DIGITS}
    assert set(len(k) for k in key_text(b.column("key").cast(pa.int64()).to_numpy()).to_pylist()) == {KEY_DIGITS}
    for v in values[:200]:
        line = v.rstrip("\0")
        fields = line.split(",")
        ipaddress.IPv4Address(fields[0])  # sourceIP first, as UserVisitParser reads it
        if len(line) < 200 - KEY_DIGITS:  # not cut: all nine uservisits fields
            assert len(fields) == 9
            assert fields[2][4] == "-" and 0 <= float(fields[3]) < 1 and 1 <= int(fields[8]) <= 10
        assert set(v[len(line):]) <= {"\0"}  # short values padded with NUL
    keys = b.column("key").cast(pa.int64()).to_numpy()
    assert (keys == T0 + np.arange(2000) * 1000).all()  # 1000 records/s: 1 ms apart


def test_deterministic_and_independent_of_chunking():
    a = UserVisits(seed=3, distinct_ips=100, cycle=1 << 16)
    b = UserVisits(seed=3, distinct_ips=100, cycle=1 << 16)
    whole = a.records(0, 150_000, start_us=T0, rate=10_000)  # crosses chunk and cycle boundaries
    parts = [b.records(s, n, start_us=T0, rate=10_000) for s, n in ((0, 7), (7, 70_000), (70_007, 79_993))]
    assert pa.Table.from_batches(parts).equals(pa.Table.from_batches([whole]))
    other = UserVisits(seed=4, distinct_ips=100, cycle=1 << 16).records(0, 1000, start_us=T0, rate=10_000)
    assert other.column("value") != whole.slice(0, 1000).column("value")


def test_ips_are_the_parsed_first_field_and_cover_the_pool():
    g = UserVisits(seed=1, distinct_ips=50, cycle=1 << 16)
    ips = g.source_ips(0, 5000).to_pylist()
    parsed = [v.split(",")[0] for v in g.values(0, 5000).to_pylist()]
    assert ips == parsed
    assert len(set(ips)) == 50
    pool = ip_pool(9, 10_000).to_pylist()
    assert len(set(pool)) == 10_000


def test_bad_parameters():
    with pytest.raises(ValueError):
        UserVisits(distinct_ips=0)
    with pytest.raises(ValueError):
        UserVisits(record_bytes=10)
