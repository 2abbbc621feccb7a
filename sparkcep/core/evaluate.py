"""Evaluate expressions over a batch: numpy's compiled loops for numbers,
numba kernels over Arrow offsets+bytes for strings.

A value is ``(data, valid)``; ``data`` is a numpy array, or for strings an
``(offsets, bytes)`` pair. Nulls propagate; ``&``/``|`` use SQL's
three-valued logic; division or modulo by zero gives null. Arithmetic runs
in the type the query declares for it (int64 or float64), whatever the
width of its operands.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from sparkcep.core import columns, strings
from sparkcep.core.split import split_part
from sparkcep.query.expressions import ARITH, BinOp, Col, Expr, IsNull, Lit, Not, SplitPart, StartsWith
from sparkcep.schema import TYPES, Schema

_NUMPY = {"+": np.add, "-": np.subtract, "*": np.multiply, "==": np.equal, "!=": np.not_equal,
          "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal}
_SCALARS = {"int64": np.int64, "float64": np.float64, "timestamp": np.int64}  # literals used as they are
_CMP = {"==": lambda c: c == 0, "!=": lambda c: c != 0, "<": lambda c: c < 0,
        "<=": lambda c: c <= 0, ">": lambda c: c > 0, ">=": lambda c: c >= 0}


def evaluate(expr: Expr, batch: pa.RecordBatch, schema: Schema):
    """``(data, valid)`` of ``expr`` over every row of ``batch``."""
    n = batch.num_rows
    if isinstance(expr, Col):
        arr = batch.column(expr.name)
        if schema.fields[expr.name] == "string":
            off, data, valid = columns.strings(arr)
            return (off, data), valid
        return columns.values(arr)
    if isinstance(expr, Lit):
        return _literal(expr, n)
    if isinstance(expr, Not):
        v, ok = evaluate(expr.operand, batch, schema)
        return ~v, ok
    if isinstance(expr, IsNull):
        _, ok = evaluate(expr.operand, batch, schema)
        return ~ok, np.ones(n, np.bool_)
    if isinstance(expr, StartsWith):
        (off, data), ok = evaluate(expr.operand, batch, schema)
        hit = strings.startswith(off, data, np.frombuffer(expr.prefix.encode(), np.uint8))
        return (np.repeat(hit, n) if len(hit) != n else hit), ok  # a string literal: one answer per row
    if isinstance(expr, SplitPart):  # a string literal stays one (offsets of one row)
        (off, data), ok = evaluate(expr.operand, batch, schema)
        return split_part(off, data, expr.delimiter, expr.part), ok
    if isinstance(expr, BinOp):
        return _binop(expr, batch, schema)
    raise TypeError(f"cannot evaluate {expr!r}")


def _binop(e: BinOp, batch, schema):
    a, a_ok = evaluate(e.left, batch, schema)
    if e.op in _NUMPY and isinstance(e.right, Lit) and e.right.kind in _SCALARS and not isinstance(a, tuple):
        if e.op in ARITH:
            a = _wide(a)
        with np.errstate(all="ignore"):  # col > 5: the literal as a scalar, not a column of 5s
            return _NUMPY[e.op](a, _SCALARS[e.right.kind](e.right.value)), a_ok
    b, b_ok = evaluate(e.right, batch, schema)
    if e.op == "&":
        # SQL: false & x is false even when x is null
        value = a & b
        return value, (a_ok & b_ok) | (a_ok & ~a) | (b_ok & ~b)
    if e.op == "|":
        value = (a & a_ok) | (b & b_ok)
        return value, (a_ok & b_ok) | (a_ok & a) | (b_ok & b)
    ok = a_ok & b_ok
    if isinstance(a, tuple) and isinstance(b, tuple):
        return _string_compare(e.op, a, b, batch.num_rows), ok
    if isinstance(a, tuple) or isinstance(b, tuple):  # a string against a null literal: null
        return np.zeros(batch.num_rows, np.bool_), ok
    if e.op in ARITH:
        a, b = _wide(a), _wide(b)
    if e.op == "/":
        zero = b == 0
        with np.errstate(all="ignore"):
            return np.true_divide(a, np.where(zero, 1, b)), ok & ~zero
    if e.op == "%":
        zero = b == 0
        with np.errstate(all="ignore"):
            return np.mod(a, np.where(zero, 1, b)), ok & ~zero
    with np.errstate(all="ignore"):
        return _NUMPY[e.op](a, b), ok


def _wide(x: np.ndarray) -> np.ndarray:
    """``x`` in the 64-bit type of its kind (a null literal's bools as int64): numpy then computes in the
    type ``BinOp.type`` declares, int64 or float64. In int32 a sum or product would wrap around, in
    float32 round, before the cast to the declared type."""
    return x.astype(np.float64 if x.dtype.kind == "f" else np.int64, copy=False)


def _string_compare(op, a, b, n):
    if not isinstance(a, tuple) or not isinstance(b, tuple):
        raise TypeError("a string compares only with a string")
    (oa, da), (ob, db) = a, b
    if len(oa) - 1 != n and len(ob) - 1 != n:  # two literals: one answer for every row
        return np.repeat(_CMP[op](strings.compare_columns(oa, da, ob, db, True)), n)
    if len(oa) - 1 != n:  # literal on the left: swap and mirror the operator
        mirrored = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}.get(op, op)
        return _string_compare(mirrored, b, a, n)
    cmp = strings.compare_columns(oa, da, ob, db, len(ob) - 1 != n)
    return _CMP[op](cmp)


def _literal(e: Lit, n: int):
    if e.kind == "string":
        data = np.frombuffer(e.value.encode(), np.uint8)
        return (np.array([0, len(data)], np.int64), data), np.ones(n, np.bool_)
    if e.kind == "null":  # bool zeros: a null literal is also a valid operand of & | ~
        return np.zeros(n, np.bool_), np.zeros(n, np.bool_)
    dtype = {"bool": np.bool_, "int64": np.int64, "float64": np.float64, "timestamp": np.int64}[e.kind]
    return np.full(n, e.value, dtype), np.ones(n, np.bool_)


def to_arrow(value, valid: np.ndarray, type_name: str, n: int) -> pa.Array:
    """An Arrow column of ``type_name`` from an evaluated value."""
    if isinstance(value, tuple):
        off, data = value
        if len(off) - 1 != n:  # a string literal: repeat it
            return pa.array(np.full(n, bytes(data).decode(), object), pa.string(), mask=~valid)
        return columns.string_array(off, data, valid)
    mask = None if valid.all() else ~valid
    if type_name == "timestamp":
        return pa.array(value.astype(np.int64), pa.int64(), mask=mask).cast(pa.timestamp("us"))
    return pa.array(value, mask=mask).cast(TYPES[type_name])
