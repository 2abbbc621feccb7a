"""Property: any query, any data, any chunking — 1 to 4 instances per sub-query on 2 to 4 instance
managers give the same result multiset (and the same late counts) as parallelism 1 in one process."""

import datetime as dt

import pyarrow as pa
import pyarrow.compute  # noqa: F401
from hypothesis import given, settings
from hypothesis import strategies as st

import sparkcep as cep
from runtime_harness import run_on
from harness import run
from reference import assert_same_rows
from sparkcep.query.planner import plan

T0 = 1_704_067_200 * 1_000_000
EV = {"k": "string", "g": "int64", "ts": "timestamp", "v": "int64", "x": "float64", "s": "string"}
FUNCS = [("n", "count", None), ("nv", "count", "v"), ("sv", "sum", "v"), ("ax", "avg", "x"), ("mins", "min", "s"),
         ("maxx", "max", "x"), ("fv", "first", "v"), ("lv", "last", "v"), ("fs", "first", "s"), ("ls", "last", "s")]


class RunningCount(cep.StatefulOperator):
    """Per key, the count so far, one row per key present in each consumed batch (order-sensitive)."""

    schema = "k string, n int64"

    def process(self, batch, bins, state):
        keys, out_k, out_n = batch.column("k").to_pylist(), [], []
        seen = {}
        for k, b in zip(keys, bins):
            counts = state.setdefault(int(b), {})
            counts[k] = counts.get(k, 0) + 1
            seen[k] = counts[k]
        for k, n in seen.items():
            out_k.append(k)
            out_n.append(n)
        return pa.RecordBatch.from_pydict({"k": pa.array(out_k, pa.string()), "n": pa.array(out_n, pa.int64())})


