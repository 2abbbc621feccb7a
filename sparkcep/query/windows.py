"""Window specifications: time windows (event time) and tuple windows (per group)."""

from __future__ import annotations

import datetime as dt
import math
import re

from sparkcep.arguments import checked, integer, scalar
from sparkcep.errors import QueryError

_UNITS_US = {"us": 1, "ms": 1_000, "s": 1_000_000, "m": 60_000_000, "min": 60_000_000,
             "h": 3_600_000_000, "d": 86_400_000_000}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|ms|s|min|m|h|d)\s*$")
MAX_WINDOWS_A_ROW = 10_000  # windows one row may fall in (size / advance): each costs the row an update
MAX_DURATION_US = 365_000 * 86_400_000_000  # 1,000 years: an event time plus a few of them stays in int64
MAX_TUPLES = 2**61  # a tuple window's size or advance: a group's count plus both stays in the kernels' int64


def duration_us(value, what: str = "duration") -> int:
    """Microseconds in ``"30s"``, ``"500ms"``, ``"5m"``, a timedelta or a number of seconds (numpy's
    too), up to :data:`MAX_DURATION_US` either way."""
    value = scalar(value)
    if isinstance(value, dt.timedelta):
        us = value // dt.timedelta(microseconds=1)
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        us = value * 1_000_000
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        us = float(m.group(1)) * _UNITS_US[m.group(2)]  # inf for hundreds of digits
    else:
        raise QueryError(f"cannot read {what} {value!r}; write e.g. '10s', '500ms', '5m' or a timedelta")
    if abs(us) > MAX_DURATION_US:
        raise QueryError(f"{what} {value!r} is longer than {_show(MAX_DURATION_US)} (1,000 years), the longest "
                         "duration an event time can carry")
    return _whole_us(us, value, what)


def _whole_us(us: float, value, what: str) -> int:
    """``us`` as an int, unless ``value`` is finer than a microsecond (a float's rounding aside)."""
    if abs(us - round(us)) > 1e-3:
        raise QueryError(f"{what} {value!r} is finer than the microseconds the engine keeps; round it to whole "
                         "microseconds")
    return int(round(us))


def _show(us: int) -> str:
    """A duration as the largest unit that divides it: '10s', '500ms', '5m'."""
    for unit in ("d", "h", "m", "s", "ms"):
        if us % _UNITS_US[unit] == 0:
            return f"{us // _UNITS_US[unit]}{unit}"
    return f"{us}us"


class TimeWindow:
    """Event-time window ``[start, start+size)``, starts aligned to multiples of ``advance``.

    Tumbling when ``advance`` is omitted, sliding when it is smaller than
    ``size``. ``lateness`` is how far behind the largest event time seen a
    tuple may arrive and still be counted (default 0).

    >>> TimeWindow("30s", advance="10s").advance_us
    10000000
    """

    @checked()
    def __init__(self, size, advance=None, lateness=0):
        self.size_us = duration_us(size, "window size")
        self.advance_us = self.size_us if advance is None else duration_us(advance, "window advance")
        self.lateness_us = duration_us(lateness, "lateness")
        if self.size_us <= 0:
            raise QueryError(f"window size must be positive, got {size!r}")
        if self.advance_us <= 0:
            raise QueryError(f"window advance must be positive, got {advance!r}")
        if self.advance_us > self.size_us:
            raise QueryError(f"window advance {advance!r} is larger than its size {size!r}: tuples would fall between windows")
        if self.lateness_us < 0:
            raise QueryError(f"lateness must not be negative, got {lateness!r}")
        _check_overlap(-(-self.size_us // self.advance_us), f"TimeWindow({size!r}, advance={advance!r})")

    def __repr__(self) -> str:
        parts = [_show(self.size_us)]
        if self.advance_us != self.size_us:
            parts.append(f"advance={_show(self.advance_us)}")
        if self.lateness_us:
            parts.append(f"lateness={_show(self.lateness_us)}")
        return f"TimeWindow({', '.join(parts)})"


class TupleWindow:
    """Count window over the tuples of each group, in source sequence order.

    Window ``k`` of a group holds the tuples at ordinal positions
    ``[k*advance, k*advance + size)``; only full windows are emitted.
    """

    @checked()
    def __init__(self, size: int, advance: int | None = None):
        self.size = integer(size, "TupleWindow size", minimum=1, maximum=MAX_TUPLES)
        self.advance = self.size if advance is None else integer(advance, "TupleWindow advance", minimum=1,
                                                                 maximum=MAX_TUPLES)
        if self.advance > self.size:
            raise QueryError(f"TupleWindow advance {self.advance} is larger than its size {self.size}")
        _check_overlap(-(-self.size // self.advance), f"TupleWindow({self.size}, advance={self.advance})")

    def __repr__(self) -> str:
        return f"TupleWindow(size={self.size}, advance={self.advance})"


def _check_overlap(windows: int, what: str) -> None:
    if windows > MAX_WINDOWS_A_ROW:
        raise QueryError(f"{what} puts every row in {windows:,} windows; at most {MAX_WINDOWS_A_ROW:,} "
                         "(each is one update a row): make advance larger")
