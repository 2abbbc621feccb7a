"""Expressions over the fields of a stream: columns, literals, arithmetic,
comparisons, boolean logic, ``is_null``, string ``startswith`` and ``split_part``.

Expressions are descriptions; :mod:`sparkcep.core.evaluate` runs them over
columnar batches. Nulls propagate through arithmetic and comparisons;
``&``/``|`` follow SQL's three-valued logic; division or modulo by zero
gives null; int64 arithmetic wraps around past its range, as numpy's does.

>>> (col("bytes") / 1024 > 1) & ~col("ip").startswith("10.")
((col('bytes') / 1024) > 1) & ~col('ip').startswith('10.')
"""

from __future__ import annotations

import datetime as dt

from sparkcep.arguments import integer, scalar
from sparkcep.errors import QueryError, SchemaError
from sparkcep.schema import Schema

NUMERIC = ("int32", "int64", "float32", "float64")
ARITH = ("+", "-", "*", "/", "%")
COMPARE = ("==", "!=", "<", "<=", ">", ">=")


class Expr:
    """Base of every expression node."""

    def type(self, schema: Schema) -> str:
        raise NotImplementedError

    def columns(self) -> set[str]:
        return set().union(*(c.columns() for c in self.children()))

    def children(self) -> tuple["Expr", ...]:
        return ()

    # arithmetic
    def __add__(self, o): return BinOp("+", self, wrap(o))
    def __radd__(self, o): return BinOp("+", wrap(o), self)
    def __sub__(self, o): return BinOp("-", self, wrap(o))
    def __rsub__(self, o): return BinOp("-", wrap(o), self)
    def __mul__(self, o): return BinOp("*", self, wrap(o))
    def __rmul__(self, o): return BinOp("*", wrap(o), self)
    def __truediv__(self, o): return BinOp("/", self, wrap(o))
    def __rtruediv__(self, o): return BinOp("/", wrap(o), self)
    def __mod__(self, o): return BinOp("%", self, wrap(o))
    def __rmod__(self, o): return BinOp("%", wrap(o), self)
    def __neg__(self): return BinOp("-", Lit(0), self)
    # comparisons
    def __eq__(self, o): return BinOp("==", self, wrap(o))  # type: ignore[override]
    def __ne__(self, o): return BinOp("!=", self, wrap(o))  # type: ignore[override]
    def __lt__(self, o): return BinOp("<", self, wrap(o))
    def __le__(self, o): return BinOp("<=", self, wrap(o))
    def __gt__(self, o): return BinOp(">", self, wrap(o))
    def __ge__(self, o): return BinOp(">=", self, wrap(o))
    # boolean logic
    def __and__(self, o): return BinOp("&", self, wrap(o))
    def __rand__(self, o): return BinOp("&", wrap(o), self)
    def __or__(self, o): return BinOp("|", self, wrap(o))
    def __ror__(self, o): return BinOp("|", wrap(o), self)
    def __invert__(self): return Not(self)

    def __bool__(self):
        raise QueryError("an expression has no truth value; combine conditions with & | ~, not and/or/not")

    __hash__ = object.__hash__

    def is_null(self) -> "Expr":
        """True where the value is null (never null itself)."""
        return IsNull(self)

    def startswith(self, prefix: str) -> "Expr":
        """True where a string value starts with ``prefix``."""
        if not isinstance(prefix, str):
            raise QueryError(f"startswith takes a str prefix, got {prefix!r}")
        return StartsWith(self, prefix)

    def split_part(self, delimiter: str, part: int) -> "Expr":
        """Field ``part`` of a string cut at every ``delimiter``, as Spark's ``split_part``:
        from 1 (negative: from the end); past the last field, the empty string.

        >>> col("value").split_part(",", 1)  # HiBench's source IP
        col('value').split_part(',', 1)
        """
        return SplitPart(self, delimiter, part)


class Col(Expr):
    def __init__(self, name: str):
        if not isinstance(name, str):
            raise QueryError(f"col() takes a field name, got {name!r}")
        self.name = name

    def type(self, schema):
        return schema.type_of(self.name, "expression")

    def columns(self):
        return {self.name}

    def __repr__(self):
        return f"col({self.name!r})"


class Lit(Expr):
    def __init__(self, value):
        value = scalar(value)
        if isinstance(value, dt.datetime):
            value = _to_us(value)
            self.kind = "timestamp"
        elif isinstance(value, bool):
            self.kind = "bool"
        elif isinstance(value, int):
            if not -2**63 <= value < 2**63:
                raise QueryError(f"integer literal {value} does not fit in int64, the engine's integer type")
            self.kind = "int64"
        elif isinstance(value, float):
            self.kind = "float64"
        elif isinstance(value, str):
            self.kind = "string"
        elif value is None:
            self.kind = "null"
        else:
            raise QueryError(f"unsupported literal {value!r} ({type(value).__name__})")
        self.value = value

    def type(self, schema):
        return self.kind

    def __repr__(self):
        if self.kind == "timestamp":
            return f"timestamp({_from_us(self.value)!r})"
        return repr(self.value)


