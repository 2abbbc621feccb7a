"""An independent reference implementation of sparkcep's semantics (issue 2).

Written from the contract, not from the engine: plain Python loops over rows
(dicts), results as pandas DataFrames. Slow and obvious on purpose; the tests
compare the engine against it, never the engine against itself.

Conventions
-----------
* Event times and window bounds are int64 microseconds since epoch.
* A *send* is ``(stream, rows)``; :func:`stamp` gives every row the
  engine-wide sequence number ``__seq`` (send order), its event time
  ``__ts`` and its source watermark ``__wm`` (largest event time of the
  *earlier* sends of the same stream; ``None`` before the first one).
* Nulls are ``None``. Expressions follow SQL three-valued logic.

This module imports nothing from sparkcep.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

SEQ, TS, WM = "__seq", "__ts", "__wm"
S = 1_000_000  # one second in microseconds


# --------------------------------------------------------------------------------------
# expressions
# --------------------------------------------------------------------------------------
class E:
    """A reference expression; :meth:`eval` takes a row dict, returns a value or None."""

    def eval(self, row):  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self):
        return self.show()


@dataclass(repr=False)
class Col(E):
    name: str

    def eval(self, row):
        return row[self.name]

    def show(self):
        return f"col({self.name!r})"


@dataclass(repr=False)
class Lit(E):
    value: object

    def eval(self, row):
        return self.value

    def show(self):
        return repr(self.value)


def _arith(op, a, b):
    if a is None or b is None:
        return None
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return None if b == 0 else a / b
    if op == "%":
        # Python / numpy floor modulo: the result takes the divisor's sign
        return None if b == 0 else a % b
    raise ValueError(op)


def _key(v):
    """Ordering key: strings compare bytewise (UTF-8), numbers numerically."""
    return v.encode() if isinstance(v, str) else v


def _compare(op, a, b):
    if a is None or b is None:
        return None
    a, b = _key(a), _key(b)
    return {"==": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


@dataclass(repr=False)
class Bin(E):
    op: str
    left: E
    right: E

    def eval(self, row):
        if self.op == "&":
            a, b = self.left.eval(row), self.right.eval(row)
            if a is False or b is False:
                return False
            if a is None or b is None:
                return None
            return True
        if self.op == "|":
            a, b = self.left.eval(row), self.right.eval(row)
            if a is True or b is True:
                return True
            if a is None or b is None:
                return None
            return False
        a, b = self.left.eval(row), self.right.eval(row)
        if self.op in ("==", "!=", "<", "<=", ">", ">="):
            return _compare(self.op, a, b)
        return _arith(self.op, a, b)

    def show(self):
        return f"({self.left.show()} {self.op} {self.right.show()})"


@dataclass(repr=False)
class Not(E):
    operand: E

    def eval(self, row):
        v = self.operand.eval(row)
        return None if v is None else (not v)

    def show(self):
        return f"~{self.operand.show()}"


@dataclass(repr=False)
class IsNull(E):
    operand: E

    def eval(self, row):
        return self.operand.eval(row) is None

    def show(self):
        return f"{self.operand.show()}.is_null()"


@dataclass(repr=False)
class StartsWith(E):
    operand: E
    prefix: str

    def eval(self, row):
        v = self.operand.eval(row)
        return None if v is None else v.encode().startswith(self.prefix.encode())

    def show(self):
        return f"{self.operand.show()}.startswith({self.prefix!r})"


# --------------------------------------------------------------------------------------
# input: sequence numbers and watermarks
# --------------------------------------------------------------------------------------
@dataclass
class Streams:
    """Stamped rows per stream, in send order."""

    rows: dict[str, list[dict]] = field(default_factory=dict)

    def __getitem__(self, name):
        return self.rows.get(name, [])


def stamp(sends, time_fields: dict[str, str | None]) -> Streams:
    """Stamp ``sends`` = [(stream, [row dict, ...]), ...] as the engine's sources would."""
    out = Streams()
    seq = 0
    seen: dict[str, int | None] = {}
    for stream, rows in sends:
        tf = time_fields.get(stream)
        wm = seen.get(stream)
        batch_max = wm
        stamped = out.rows.setdefault(stream, [])
        for r in rows:
            ts = r[tf] if tf else 0
            stamped.append({**r, SEQ: seq, TS: ts, WM: wm})
            seq += 1
            batch_max = ts if batch_max is None else max(batch_max, ts)
        if rows:
            seen[stream] = batch_max
    return out


# --------------------------------------------------------------------------------------
# stateless operators (rows keep their hidden columns)
# --------------------------------------------------------------------------------------
def filter_rows(rows, cond: E):
    return [r for r in rows if cond.eval(r) is True]