def negate_x(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A user's stateless operator (apply): x -> -x, hidden columns kept."""
    i = batch.schema.get_field_index("x")
    return batch.set_column(i, "x", pa.compute.negate(batch.column(i)))


def window(p):
    if p["kind"] == "time":
        return cep.TimeWindow(f"{p['size']}s", advance=f"{p['adv']}s", lateness=f"{p['late']}s")
    return cep.TupleWindow(p["size"], p["adv"])


def funcs(names):
    return {n: getattr(cep, kind)(*([f] if f else [])) for n, kind, f in FUNCS if n in names}


def build(p) -> cep.Query:
    """The query described by the drawn parameters ``p`` (built afresh for every run)."""
    q = cep.Query(p["name"])
    ev = q.stream("ev", EV)
    s = ev
    if p["filter"]:
        s = s.filter((cep.col("v") > p["filter"] - 30) | cep.col("k").is_null(), name="f")
    if p["map"]:
        s = s.map(k="k", g="g", ts="ts", v=cep.col("v") * 2, x="x", s="s", name="m")
    shape = p["shape"]
    if shape == "stateless":
        a, b = s.demux(cep.col("v") > 0, cep.col("k").is_null(), name="d")
        q.output("out", a.union(b, name="u").apply(negate_x, name="neg").map(k="k", v="v", x="x", ts="ts", name="p"))
    elif shape in ("agg", "chain"):
        names = p["funcs"] | ({"n"} if shape == "chain" else set())
        out = s.aggregate(window(p["w"]), by=p["by"], name="a1", **funcs(names))
        if shape == "chain":
            w2 = p["w2"] if p["w"]["kind"] == "time" else dict(p["w2"], kind="tuple")
            by2 = [f for f in p["by"] if f == "k"]
            out = out.aggregate(window(w2), by=by2, name="a2", c=cep.count(), fv=cep.first("n"),
                                ln=cep.last("n"), sn=cep.sum("n"))
        q.output("out", out)
    elif shape == "join":
        r = q.stream("ev2", EV)
        on = p["on"]
        where = cep.col("v_left") <= cep.col("v_right") if p["where"] or not on else None
        q.output("out", s.join(r, cep.TimeWindow(f"{p['w']['size']}s", advance=f"{p['w']['adv']}s",
                                                  lateness=f"{p['w']['late']}s"),
                               on=on or None, where=where, name="j"))
    elif shape == "union":
        r = q.stream("ev2", EV)
        q.output("out", s.union(r, name="u").aggregate(window(p["w"]), by=p["by"], name="a1",
                                                       **funcs(p["funcs"])))
    else:  # custom
        q.output("out", s.stateful(RunningCount(), by="k", name="c"))
    return q


@st.composite
def params(draw):
    p = {"shape": draw(st.sampled_from(["stateless", "agg", "chain", "join", "union", "custom"])),
         "filter": draw(st.integers(0, 40)), "map": draw(st.booleans()),
         "by": draw(st.sampled_from([["k"], ["g"], ["k", "g"], []])),
         "funcs": draw(st.sets(st.sampled_from([f[0] for f in FUNCS]), min_size=1, max_size=4)),
         "on": draw(st.sampled_from([["k"], [("k", "k"), ("g", "g")], []])), "where": draw(st.booleans())}
    kind = draw(st.sampled_from(["time", "tuple"]))
    if kind == "time":
        size = draw(st.integers(1, 8))
        p["w"] = {"kind": "time", "size": size, "adv": draw(st.integers(1, size)), "late": draw(st.integers(0, 2))}
    else:
        size = draw(st.integers(1, 5))
        p["w"] = {"kind": "tuple", "size": size, "adv": draw(st.integers(1, size))}
    size2 = draw(st.integers(1, 4))
    p["w2"] = {"kind": "time", "size": 5 * size2, "adv": 5 * size2, "late": 0} if kind == "time" \
        else {"kind": "tuple", "size": size2, "adv": size2}
    if p["shape"] == "join":
        p["w"] = {"kind": "time", "size": max(2, p["w"].get("size", 2)), "adv": 1, "late": p["w"].get("late", 0)}
    return p


@st.composite
def rows(draw, n_max=80):
    n = draw(st.integers(0, n_max))
    out, t = [], T0
    for _ in range(n):
        t += draw(st.integers(0, 1_500_000))
        disorder = draw(st.sampled_from([0, 0, 0, 900_000, 2_500_000]))
        out.append({"k": draw(st.sampled_from(["a", "b", "c", "", None])), "g": draw(st.sampled_from([1, 2, None])),
                    "ts": dt.datetime.fromtimestamp((t - disorder) / 1e6, dt.timezone.utc).replace(tzinfo=None),
                    "v": draw(st.one_of(st.none(), st.integers(-50, 50))),
                    "x": draw(st.one_of(st.none(), st.floats(-100, 100, allow_nan=False))),
                    "s": draw(st.sampled_from(["alpha", "b", "é", "", None]))})
    return out


@st.composite
def sends(draw, two_streams: bool):
    streams = {"ev": draw(rows())}
    if two_streams:
        streams["ev2"] = draw(rows())
    cuts = {name: [] for name in streams}
    for name, rs in streams.items():
        i = 0
        while i < len(rs):
            n = draw(st.integers(1, 25))
            cuts[name].append((name, rs[i:i + n]))
            i += n
    out = []
    while any(cuts.values()):  # interleave the streams' sends
        name = draw(st.sampled_from(sorted(n for n, c in cuts.items() if c)))
        out.append(cuts[name].pop(0))
    return out


def parallelism(q: cep.Query, draw) -> dict:
    out = {}
    for sq in plan(q).subqueries:
        out[sq.head.name] = draw(st.integers(1, 4)) if sq.parallelizable else 1
    return out


@settings(deadline=None)  # examples: the profile of tests/conftest.py (40; 400 when thorough)
@given(p=params(), data=st.data(), workers=st.sampled_from([2, 3, 4]))
def test_parallel_run_equals_parallelism_one(p, data, worker_engines, workers):
    p["name"] = "prop"
    two = p["shape"] in ("join", "union")
    sent = data.draw(sends(two))
    want = run(build(p), sent, parallelism=1)
    q = build(p)
    par = parallelism(q, data.draw)
    got = run_on(worker_engines(workers), q, sent, parallelism=par)
    assert_same_rows(got.outputs["out"], want.outputs["out"], f"{p['shape']} parallelism {par} on {workers} IMs")
    assert got.late == want.late
