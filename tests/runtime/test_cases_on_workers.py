"""The shared reference cases (tests/cases.py) on instance managers, against the pandas reference."""

import random

import pytest

from cases import CASES
from conftest import run_on
from harness import chunk, stamped
from reference import assert_same_rows


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_on_two_instance_managers(name, worker_engines):
    case = CASES[name]
    rng = random.Random(hash(name) % 1000)
    sends = chunk(case.data(150, rng), sizes=[rng.randint(1, 50) for _ in range(5)])
    q = case.query()
    got = run_on(worker_engines(2), q, sends, parallelism=3)
    want = case.expect(stamped(q, sends))
    for out, (df, _) in want.items():
        assert_same_rows(got.outputs[out], df, f"{name}.{out} on workers")
    assert got.late == sum(n for _, n in want.values())
