"""One table of reference cases: a sparkcep query, a data generator, and the
reference result. Tests run each case at several sizes, chunkings and
parallelisms; benchmarks can run the same cases on large data.

>>> case = CASES["tumbling_all_functions"]
>>> sends = case.data(100, random.Random(0))
>>> q = case.query()                        # a sparkcep.Query
>>> want = case.expect(stamped(q, sends))   # {output: (DataFrame, late)}
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

import sparkcep as cep
import reference as ref
from reference import S

T0 = 1_704_067_200 * S  # 2024-01-01 00:00:00 UTC in microseconds
KEYS = ["10.0.0.1", "10.0.0.10", "10.0.0.100", "10.0.0.2", "a", "", None]
WORDS = ["alpha", "alp", "beta", "bet", "é", "Z", "", None]


def event_times(n: int, rng: random.Random, step_s: float = 0.7, disorder_s: float = 0.0, ties: float = 0.2):
    """Event times (us): a random walk with ties, each displaced back by up to ``disorder_s``."""
    out, t = [], T0
    for _ in range(n):
        if rng.random() > ties:
            t += int(rng.random() * 2 * step_s * S)
        out.append(t - int(rng.random() * disorder_s * S))
    return out


def maybe(rng, value, p_null=0.15):
    return None if rng.random() < p_null else value


def events(n: int, rng: random.Random, disorder_s: float = 0.0, keys=KEYS):
    """Rows of ``EVENTS``."""
    return [{"k": rng.choice(keys), "g": maybe(rng, rng.randint(-2, 2)), "ts": ts,
             "v": maybe(rng, rng.randint(-50, 50)), "x": maybe(rng, round(rng.uniform(-100, 100), 3)),
             "s": rng.choice(WORDS)}
            for ts in event_times(n, rng, disorder_s=disorder_s)]


EVENTS = {"k": "string", "g": "int64", "ts": "timestamp", "v": "int64", "x": "float64", "s": "string"}
LEFT = {"k": "string", "ts": "timestamp", "a": "int64", "s": "string"}
RIGHT = {"k": "string", "ts": "timestamp", "b": "int64", "s": "string"}


def sides(n: int, rng: random.Random, disorder_s: float = 0.0):
    left = [{"k": rng.choice(KEYS), "ts": ts, "a": maybe(rng, rng.randint(0, 20)), "s": rng.choice(WORDS)}
            for ts in event_times(n, rng, step_s=1.5, disorder_s=disorder_s)]
    right = [{"k": rng.choice(KEYS), "ts": ts, "b": maybe(rng, rng.randint(0, 20)), "s": rng.choice(WORDS)}
             for ts in event_times(n, rng, step_s=1.5, disorder_s=disorder_s)]
    return left, right


ALL_FUNCS = [("n", "count", None), ("nv", "count", "v"), ("sv", "sum", "v"), ("sx", "sum", "x"),
             ("ax", "avg", "x"), ("av", "avg", "v"), ("mins", "min", "s"), ("maxs", "max", "s"),
             ("minv", "min", "v"), ("maxx", "max", "x"), ("fv", "first", "v"), ("ls", "last", "s"),
             ("fs", "first", "s"), ("lx", "last", "x")]


def cep_funcs(funcs):
    """The sparkcep aggregate functions for reference ``funcs`` [(name, kind, field)]."""
    return {name: getattr(cep, kind)(*([f] if f else [])) for name, kind, f in funcs}


def cep_window(w):
    if isinstance(w, ref.Time):
        return cep.TimeWindow(f"{w.size}us", advance=f"{w.advance}us", lateness=f"{w.lateness}us")
    return cep.TupleWindow(w.size, w.advance)


def cep_expr(e: ref.E):
    """The sparkcep expression for a reference expression."""
    if isinstance(e, ref.Col):
        return cep.col(e.name)
    if isinstance(e, ref.Lit):
        return cep.lit(e.value)
    if isinstance(e, ref.Not):
        return ~cep_expr(e.operand)
    if isinstance(e, ref.IsNull):
        return cep_expr(e.operand).is_null()
    if isinstance(e, ref.StartsWith):
        return cep_expr(e.operand).startswith(e.prefix)
    a, b = cep_expr(e.left), cep_expr(e.right)
    return {"+": a.__add__, "-": a.__sub__, "*": a.__mul__, "/": a.__truediv__, "%": a.__mod__,
            "==": a.__eq__, "!=": a.__ne__, "<": a.__lt__, "<=": a.__le__, ">": a.__gt__, ">=": a.__ge__,
            "&": a.__and__, "|": a.__or__}[e.op](b)


@dataclass
class Case:
    name: str
    query: Callable[[], cep.Query]
    data: Callable[[int, random.Random], list]          # (n, rng) -> sends
    expect: Callable[[ref.Streams], dict]                # stamped -> {output: (DataFrame, late)}


CASES: dict[str, Case] = {}


def case(name, data):
    def register(fn):
        q_fn, expect = fn()
        CASES[name] = Case(name, q_fn, data, expect)
        return fn
    return register


def _events(n, rng):
    return [("ev", events(n, rng))]


def _events_disordered(n, rng):
    return [("ev", events(n, rng, disorder_s=2.5))]


def _sides(n, rng):
    left, right = sides(n, rng)
    return [("l", left), ("r", right)]


def _sides_disordered(n, rng):
    """Both inputs out of order by up to 4 s, sent interleaved in small batches."""
    left, right = sides(n, rng, disorder_s=4.0)
    cut = lambda rows: [rows[i:i + 7] for i in range(0, len(rows), 7)]  # noqa: E731
    out = []
    for a, b in zip(cut(left), cut(right)):
        out += [("l", a), ("r", b)]
    return out


def _two_streams(n, rng):
    """Two streams of EVENTS; the second starts late and lags behind in event time."""
    a, b = events(n, rng, disorder_s=1.5), events(n // 2, rng, disorder_s=1.5)
    out = [("ev", a[: n // 3])]
    for i in range(n // 3, n, 20):
        out.append(("ev", a[i:i + 20]))
        j = (i - n // 3) // 2
        out.append(("ev2", b[j:j + 10]))
    return out


# --- stateless ---------------------------------------------------------------------------
FILTER = ref.Bin("|", ref.Bin("&", ref.Bin("!=", ref.Bin("%", ref.Col("v"), ref.Lit(3)), ref.Lit(0)),
                              ref.Not(ref.StartsWith(ref.Col("k"), "10.0.0.1"))),
                 ref.IsNull(ref.Col("k")))
MAP = {"k": ref.Col("k"), "kb": ref.Bin("/", ref.Col("x"), ref.Col("v")),
       "v2": ref.Bin("+", ref.Bin("*", ref.Col("v"), ref.Lit(2)), ref.Col("g")),
       "big": ref.Bin(">=", ref.Col("s"), ref.Lit("b")), "ts": ref.Col("ts")}


@case("filter_map", _events)
def _filter_map():
    def query():
        q = cep.Query("filter_map")
        s = q.stream("ev", EVENTS)
        q.output("out", s.filter(cep_expr(FILTER)).map(**{k: cep_expr(e) for k, e in MAP.items()}))
        return q

    def expect(st):
        rows = ref.map_rows(ref.filter_rows(st["ev"], FILTER), MAP)
        return {"out": (ref.frame(rows, MAP), 0)}
    return query, expect


DEMUX = [ref.Bin(">", ref.Col("v"), ref.Lit(10)), ref.StartsWith(ref.Col("k"), "10.0.0.1"),
         ref.Bin("<", ref.Col("s"), ref.Col("k"))]


@case("demux_union", _events)
def _demux_union():
    def query():
        q = cep.Query("demux_union")
        s = q.stream("ev", EVENTS)
        a, b, c = s.demux(*[cep_expr(d) for d in DEMUX])
        q.output("a", a)
        q.output("bc", b.union(c))
        return q

    def expect(st):
        a, b, c = ref.demux_rows(st["ev"], *DEMUX)
        return {"a": (ref.frame(a, EVENTS), 0), "bc": (ref.frame(ref.union_rows(b, c), EVENTS), 0)}
    return query, expect


# --- aggregates -------------------------------------------------------------------------
def _agg_case(name, window, by, funcs=ALL_FUNCS, data=_events, pre=None):
    @case(name, data)
    def _():
        def query():
            q = cep.Query(name)
            s = q.stream("ev", EVENTS)
            if pre is not None:
                s = s.filter(cep_expr(pre))
            q.output("out", s.aggregate(cep_window(window), by=by, **cep_funcs(funcs)))
            return q

        def expect(st):
            rows = st["ev"] if pre is None else ref.filter_rows(st["ev"], pre)
            return {"out": ref.aggregate(rows, window, by, funcs)}
        return query, expect


_agg_case("tumbling_all_functions", ref.Time(10 * S), ["k"])
_agg_case("sliding_two_keys_lateness", ref.Time(10 * S, 4 * S, lateness=2 * S), ["k", "g"],
          data=_events_disordered)
_agg_case("sliding_late_tuples", ref.Time(6 * S, 3 * S), ["s"], data=_events_disordered)
_agg_case("global_tumbling", ref.Time(5 * S), [], data=_events_disordered)
_agg_case("tuple_sliding", ref.Tuples(3, 2), ["k"])
_agg_case("tuple_global", ref.Tuples(4), [])
_agg_case("int_key_after_filter", ref.Time(7 * S, 7 * S, lateness=S), ["g"],
          pre=ref.Bin(">", ref.Col("x"), ref.Lit(-50.0)), data=_events_disordered)


# --- joins ------------------------------------------------------------------------------
def _join_case(name, window, on, where=None, data=_sides):
    @case(name, data)
    def _():
        def query():
            q = cep.Query(name)
            l, r = q.stream("l", LEFT), q.stream("r", RIGHT)
            q.output("out", l.join(r, cep_window(window), on=on or None,
                                   where=None if where is None else cep_expr(where)))
            return q

        def expect(st):
            return {"out": ref.join(st["l"], st["r"], LEFT, RIGHT, window, on or (), where)}
        return query, expect


_join_case("equi_join_tumbling", ref.Time(10 * S), ["k"])
_join_case("equi_join_sliding_where", ref.Time(10 * S, 5 * S), ["k"],
           where=ref.Bin("<", ref.Col("a"), ref.Col("b")))
_join_case("theta_join", ref.Time(4 * S, 2 * S), [],
           where=ref.Bin("&", ref.Bin("<=", ref.Col("a"), ref.Col("b")), ref.Bin("==", ref.Col("s_left"), ref.Col("s_right"))))
_join_case("two_key_join", ref.Time(8 * S), [("k", "k"), ("s", "s")])
_join_case("equi_join_sliding_late", ref.Time(6 * S, 2 * S, lateness=S), ["k"], data=_sides_disordered)
_join_case("theta_join_late", ref.Time(6 * S, 3 * S), [], where=ref.Bin(">", ref.Col("a"), ref.Col("b")),
           data=_sides_disordered)


@case("union_two_streams_aggregate", _two_streams)
def _union_aggregate():
    window, funcs = ref.Time(5 * S, lateness=S), [("n", "count", None), ("sv", "sum", "v"), ("ls", "last", "s")]

    def query():
        q = cep.Query("union_two_streams_aggregate")
        a, b = q.stream("ev", EVENTS), q.stream("ev2", EVENTS)
        q.output("out", a.union(b).aggregate(cep_window(window), by=["k"], **cep_funcs(funcs)))
        return q

    def expect(st):
        return {"out": ref.aggregate(ref.union_rows(st["ev"], st["ev2"]), window, ["k"], funcs)}
    return query, expect
