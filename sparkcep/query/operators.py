"""Logical operators of a query and the :class:`Stream` handle users build with.

Stateless: Map, Filter, Demux (one branch per condition), Union, Apply (a
user function over a batch). Stateful, windowed: Aggregate, Join, and
user-defined :class:`StatefulOperator` subclasses whose state is kept per bin.
Each ``Stream`` method returns a new stream; the query records the graph.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pyarrow as pa

from sparkcep.arguments import checked, closest, unknown
from sparkcep.errors import QueryError, SchemaError
from sparkcep.query.aggregates import AggFunc
from sparkcep.query.expressions import Col, Expr, col, lit
from sparkcep.query.running import Running
from sparkcep.query.windows import TimeWindow, TupleWindow
from sparkcep.schema import Schema, as_schema


class Operator:
    """A node of the query graph. ``stateful`` operators start a sub-query."""

    kind = "operator"
    stateful = False

    def __init__(self, query, inputs: list["Operator"], schema: Schema, name: str | None):
        self.query, self.inputs, self.schema = query, inputs, schema
        self.name = name  # None: the query gives it a fresh one when it takes it (Query._add)

    @property
    def time_field(self) -> str | None:
        return self.inputs[0].time_field if self.inputs else None

    def describe(self) -> str:
        return self.kind


class Source(Operator):
    kind = "source"

    def __init__(self, query, name, schema: Schema, time: str | None, max_ahead_us: int | None = None):
        self._time = time
        self.max_ahead_us = max_ahead_us  # event times further ahead of the watermark are refused
        super().__init__(query, [], schema, name)

    @property
    def time_field(self):
        return self._time

    def describe(self):
        return f"source {self.name} ({', '.join(f'{n} {t}' for n, t in self.schema.fields.items())})"


class Map(Operator):
    kind = "map"

    def __init__(self, query, source, fields: dict[str, Expr], name):
        if not fields:
            raise QueryError("map() needs at least one output field, e.g. map(ip='ip', kb=col('bytes') / 1024)")
        self.fields = {k: (col(v) if isinstance(v, str) else v) for k, v in fields.items()}
        for k, e in self.fields.items():
            if not isinstance(e, Expr):
                hint = f" (a constant: cep.lit({e!r}))" if _is_constant(e) else ""
                raise QueryError(f"map() field {k!r}: expected a field name or expression, got {e!r}{hint}")
        schema = Schema({k: _nonnull_type(e.type(source.schema), k) for k, e in self.fields.items()})
        super().__init__(query, [source], schema, name)

    def describe(self):
        return "map(" + ", ".join(f"{k}={e!r}" for k, e in self.fields.items()) + ")"


class Filter(Operator):
    kind = "filter"

    def __init__(self, query, source, condition: Expr, name, label="filter"):
        if not isinstance(condition, Expr) or condition.type(source.schema) != "bool":
            raise QueryError(f"{label} condition must be a bool expression, got {condition!r}")
        self.condition = condition
        self.label = label
        super().__init__(query, [source], source.schema, name)

    def describe(self):
        return f"{self.label}({self.condition!r})"


class Union(Operator):
    kind = "union"

    def __init__(self, query, inputs, name):
        for other in inputs[1:]:
            if other.schema != inputs[0].schema:
                raise SchemaError(f"union needs the same schema on every input: {inputs[0].schema} vs {other.schema}")
        super().__init__(query, list(inputs), inputs[0].schema, name)

    def describe(self):
        return f"union({', '.join(i.name for i in self.inputs)})"


class Apply(Operator):
    """A user's stateless operator: ``fn(pyarrow.RecordBatch) -> pyarrow.RecordBatch``."""

    kind = "apply"

    def __init__(self, query, source, fn: Callable, schema, name):
        if not callable(fn):
            raise QueryError(f"apply() needs a function over a batch, got {fn!r}")
        self.fn, self.declared = fn, schema is not None
        super().__init__(query, [source], as_schema(schema) if schema is not None else source.schema, name)

    def describe(self):
        return f"apply({getattr(self.fn, '__name__', 'fn')})"


