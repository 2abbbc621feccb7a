"""Generated queries and runs for the output-id properties (``tests/core/test_ids.py`` in one
process, ``tests/runtime/test_output_ids.py`` on instance managers, which import it as
``core.id_queries`` so their workers can unpickle its functions).

Each query derives rows with equal sequence numbers (a union of two demux
branches, a join, an ``apply()`` that emits rows twice), outputs them as
``mid``, and feeds them to an order-sensitive operator (tuple window,
first/last, running aggregate, a user stateful operator) output as ``out``.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import strategies as st

import sparkcep as cep
from harness import table
from sparkcep.query.planner import plan

T0 = 1_704_067_200 * 1_000_000
EV = {"k": "string", "ts": "timestamp", "v": "int64"}
MID = "k string, ts timestamp, v int64, tag int64"
FRONTS = ("demux_union", "join", "apply_twice")
BACKS = ("none", "tuple", "time", "running", "custom")
FUNCS = {"n": cep.count(), "sv": cep.sum("v"), "fv": cep.first("v"), "lv": cep.last("v"), "ft": cep.first("tag"),
         "lt": cep.last("tag")}


def twice(batch: pa.RecordBatch) -> pa.RecordBatch:
    """An ``apply()`` function: rows with an even ``v`` come out twice, the copy tagged 2 (both
    keep the row's hidden columns, so they share its id)."""
    v = pc.fill_null(batch.column("v"), 1).to_numpy()
    rows = np.repeat(np.arange(batch.num_rows), 1 + (v % 2 == 0))
    tag = np.ones(len(rows), np.int64)
    tag[1:][rows[1:] == rows[:-1]] = 2
    return batch.take(pa.array(rows)).append_column("tag", pa.array(tag))


class Positions(cep.StatefulOperator):
    """Per key, each row with its position among the key's rows so far (order-sensitive); at the
    end, each key's count."""

    schema = "k string, n int64, v int64, tag int64"

    def process(self, batch, bins, state):
        out = []
        for k, b, v, t in zip(batch.column("k").to_pylist(), bins, batch.column("v").to_pylist(),
                              batch.column("tag").to_pylist()):
            counts = state.setdefault(int(b), {})
            counts[k] = counts.get(k, 0) + 1
            out.append((k, counts[k], v, t))
        return _rows(out)

    def on_end(self, state):
        return _rows([(k, -1, n, 0) for counts in state.values() for k, n in counts.items()])


def _rows(rows) -> pa.RecordBatch:
    k, n, v, t = zip(*rows) if rows else ([], [], [], [])
    return pa.RecordBatch.from_pydict({"k": pa.array(k, pa.string()), "n": pa.array(n, pa.int64()),
                                       "v": pa.array(v, pa.int64()), "tag": pa.array(t, pa.int64())})


def build(p) -> cep.Query:
    """The query of the drawn parameters ``p`` (see :func:`params`)."""
    q = cep.Query(p["name"])
    ev = q.stream("ev", EV)
    if p["front"] == "demux_union":
        a, b = ev.demux(cep.col("v") >= 0, (cep.col("v") >= 5) | cep.col("v").is_null(), name="d")
        mid = a.map(k="k", ts="ts", v="v", tag=cep.lit(1), name="ma") \
            .union(b.map(k="k", ts="ts", v="v", tag=cep.lit(2), name="mb"), name="u")
    elif p["front"] == "join":
        on = p["on"]
        where = cep.col("v_left") <= cep.col("v_right") if p["where"] else None
        pairs = ev.join(q.stream("ev2", EV), cep.TimeWindow(f"{p['size']}s", advance=f"{p['adv']}s"),
                        on=["k"] if on else None, where=where, name="j")
        mid = pairs.map(k="k" if on else "k_left", ts="window_end", v="v_left", tag="v_right", name="mj")
    else:
        mid = ev.apply(twice, schema=MID, name="twice")
    q.output("mid", mid)
    back, by = p["back"], p["by"]
    if back == "tuple":
        q.output("out", mid.aggregate(cep.TupleWindow(p["size"], p["adv"]), by=by, name="agg", **FUNCS))
    elif back == "time":
        q.output("out", mid.aggregate(cep.TimeWindow(f"{p['size']}s", advance=f"{p['adv']}s"), by=by, name="agg",
                                      **FUNCS))
    elif back == "running":
        q.output("out", mid.aggregate(cep.Running(), by=by, name="agg", **FUNCS))
    elif back == "custom":
        q.output("out", mid.stateful(Positions(), by="k", name="pos"))
    return q


@st.composite
def params(draw):
    size = draw(st.integers(1, 6))
    return {"front": draw(st.sampled_from(FRONTS)), "back": draw(st.sampled_from(BACKS)),
            "by": draw(st.sampled_from([[], ["k"], ["tag"], ["k", "tag"]])), "on": draw(st.sampled_from([0, 0, 1])),
            "where": draw(st.booleans()), "size": size, "adv": draw(st.integers(1, size))}


@st.composite
def sends(draw, streams):
    """Rows of each stream (a few keys, event-time ties and disorder), cut into sends, interleaved."""
    cuts = {}
    for name in streams:
        rows, t = [], 0
        for _ in range(draw(st.integers(4, 20))):
            t += draw(st.sampled_from([0, 0, 1, 1, 2]))
            rows.append({"k": draw(st.sampled_from(["a", "b", None])),
                         "ts": dt.datetime(2024, 1, 1) + dt.timedelta(seconds=t - draw(st.sampled_from([0, 0, 2]))),
                         "v": draw(st.sampled_from([None, *range(-3, 13)]))})
        cuts[name], i = [], 0
        while i < len(rows):
            n = draw(st.integers(1, 2))
            cuts[name].append((name, rows[i:i + n]))
            i += n
    out = []
    while any(cuts.values()):
        name = draw(st.sampled_from(sorted(n for n, c in cuts.items() if c)))
        out.append(cuts[name].pop(0))
    return out


def parallelism(q: cep.Query, draw) -> dict:
    """1 to 4 instances for every sub-query that can have more than one."""
    return {sq.head.name: draw(st.integers(1, 4)) if sq.parallelizable else 1 for sq in plan(q).subqueries}


def start_at(engine: cep.Engine, seq: int) -> None:
    """Make ``seq`` the engine's next sequence number (ids derive from sequence numbers: runs compared
    must number their input alike), sending padding rows into a query of their own."""
    n = seq - engine.metrics()["sequence"]
    if n > 0:
        q = cep.Query("padding")
        q.output("padding_out", q.stream("padding", "v int64").filter(cep.lit(False)))
        engine.deploy(q)
        engine.send("padding", {"v": [0] * n})
        engine.undeploy("padding")


def id_rows(engine: cep.Engine, query: cep.Query, sent, parallelism=1, bins: int = 128,
            between=None) -> dict[str, list[tuple]]:
    """Deploy ``query``, send ``sent``, end its streams; per output, every row as (fields..., __seq,
    __id), read from the output log; undeploy. ``between(dep)`` runs after each send."""
    dep = engine.deploy(query, parallelism=parallelism, bins=bins)
    try:
        for stream, rows in sent:
            engine.send(stream, table(rows, EV))
            if between is not None:
                between(dep)
        for stream in query.sources:
            engine.end(stream)
        out = {}
        for name in query.outputs:
            engine.collect(name, timeout=60)
            log = engine.outputs[name]
            first = log.earliest()
            out[name] = [tuple(r.values()) for part, end in log.latest().items()
                         for b in log.read(part, first[part], end, ids=True) for r in b.to_pylist()]
    finally:
        engine.undeploy(query.name)
    return out


def assert_same_ids(got: dict[str, list[tuple]], want: dict[str, list[tuple]], what: str) -> None:
    """Same multiset of (row, output id) per output, and output ids unique within each."""
    for name, rows in want.items():
        assert Counter(got[name]) == Counter(rows), f"{name}: {what}\n got {sorted(got[name], key=repr)}\n" \
                                                    f"want {sorted(rows, key=repr)}"
        ids = [r[-2:] for r in rows]
        assert len(set(ids)) == len(ids), f"{name}: repeated output ids {Counter(ids).most_common(2)}"
