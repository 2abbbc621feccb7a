"""Aggregate functions for windowed aggregation.

``count()`` counts tuples; every other function ignores nulls and gives null
for a window-group where its field has no non-null value. ``first``/``last``
take the value of the earliest/latest tuple by (event time, source sequence
number), never by arrival order. ``sum`` of an integer field is an int64 that
wraps around past its range (as numpy's and pandas' sums do, and Spark's with
ANSI mode off): that keeps it independent of the order rows come in, on any
instance and across migrations; sum a float64 field where that range may not do.
"""

from __future__ import annotations

from sparkcep.arguments import checked
from sparkcep.errors import SchemaError
from sparkcep.query.expressions import NUMERIC
from sparkcep.schema import Schema


class AggFunc:
    def __init__(self, kind: str, field: str | None):
        self.kind, self.field = kind, field

    def output_type(self, schema: Schema) -> str:
        if self.field is None:
            return "int64"
        t = schema.type_of(self.field, f"{self.kind}()")
        if self.kind == "count":
            return "int64"
        if self.kind in ("sum", "avg") and t not in NUMERIC:
            raise SchemaError(f"{self.kind}({self.field!r}) needs a numeric field, {self.field!r} is {t}")
        if self.kind == "avg" or (self.kind == "sum" and t.startswith("float")):
            return "float64"
        if self.kind == "sum":
            return "int64"
        return t

    def __repr__(self):
        return f"{self.kind}({self.field!r})" if self.field else f"{self.kind}()"


@checked()
def count(field: str | None = None) -> AggFunc:
    """Number of tuples (or of non-null values of ``field``)."""
    return AggFunc("count", field)


@checked()
def sum(field: str) -> AggFunc:  # noqa: A001 - the name users expect
    """Sum of the non-null values."""
    return AggFunc("sum", field)


@checked()
def avg(field: str) -> AggFunc:
    """Mean of the non-null values."""
    return AggFunc("avg", field)


@checked()
def min(field: str) -> AggFunc:  # noqa: A001
    """Smallest non-null value (strings compare bytewise)."""
    return AggFunc("min", field)


@checked()
def max(field: str) -> AggFunc:  # noqa: A001
    """Largest non-null value (strings compare bytewise)."""
    return AggFunc("max", field)


@checked()
def first(field: str) -> AggFunc:
    """Non-null value of the earliest tuple by (event time, sequence number)."""
    return AggFunc("first", field)


@checked()
def last(field: str) -> AggFunc:
    """Non-null value of the latest tuple by (event time, sequence number)."""
    return AggFunc("last", field)