class Aggregate(Operator):
    kind = "aggregate"
    stateful = True

    def __init__(self, query, source, window, by: list[str], funcs: dict[str, AggFunc], name):
        if not isinstance(window, (TimeWindow, TupleWindow, Running)):
            raise QueryError(f"aggregate() needs a TimeWindow, TupleWindow or Running, got {window!r}")
        if isinstance(window, TimeWindow) and source.time_field is None:
            raise QueryError(f"TimeWindow needs an event-time (timestamp) field; stream {source.name!r} has none")
        if not funcs:
            raise QueryError("aggregate() needs at least one function, e.g. n=cep.count()")
        by = _key_fields(by, source, "aggregate()")
        fields = {} if isinstance(window, Running) else \
            {"window_start": "int64" if isinstance(window, TupleWindow) else "timestamp",
             "window_end": "int64" if isinstance(window, TupleWindow) else "timestamp"}
        for f in by:
            if f in fields:
                raise QueryError(f"aggregate() by={f!r} clashes with the window's own field {f!r}; "
                                 f"rename it first, e.g. .map({{'{f}_in': {f!r}, ...}})")
        fields.update({f: source.schema.fields[f] for f in by})
        for out, fn in funcs.items():
            if not isinstance(fn, AggFunc):
                raise QueryError(f"aggregate() {out}=: expected cep.count()/sum()/..., got {fn!r}")
            if out in fields:
                raise QueryError(f"aggregate() output field {out!r} clashes with another output field")
            fields[out] = fn.output_type(source.schema)
        self.window, self.by, self.funcs = window, by, dict(funcs)
        self.late_output: LateRows | None = None  # where its late tuples go, when kept
        super().__init__(query, [source], Schema(fields), name)

    @property
    def time_field(self):
        return "window_end" if isinstance(self.window, TimeWindow) else None

    def describe(self):
        fs = ", ".join(f"{k}={v!r}" for k, v in self.funcs.items())
        return f"aggregate({self.window!r}, by={self.by}, {fs})"


class LateRows(Operator):
    """The late tuples of a time-window aggregate, as they came in: ``aggregate(..., late="name")``.

    It runs beside its aggregate (same sub-query); the aggregate hands it the
    tuples it did not merge because their window had fired.
    """

    kind = "late"

    def __init__(self, query, aggregate: Aggregate, stream: str):
        if not isinstance(aggregate.window, TimeWindow):
            raise QueryError(f"aggregate(late=...): only a TimeWindow has late tuples, got {aggregate.window!r}")
        source = aggregate.inputs[0]
        self._time = source.time_field
        self.stream = stream  # the output stream it feeds
        super().__init__(query, [aggregate], source.schema, None)
        aggregate.late_output = self

    @property
    def time_field(self):
        return self._time

    def describe(self):
        return f"late tuples of {self.inputs[0].name}"


class Join(Operator):
    kind = "join"
    stateful = True

    def __init__(self, query, left, right, window, on, where, name):
        if not isinstance(window, TimeWindow):
            raise QueryError(f"join() needs a TimeWindow, got {window!r}")
        for side in (left, right):
            if side.time_field is None:
                raise QueryError(f"join() needs an event-time field on both inputs; {side.name!r} has none")
        pairs = _key_pairs(on)
        for lk, rk in pairs:
            lt, rt = left.schema.type_of(lk, "join left"), right.schema.type_of(rk, "join right")
            if lt != rt:
                raise SchemaError(f"join key {lk!r} ({lt}) and {rk!r} ({rt}) have different types")
        shared = {lk for lk, rk in pairs if lk == rk}
        fields, self.left_names, self.right_names = {"window_start": "timestamp", "window_end": "timestamp"}, {}, {}
        taken = {*fields, *left.schema.fields, *right.schema.fields}

        def renamed(n: str, suffix: str) -> str:  # suffixed until it names no other field (v_left may exist)
            while (n := n + suffix) in taken:
                pass
            taken.add(n)
            return n

        for n, t in left.schema.fields.items():
            clash = n in fields or (n in right.schema.fields and n not in shared)
            out = renamed(n, "_left") if clash else n
            self.left_names[n] = out
            fields[out] = t
        for n, t in right.schema.fields.items():
            if n in shared:
                continue
            out = renamed(n, "_right") if n in left.schema.fields or n in ("window_start", "window_end") else n
            self.right_names[n] = out
            fields[out] = t
        schema = Schema(fields)
        if where is not None and (not isinstance(where, Expr) or where.type(schema) != "bool"):
            raise QueryError(f"join where= must be a bool expression over the output fields {schema.names}, got {where!r}")
        self.window, self.on, self.where = window, pairs, where
        super().__init__(query, [left, right], schema, name)

    @property
    def time_field(self):
        return "window_end"

    def describe(self):
        on = ", ".join(l if l == r else f"{l}={r}" for l, r in self.on) or "-"
        return f"join({self.window!r}, on=[{on}]" + (f", where={self.where!r})" if self.where is not None else ")")


def _key_fields(by, source, what: str) -> list[str]:
    """A ``by=``: a field name or a list of them (None: none), each a field of ``source``, none twice."""
    if by is None:
        return []
    fields = [by] if isinstance(by, str) else list(by) if isinstance(by, Iterable) and not isinstance(by, dict) else None
    if fields is None or not all(isinstance(f, str) for f in fields):
        raise QueryError(f"{what} by={by!r}: expected a field name or a list of them, e.g. by=[\"ip\", \"day\"]")
    for f in fields:
        source.schema.type_of(f, f"{what.rstrip('()')} by=")
    twice = sorted({f for f in fields if fields.count(f) > 1})
    if twice:
        raise QueryError(f"{what} by={by!r} names {', '.join(map(repr, twice))} more than once")
    return fields


