"""Float min/max order values as Java's ``Double.compare`` (Spark's order for NaN): -0.0 below 0.0,
NaN above +inf and equal to every NaN. The order is total, so a group gives the same min and max
whatever order its rows come in, in time windows, tuple windows and running aggregates alike."""

import math
import struct

from hypothesis import given
from hypothesis import strategies as st

import sparkcep as cep
from cases import T0
from harness import run

SCHEMA = {"k": "string", "ts": "timestamp", "x": "float64", "y": "float32"}
NAN = float("nan")
NEG_NAN = struct.unpack("<d", struct.pack("<Q", 0xFFF8_0000_0000_0001))[0]  # sign bit and a payload set


def order(v: float):
    """Java's ``Double.compare`` as a sort key."""
    return (1, 0.0) if math.isnan(v) else (0, v, math.copysign(1.0, v))


def reference(values: list, kind: str):
    present = [v for v in values if v is not None]
    if not present:
        return None
    return (min if kind == "min" else max)(present, key=order)


def shown(v):
    """What a comparison must tell apart: null, NaN (any bits) and the sign of a zero."""
    if v is None:
        return None
    return "NaN" if math.isnan(v) else (v, math.copysign(1.0, v))


def query(n: int) -> cep.Query:
    """Min and max of ``x`` and ``y`` per group ``k``, over the group's ``n`` rows in each window kind."""
    q = cep.Query("float_order")
    src = q.stream("ev", SCHEMA)
    funcs = dict(mnx=cep.min("x"), mxx=cep.max("x"), mny=cep.min("y"), mxy=cep.max("y"))
    for name, window in [("time", cep.TimeWindow("1h")), ("tuple", cep.TupleWindow(n)), ("running", cep.Running())]:
        q.output(name, src.aggregate(window, by="k", **funcs))
    return q


def check(orders: list[list], parallelism: int = 1):
    """Send each of ``orders`` (the same values in different orders) as a group of its own, in one batch."""
    rows = [{"k": f"g{g}", "ts": T0 + i, "x": v, "y": v} for g, vals in enumerate(orders) for i, v in enumerate(vals)]
    got = run(query(len(orders[0])), [("ev", rows)], parallelism=parallelism).arrow
    want = {kind: shown(reference(orders[0], kind)) for kind in ("min", "max")}
    for name, t in got.items():
        assert sorted(t.column("k").to_pylist()) == sorted(f"g{g}" for g in range(len(orders))), name
        for r in t.to_pylist():
            seen = {"min": [shown(r["mnx"]), shown(r["mny"])], "max": [shown(r["mxx"]), shown(r["mxy"])]}
            for kind, w in want.items():
                assert seen[kind] == [w, w], f"{name}: {kind} of {r['k']} {orders[int(r['k'][1:])]}"


def test_nan_is_above_every_value_and_negative_zero_below_zero_in_any_order():
    check([[NAN, 1.0, 2.0], [1.0, 2.0, NAN], [2.0, NAN, 1.0]])  # min 1.0, max NaN
    check([[0.0, -0.0], [-0.0, 0.0]])  # min -0.0, max 0.0
    check([[NAN, None, NEG_NAN], [None, NEG_NAN, NAN]])  # only NaNs: min and max NaN
    check([[None, -math.inf, 0.0, math.inf], [math.inf, 0.0, -math.inf, None]])


VALUES = st.one_of(st.sampled_from([NAN, NEG_NAN, -0.0, 0.0, math.inf, -math.inf, 1.5, -1.5, None]),
                   st.floats(width=32))  # float32 holds each value exactly


@given(values=st.lists(VALUES, min_size=1, max_size=8), data=st.data(), parallelism=st.sampled_from([1, 3]))
def test_min_max_of_floats_do_not_depend_on_row_order(values, data, parallelism):
    shuffled = [data.draw(st.permutations(values)) for _ in range(4)]
    by_order = sorted(values, key=lambda v: (v is None, order(v) if v is not None else ()))
    check([values, by_order, by_order[::-1], *shuffled], parallelism)