def map_rows(rows, fields: dict[str, E]):
    return [{**{k: e.eval(r) for k, e in fields.items()}, SEQ: r[SEQ], TS: r[TS], WM: r[WM]} for r in rows]


def demux_rows(rows, *conds: E):
    return [filter_rows(rows, c) for c in conds]


def union_rows(*inputs):
    return [r for rows in inputs for r in rows]


# --------------------------------------------------------------------------------------
# windows
# --------------------------------------------------------------------------------------
@dataclass
class Time:
    """Event-time window (microseconds): ``[s, s + size)`` for every multiple ``s`` of ``advance``."""

    size: int
    advance: int | None = None
    lateness: int = 0

    def __post_init__(self):
        if self.advance is None:
            self.advance = self.size

    def starts(self, ts):
        """Every window start whose window holds ``ts``, ascending."""
        s = (ts // self.advance) * self.advance
        out = []
        while s > ts - self.size:
            out.append(s)
            s -= self.advance
        return out[::-1]

    def admitted(self, start, wm):
        """Was window ``start`` still open for a row whose source watermark was ``wm``?"""
        return wm is None or start + self.size > wm - self.lateness


@dataclass
class Tuples:
    """Count window per group: positions ``[k*advance, k*advance + size)``, full windows only."""

    size: int
    advance: int | None = None

    def __post_init__(self):
        if self.advance is None:
            self.advance = self.size


# --------------------------------------------------------------------------------------
# aggregate
# --------------------------------------------------------------------------------------
def _order(r):
    return (r[TS], r[SEQ])


def agg_value(kind: str, fld: str | None, rows: list[dict]):
    """One aggregate function over the rows of one window-group."""
    if kind == "count" and fld is None:
        return len(rows)
    vals = [r for r in rows if r[fld] is not None]
    if kind == "count":
        return len(vals)
    if not vals:
        return None
    if kind == "sum":
        return sum(r[fld] for r in vals)
    if kind == "avg":
        return math.fsum(r[fld] for r in vals) / len(vals)
    if kind == "min":
        return min((r[fld] for r in vals), key=_key)
    if kind == "max":
        return max((r[fld] for r in vals), key=_key)
    if kind == "first":
        return min(vals, key=_order)[fld]
    if kind == "last":
        return max(vals, key=_order)[fld]
    raise ValueError(kind)


def _group_key(r, by):
    # -0.0 and 0.0 are one group; tuples of None/values hash and compare as SQL GROUP BY
    return tuple((0.0 if isinstance(r[f], float) and r[f] == 0 else r[f]) for f in by)


def aggregate(rows, window, by=(), funcs=()):
    """Windowed aggregation. ``funcs``: [(output name, kind, field or None), ...].

    Returns ``(DataFrame, late)``: rows ``window_start, window_end, *by, *funcs``
    and the number of tuples that missed at least one of their windows.
    """
    by = list(by)
    cols = ["window_start", "window_end"] + by + [name for name, _, _ in funcs]
    groups: dict[tuple, list[dict]] = {}
    late = 0
    rows = sorted(rows, key=lambda r: r[SEQ])
    if isinstance(window, Time):
        for r in rows:
            missed = False
            for s in window.starts(r[TS]):
                if window.admitted(s, r[WM]):
                    groups.setdefault((s, _group_key(r, by)), []).append(r)
                else:
                    missed = True
            late += missed
        out = []
        for (s, _), members in groups.items():
            out.append([s, s + window.size] + [members[0][f] for f in by]
                       + [agg_value(k, f, members) for _, k, f in funcs])
    else:
        per_group: dict[tuple, list[dict]] = {}
        for r in rows:
            per_group.setdefault(_group_key(r, by), []).append(r)
        out = []
        for members in per_group.values():
            k = 0
            while k * window.advance + window.size <= len(members):
                s = k * window.advance
                w = members[s:s + window.size]
                out.append([s, s + window.size] + [members[0][f] for f in by]
                           + [agg_value(kd, f, w) for _, kd, f in funcs])
                k += 1
    return pd.DataFrame(out, columns=cols, dtype=object), late


# --------------------------------------------------------------------------------------
# join
# --------------------------------------------------------------------------------------
def join_names(left_fields, right_fields, on):
    """Output field names: (left name -> out, right name -> out) per the contract: a clash takes
    ``_left`` / ``_right``, again until it names no other field."""
    shared = {lk for lk, rk in on if lk == rk}
    taken = {"window_start", "window_end", *left_fields, *right_fields}

    def suffixed(n, suffix):
        n += suffix
        while n in taken:
            n += suffix
        taken.add(n)
        return n

    lnames, rnames = {}, {}
    for n in left_fields:
        clash = n in ("window_start", "window_end") or (n in right_fields and n not in shared)
        lnames[n] = suffixed(n, "_left") if clash else n
    for n in right_fields:
        if n in shared:
            continue
        clash = n in ("window_start", "window_end") or n in left_fields
        rnames[n] = suffixed(n, "_right") if clash else n
    return lnames, rnames


def join(left, right, left_fields, right_fields, window: Time, on=(), where: E | None = None):
    """Windowed join. ``on``: [(left key, right key), ...]. Returns ``(DataFrame, late)``."""
    on = [(k, k) if isinstance(k, str) else tuple(k) for k in on]
    lnames, rnames = join_names(left_fields, right_fields, on)
    cols = ["window_start", "window_end"] + list(lnames.values()) + list(rnames.values())
    late = 0
    members: dict[int, tuple[list, list]] = {}
    for side, rows in enumerate((left, right)):
        for r in rows:
            missed = False
            for s in window.starts(r[TS]):
                if window.admitted(s, r[WM]):
                    members.setdefault(s, ([], []))[side].append(r)
                else:
                    missed = True
            late += missed
    out = []
    for s, (ls, rs) in members.items():
        for l in ls:
            for r in rs:
                if any(l[lk] is None or r[rk] is None or l[lk] != r[rk] for lk, rk in on):
                    continue
                row = {"window_start": s, "window_end": s + window.size}
                row.update({o: l[n] for n, o in lnames.items()})
                row.update({o: r[n] for n, o in rnames.items()})
                if where is not None and where.eval(row) is not True:
                    continue
                out.append([row[c] for c in cols])
    return pd.DataFrame(out, columns=cols, dtype=object), late


# --------------------------------------------------------------------------------------
# comparing results
# --------------------------------------------------------------------------------------
def frame(rows, fields) -> pd.DataFrame:
    """Visible ``fields`` of stamped rows as a DataFrame (for stateless outputs)."""
    return pd.DataFrame([[r[f] for f in fields] for r in rows], columns=list(fields), dtype=object)


def _cell(v):
    if v is None:
        return None
    if isinstance(v, float) and math.isnan(v):
        return None
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        v = v.item()  # numpy scalar
    return v


def _sort_key(row):
    key = []
    for v in row:
        if v is None:
            key.append((0, 0))
        elif isinstance(v, bool):
            key.append((1, int(v)))
        elif isinstance(v, float):
            key.append((2, float(f"{v:.9g}")))
        elif isinstance(v, int):
            key.append((2, v))
        else:
            key.append((3, str(v)))
    return key


def rows_of(df: pd.DataFrame) -> list[tuple]:
    """Rows as tuples of plain Python values (None for nulls), sorted."""
    rows = [tuple(_cell(v) for v in r) for r in df.itertuples(index=False, name=None)]
    return sorted(rows, key=_sort_key)


def same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) or isinstance(b, float):
        if isinstance(a, bool) or isinstance(b, bool):
            return a == b and type(a) is type(b)
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def _unmatched(a, b, limit=5):
    """Rows of ``a`` with no partner in ``b`` (each partner used once)."""
    pool, out = list(b), []
    for x in a:
        hit = next((i for i, y in enumerate(pool) if len(x) == len(y) and all(same(p, q) for p, q in zip(x, y))), None)
        if hit is None:
            out.append(x)
            if len(out) == limit:
                break
        else:
            pool.pop(hit)
    return out


def assert_same_rows(got: pd.DataFrame, want: pd.DataFrame, what: str = "") -> None:
    """``got`` and ``want`` hold the same multiset of rows (floats within 1e-9), same columns."""
    assert list(got.columns) == list(want.columns), f"{what}: columns {list(got.columns)} != {list(want.columns)}"
    g, w = rows_of(got), rows_of(want)
    problems = []
    if len(g) != len(w):
        problems.append(f"{len(g)} rows, expected {len(w)}")
    for i, (x, y) in enumerate(zip(g, w)):
        if not all(same(a, b) for a, b in zip(x, y)):
            problems.append(f"first difference at sorted row {i}:\n  got  {x}\n  want {y}")
            break
    if problems:
        extra, missing = _unmatched(g, w), _unmatched(w, g)
        raise AssertionError(f"{what}: " + "; ".join(problems)
                             + f"\n  unexpected (up to 5): {extra}\n  missing (up to 5): {missing}"
                             + f"\n  columns: {list(want.columns)}")