def _key_pairs(on) -> list[tuple[str, str]]:
    """join()'s ``on``: a field, or a list of fields and (left field, right field) pairs."""
    if on is None:
        return []
    items = [on] if isinstance(on, str) else list(on) if isinstance(on, Iterable) and not isinstance(on, dict) else None
    pairs = [(p, p) if isinstance(p, str) else tuple(p) if isinstance(p, (list, tuple)) else None
             for p in items or ()]
    if items is None or any(p is None or len(p) != 2 or not all(isinstance(f, str) for f in p) for p in pairs):
        raise QueryError(f"join on={on!r}: expected a field name, or a list of field names and (left field, "
                         'right field) pairs, e.g. on=["k", ("user", "user_id")]')
    return pairs


class StatefulOperator:
    """Base for a user's stateful operator; the engine keeps its state per bin.

    Subclass it and pass an instance to ``Stream.stateful(op, by=[...])``. The
    engine routes tuples by ``by`` so one bin's tuples always reach the same
    instance, and migration moves bins' parts of the state between
    instances. By default the state is a dict ``bin -> any picklable value``;
    an operator that keeps all its bins in one structure (one hash table, say)
    overrides :meth:`new_state`, :meth:`extract` and :meth:`install`.

    Moving bins calls :meth:`extract` once per bin on the old owner (every
    bin of the query when all its bins move) and :meth:`install` per bin on
    the new one. Copying them (a replica catching up) calls :meth:`extract`,
    :meth:`install` of the same value back, and ``copy.deepcopy`` of it: so
    values must be deep-copyable, and extracting then installing a value
    must leave the state as it was.

    Output ids (:mod:`sparkcep.core.ids`): the rows a call returns get
    ``__seq`` = the frontier of the progress step that made the call, and an
    ``__id`` from (operator, which call, the row's values, its occurrence
    among equal rows of that call). They are the same at every parallelism
    and in every replica when the operator (1) computes each bin's rows from
    that bin's input and state only, in the order given (an instance holds
    any subset of the bins), and (2) never returns, in one call, equal rows
    for different bins (emit the key with them): equal rows are numbered by
    occurrence, which only the instance holding both can see.
    """

    #: the schema of the rows this operator emits; every subclass defines it
    schema: "Schema | dict | str"

    def new_state(self, bins: int):
        """The empty state of one instance; ``bins``: how many bins the query has."""
        return {}

    def process(self, batch: pa.RecordBatch, bins, state) -> pa.RecordBatch | None:
        """Called with each batch of input in (sequence number, output id) order; ``bins[i]`` is row i's bin."""
        raise NotImplementedError

    def on_watermark(self, watermark_us: int, state) -> pa.RecordBatch | None:
        """Called when the event-time watermark advances; default: nothing to emit."""
        return None

    def on_end(self, state) -> pa.RecordBatch | None:
        """Called at end of input; default: nothing to emit."""
        return None

    def extract(self, state, bin: int):
        """Remove and return the part of ``state`` that belongs to ``bin`` (None: nothing)."""
        return state.pop(bin, None)

    def install(self, state, bin: int, value) -> None:
        """Add ``value``, taken by :meth:`extract` from another instance's state, as bin ``bin``."""
        if value is not None:
            state[bin] = value


class Custom(Operator):
    kind = "custom"
    stateful = True

    def __init__(self, query, source, op: StatefulOperator, by, name):
        if not isinstance(op, StatefulOperator):
            raise QueryError(f"stateful() needs a StatefulOperator instance, got {op!r}")
        self.op = op
        self.by = _key_fields(by, source, "stateful()")
        if getattr(op, "schema", None) is None:
            raise QueryError(f"stateful(): {type(op).__name__} defines no `schema`; a StatefulOperator subclass must "
                             "define it, the fields of the rows it emits (e.g. schema = \"k string, n int64\" in the "
                             "class body)")
        super().__init__(query, [source], as_schema(op.schema), name)

    def describe(self):
        return f"stateful({type(self.op).__name__}, by={self.by})"


