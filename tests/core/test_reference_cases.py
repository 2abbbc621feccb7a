"""Every case of the shared table against the pandas reference: one send, random
chunkings, and parallel deployments."""

import random

import pytest

from cases import CASES
from harness import chunk, run, stamped
from reference import assert_same_rows


def check(case, sends, parallelism=1):
    q = case.query()
    got = run(q, sends, parallelism=parallelism)
    want = case.expect(stamped(q, sends))
    late = 0
    for out, (df, n_late) in want.items():
        assert_same_rows(got.outputs[out], df, f"{case.name}.{out} (parallelism {parallelism})")
        late += n_late
    assert got.late == late, f"{case.name}: late {got.late}, expected {late}"
    return got


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_one_batch(name):
    case = CASES[name]
    sends = case.data(300, random.Random(1))
    got = check(case, sends)
    assert sum(len(df) for df in got.outputs.values()) > 0


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("seed", [2, 3])
def test_case_chunked(name, seed):
    case = CASES[name]
    rng = random.Random(seed)
    sends = chunk(case.data(200, rng), sizes=[rng.randint(1, 40) for _ in range(7)])
    check(case, sends)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("parallelism", [2, 3])
def test_case_parallel(name, parallelism):
    case = CASES[name]
    rng = random.Random(10 + parallelism)
    sends = chunk(case.data(200, rng), sizes=[rng.randint(1, 60) for _ in range(5)])
    check(case, sends, parallelism)
