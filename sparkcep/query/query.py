"""A continuous query: named input streams, operators, named outputs."""

from __future__ import annotations

import itertools

from sparkcep.arguments import checked
from sparkcep.errors import QueryError, SchemaError
from sparkcep.query.operators import Operator, Source, Stream, Union
from sparkcep.query.windows import duration_us
from sparkcep.schema import as_schema


class Query:
    """Build a query by declaring streams and chaining operators on them.

    >>> import sparkcep as cep
    >>> q = cep.Query("demo")
    >>> s = q.stream("events", "k string, ts timestamp, v int64")
    >>> q.output("big", s.filter(cep.col("v") > 10))
    """

    def __init__(self, name: str):
        self.name = _name("a query", name)
        self.operators: list[Operator] = []
        self.sources: dict[str, Source] = {}
        self.outputs: dict[str, Operator] = {}
        self._counter = itertools.count(1)
        self._names: set[str] = set()

    @checked()
    def stream(self, name: str, schema, time: str | None = None, max_ahead="7d") -> Stream:
        """Declare input stream ``name``; its event time is ``time`` or its first timestamp field.

        ``max_ahead``: an event time further than this ahead of the stream's
        watermark (the largest event time taken so far) is refused with an
        ``InputError`` (code ``TIME_AHEAD``); ``None``: no bound.
        """
        name = _name("a stream", name)
        if name in self.sources:
            raise QueryError(f"stream {name!r} is declared twice in query {self.name!r}")
        schema = as_schema(schema)
        if time is not None and schema.type_of(time, f"stream {name!r}") != "timestamp":
            raise SchemaError(f"time field {time!r} of stream {name!r} must be a timestamp, it is {schema.fields[time]}")
        ahead = None if max_ahead is None else duration_us(max_ahead, f"max_ahead of stream {name!r}")
        if ahead is not None and ahead <= 0:
            raise QueryError(f"max_ahead of stream {name!r} must be positive, got {max_ahead!r}")
        src = Source(self, name, schema, time or schema.time_field(), ahead)
        self._add(src)
        return Stream(src)

    @checked()
    def output(self, name: str, stream: Stream) -> None:
        """Publish ``stream`` as the output stream ``name`` (read with Engine.collect/subscribe)."""
        if not isinstance(stream, Stream) or stream.op.query is not self:
            raise QueryError(f"output {name!r}: expected a stream of query {self.name!r}, got {stream!r}")
        if isinstance(stream.op, Source):  # a stream published as it comes in: through a pass-through operator
            op = Union(self, [stream.op], None)
            self._add(op, outputs={name: op})
        else:
            self._add(outputs={name: stream.op})

    def explain(self) -> str:
        """The sub-queries, their operators and the balancer on each edge between them."""
        from sparkcep.query.planner import plan
        return plan(self).explain()

    def _add(self, *ops: Operator, outputs: dict[str, Operator] | None = None) -> None:
        """Take ``ops`` (built and checked; named, or None for a fresh name) and ``outputs`` into the query:
        the one place it grows, after every check, so a call that raises leaves it as it was."""
        outputs = outputs or {}
        for op in ops:
            if op.name in self._names:
                raise QueryError(f"operator name {op.name!r} is used twice in query {self.name!r}")
        for name in outputs:
            _name("an output", name)
            if name in self.outputs or name in self.sources:
                raise QueryError(f"output name {name!r} is already used in query {self.name!r}")
        for op in ops:
            op.name = op.name or self._fresh(op.kind)
            self._names.add(op.name)
            self.operators.append(op)
            if isinstance(op, Source):
                self.sources[op.name] = op
        self.outputs.update(outputs)

    def _fresh(self, kind: str) -> str:
        while True:
            name = f"{kind}{next(self._counter)}"
            if name not in self._names:
                return name

    def __repr__(self):
        return f"Query({self.name!r}, streams={list(self.sources)}, outputs={list(self.outputs)})"


def _name(what: str, name) -> str:
    """``name`` of a query, stream or output: a str with something in it besides spaces."""
    if not isinstance(name, str) or not name.strip():
        raise QueryError(f"{what} needs a non-empty name, got {name!r}")
    return name