class Stream:
    """A stream of a query under construction; every method returns a new stream."""

    def __init__(self, op: Operator):
        self.op = op

    @property
    def schema(self) -> Schema:
        return self.op.schema

    @property
    def name(self) -> str:
        return self.op.name

    @checked()
    def filter(self, condition: Expr, name: str | None = None) -> "Stream":
        """Keep the tuples where ``condition`` is true (null counts as false)."""
        return self._then(Filter(self.op.query, self.op, condition, name))

    def map(self, fields: dict | None = None, /, name: str | None = None, **more) -> "Stream":
        """Project to exactly ``fields``: each a source field name or an expression; as keywords,
        or as a dict for names a keyword cannot be (``map({"name": "name"})``)."""
        clash = set(fields or {}) & set(more)
        if clash:
            raise QueryError(f"map() field {sorted(clash)[0]!r} is given twice, in the dict and as a keyword")
        return self._then(Map(self.op.query, self.op, {**(fields or {}), **more}, name))

    @checked()
    def demux(self, *conditions: Expr, name: str | None = None) -> tuple["Stream", ...]:
        """One stream per condition; a tuple goes to every branch whose condition holds."""
        if not conditions:
            raise QueryError("demux() needs at least one condition")
        query = self.op.query
        branches = [Filter(query, self.op, c, None, label=f"demux[{i}]") for i, c in enumerate(conditions)]
        base = name or query._fresh("demux")
        for i, branch in enumerate(branches):
            branch.name = f"{base}[{i}]"
        query._add(*branches)
        return tuple(Stream(b) for b in branches)

    @checked()
    def union(self, *others: "Stream", name: str | None = None) -> "Stream":
        """All tuples of this stream and ``others`` (same schema required)."""
        return self._then(Union(self.op.query, [self.op] + [o.op for o in _streams(others, self)], name))

    @checked()
    def apply(self, fn: Callable, schema=None, name: str | None = None) -> "Stream":
        """A user's stateless operator: ``fn(batch) -> batch`` (``schema``: its output schema, whose
        fields are taken from the returned batch by name and cast to their types; without it the input's,
        and a returned field outside it is refused).

        The batch carries the engine's hidden columns; the rows returned keep
        them (``filter``/``take``/``append_column`` do), and so their output
        ids: a row returned more than once gets a new id for each repeat.
        """
        return self._then(Apply(self.op.query, self.op, fn, schema, name))

    def aggregate(self, window=None, by=(), name: str | None = None, late: str | None = None,
                  **funcs: AggFunc) -> "Stream":
        """Windowed aggregation: one row per window and group, see :mod:`sparkcep.query.aggregates`;
        with :class:`~sparkcep.query.running.Running`, one row per group after each batch that updated it.

        ``late="name"`` (time windows): the tuples that came after their window
        fired are kept in the output stream ``name``, as they came in.
        """
        for key, fn in funcs.items():  # a keyword that is no function: maybe a misspelled argument (window too)
            if not isinstance(fn, AggFunc) and closest(key, AGGREGATE_ARGS):
                raise unknown("aggregate", key, AGGREGATE_ARGS)
        query = self.op.query
        agg = Aggregate(query, self.op, window, by, funcs, name)
        if late is None:
            return self._then(agg)
        rows = LateRows(query, agg, late)
        query._add(agg, rows, outputs={late: rows})
        return Stream(agg)

    @checked()
    def join(self, other: "Stream", window: TimeWindow, on=None, where: Expr | None = None,
             name: str | None = None) -> "Stream":
        """Windowed join: pairs sharing a window instance whose keys are equal and ``where`` holds."""
        (other,) = _streams([other], self)
        return self._then(Join(self.op.query, self.op, other.op, window, on, where, name))

    @checked()
    def stateful(self, op: StatefulOperator, by=(), name: str | None = None) -> "Stream":
        """A user's stateful operator, its state kept per bin of ``by``."""
        return self._then(Custom(self.op.query, self.op, op, by, name))

    def _then(self, op: Operator) -> "Stream":
        """The stream of ``op`` (built and checked), taken into the query."""
        self.op.query._add(op)
        return Stream(op)

    def __repr__(self):
        return f"Stream({self.name!r}, {self.schema})"


AGGREGATE_ARGS = ("window", "by", "name", "late")


def _is_constant(value) -> bool:
    """Whether ``value`` is a constant :func:`sparkcep.query.expressions.lit` takes (but None, which has
    no type)."""
    try:
        lit(value)
    except QueryError:
        return False
    return value is not None


def _streams(others, me: Stream) -> list[Stream]:
    for o in others:
        if not isinstance(o, Stream):
            raise QueryError(f"expected a Stream, got {o!r}")
        if o.op.query is not me.op.query:
            raise QueryError(f"stream {o.name!r} belongs to another query")
    return list(others)


def _nonnull_type(t: str, field: str) -> str:
    if t == "null":
        raise SchemaError(f"map() field {field!r} is a bare null literal; its type is unknown")
    return t


__all__ = ["Operator", "Source", "Map", "Filter", "Union", "Apply", "Aggregate", "LateRows", "Join",
           "Custom", "StatefulOperator", "Stream", "Col"]
