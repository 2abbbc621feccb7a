"""The shared reference cases (tests/cases.py) on instance managers, against the pandas reference."""

import random

import pytest

import reference as ref
import sparkcep as cep
from cases import CASES, LEFT, RIGHT, sides
from runtime_harness import run_on
from harness import chunk, run, stamped
from reference import S, assert_same_rows


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


def _lagging_sides(n, rng):
    """The right side lags 20 s behind the left in event time; sends interleave."""
    left, right = sides(n, rng)
    for r in right:
        r["ts"] -= 20 * S
    out = []
    for i in range(0, n, 9):
        out += [("l", left[i:i + 9]), ("r", right[i:i + 9])]
    return out


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shape", ["join", "union"])
def test_an_instance_fed_by_the_engine_and_a_subquery_waits_for_the_slower_watermark(shape, workers,
                                                                                   worker_engines):
    """One input comes through an upstream sub-query (a map), the other straight from the engine:
    the instance's watermark is the minimum of the two, so the lagging side still joins / counts."""
    rng = random.Random(7)
    sends = _lagging_sides(120, rng)
    q = cep.Query(f"mixed_{shape}")
    l, r = q.stream("l", LEFT), q.stream("r", RIGHT)
    window = ref.Time(10 * S)
    if shape == "join":
        q.output("out", l.map(k="k", ts="ts", a="a", s="s", name="lm")
                 .join(r, cep.TimeWindow("10s"), on="k", name="j"))
    else:
        both = l.map(k="k", ts="ts", b="a", s="s", name="lm").union(r, name="u")
        q.output("out", both.aggregate(cep.TimeWindow("10s"), by="k", name="agg", n=cep.count(), sb=cep.sum("b")))
    st = stamped(q, sends)
    if shape == "join":
        want, late = ref.join(st["l"], st["r"], LEFT, RIGHT, window, ["k"])
    else:
        lm = [{**row, "b": row["a"]} for row in st["l"]]
        want, late = ref.aggregate(ref.union_rows(lm, st["r"]), window, ["k"],
                                   [("n", "count", None), ("sb", "sum", "b")])
    got = run(q, sends, parallelism=2) if workers == 0 else run_on(worker_engines(workers), q, sends, parallelism=2)
    assert len(want) > 20
    assert_same_rows(got.outputs["out"], want, f"mixed {shape} on workers={workers}")
    assert got.late == late