class BinOp(Expr):
    def __init__(self, op: str, left: Expr, right: Expr):
        self.op, self.left, self.right = op, left, right

    def children(self):
        return (self.left, self.right)

    def type(self, schema):
        lt, rt = self.left.type(schema), self.right.type(schema)
        where = f"{self!r}"
        if self.op in ARITH:
            if "null" in (lt, rt):
                return "float64" if "float" in lt + rt or self.op == "/" else "int64"
            if lt == "timestamp" or rt == "timestamp":
                if self.op in "+-" and {lt, rt} <= {"timestamp", "int64", "int32"}:
                    return "int64"
            elif lt in NUMERIC and rt in NUMERIC:
                if self.op == "/" or "float" in lt + rt:
                    return "float64"
                return "int64"
            raise SchemaError(f"cannot apply {self.op!r} to {lt} and {rt} in {where}")
        if self.op in COMPARE:
            if lt == rt or "null" in (lt, rt) or (lt in NUMERIC and rt in NUMERIC) \
                    or {lt, rt} <= {"timestamp", "int64", "int32"}:
                return "bool"
            raise SchemaError(f"cannot compare {lt} with {rt} in {where}")
        if self.op in "&|":
            if {lt, rt} <= {"bool", "null"}:
                return "bool"
            raise SchemaError(f"{self.op!r} needs bool operands, got {lt} and {rt} in {where}")
        raise QueryError(f"unknown operator {self.op!r}")

    def __repr__(self):
        return f"({self.left!r} {self.op} {self.right!r})" if self.op not in "&|" else f"{self.left!r} {self.op} {self.right!r}"


class Not(Expr):
    def __init__(self, operand: Expr):
        self.operand = operand

    def children(self):
        return (self.operand,)

    def type(self, schema):
        t = self.operand.type(schema)
        if t not in ("bool", "null"):
            raise SchemaError(f"~ needs a bool operand, got {t} in {self!r}")
        return "bool"

    def __repr__(self):
        return f"~{self.operand!r}"


class IsNull(Expr):
    def __init__(self, operand: Expr):
        self.operand = operand

    def children(self):
        return (self.operand,)

    def type(self, schema):
        self.operand.type(schema)
        return "bool"

    def __repr__(self):
        return f"{self.operand!r}.is_null()"


class StartsWith(Expr):
    def __init__(self, operand: Expr, prefix: str):
        self.operand, self.prefix = operand, prefix

    def children(self):
        return (self.operand,)

    def type(self, schema):
        t = self.operand.type(schema)
        if t != "string":
            raise SchemaError(f"startswith needs a string, got {t} in {self!r}")
        return "bool"

    def __repr__(self):
        return f"{self.operand!r}.startswith({self.prefix!r})"


MAX_PART = 2**31 - 1  # a string holds fewer bytes than this (Arrow's 32-bit offsets), so fewer fields


class SplitPart(Expr):
    def __init__(self, operand: Expr, delimiter: str, part: int):
        if not isinstance(delimiter, str):
            raise QueryError(f"split_part takes a str delimiter, got {delimiter!r}")
        part = integer(part, "split_part's part number (from 1, or from -1 at the end)", -MAX_PART, MAX_PART)
        if part == 0:
            raise QueryError("split_part takes a part number from 1 (or from -1 at the end), got 0")
        self.operand, self.delimiter, self.part = operand, delimiter, part

    def children(self):
        return (self.operand,)

    def type(self, schema):
        t = self.operand.type(schema)
        if t != "string":
            raise SchemaError(f"split_part needs a string, got {t} in {self!r}")
        return "string"

    def __repr__(self):
        return f"{self.operand!r}.split_part({self.delimiter!r}, {self.part})"


def col(name: str) -> Col:
    """A reference to the field ``name`` of the stream."""
    return Col(name)


def lit(value) -> Lit:
    """A constant: int, float, bool, str, datetime or None (numpy scalars too)."""
    return Lit(value)


def wrap(value) -> Expr:
    """An expression as is; any other value as a literal (a str is a string literal)."""
    return value if isinstance(value, Expr) else Lit(value)


def _from_us(us: int) -> str:
    """Microseconds since the epoch as an ISO date and time (UTC), or the number when no datetime holds it."""
    try:
        return (dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=us)).isoformat(sep=" ")
    except OverflowError:
        return str(us)


def _to_us(value: dt.datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return (value - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) // dt.timedelta(microseconds=1)
