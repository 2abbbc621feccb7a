"""Arguments of the public API: misspelled keywords refused by name, numbers taken as Python users hold them.

Python's own ``TypeError`` ("unexpected keyword argument") names no
alternative and escapes the engine's error root; :func:`checked` turns it
into the layer's error with code ``UNKNOWN_ARGUMENT``. Functions taking
``**kwargs`` (``aggregate(..., n=cep.count())``) call :func:`unknown`
themselves for a keyword that is none of theirs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import difflib
import functools
import inspect
import math
import operator

from sparkcep.errors import EngineError, QueryError

CODE = "UNKNOWN_ARGUMENT"


def closest(given: str, valid) -> str | None:
    """The name in ``valid`` that ``given`` most likely misspells, if any (the same letters in another
    case first: 'IP' for 'ip')."""
    valid = list(valid)
    same = [v for v in valid if str(v).casefold() == given.casefold()]
    close = same or difflib.get_close_matches(given, valid, n=1, cutoff=0.5)
    return close[0] if close else None


def did_you_mean(given, valid) -> str:
    """`` (did you mean 'x'?)`` with the name in ``valid`` that ``given`` most likely misspells, or ``""``."""
    near = closest(str(given), valid)
    return f" (did you mean {near!r}?)" if near else ""


def unknown(function: str, given: str, valid, error=QueryError):
    """The error for keyword ``given`` of ``function``, which takes the keywords ``valid``."""
    return error(f"{function}() got an unknown argument {given!r}{did_you_mean(given, valid)}; "
                 f"its arguments: {', '.join(sorted(valid))}", CODE)


def checked(error=QueryError):
    """Decorate a public function or ``__init__`` without ``**kwargs``: an unknown keyword raises
    ``error`` (code UNKNOWN_ARGUMENT)."""
    def wrap(fn):
        params = inspect.signature(fn).parameters.values()
        assert all(p.kind is not p.VAR_KEYWORD for p in params), fn
        valid = frozenset(p.name for p in params if p.name not in ("self", "cls") and
                          p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        name = fn.__qualname__.removesuffix(".__init__")

        @functools.wraps(fn)
        def call(*args, **kwargs):
            for key in kwargs:
                if key not in valid:
                    raise unknown(name, key, valid, error)
            return fn(*args, **kwargs)
        return call
    return wrap


def integer(value, name: str, minimum: int | None = None, maximum: int | None = None, error=QueryError,
            code: str = "BAD_ARGUMENT") -> int:
    """``value`` as a Python int: whatever :func:`operator.index` takes (``int``, numpy integers), checked
    against ``minimum``/``maximum``. A ``bool``, a float (even ``3.0``) or anything else raises ``error``
    with ``code``, naming the argument ``name``."""
    if isinstance(value, bool):
        raise error(f"{name} must be an integer, got the bool {value!r}", code)
    try:
        n = operator.index(value)
    except TypeError:
        raise error(f"{name} must be an integer, got {value!r} ({type(value).__name__})", code) from None
    if minimum is not None and n < minimum:
        raise error(f"{name} must be >= {minimum}, got {n}", code)
    if maximum is not None and n > maximum:
        raise error(f"{name} must be <= {maximum}, got {n}", code)
    return n


def number(value, name: str, minimum: float = 0.0, maximum: float = math.inf, error=QueryError,
           code: str = "BAD_ARGUMENT") -> float:
    """``value`` as a finite Python float in ``[minimum, maximum]``: an int, a float, a numpy number. A
    ``bool``, a string, NaN, an infinity or anything else raises ``error`` with ``code``, naming ``name``
    (an infinite wait or pause would fail only later, half done)."""
    if isinstance(value, (bool, str, bytes)) or getattr(value, "ndim", 0) != 0:
        raise error(f"{name} must be a number, got {value!r} ({type(value).__name__})", code)
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise error(f"{name} must be a number, got {value!r} ({type(value).__name__})", code) from None
    if not math.isfinite(x):
        raise error(f"{name} must be a finite number, got {x!r}", code)
    if not minimum <= x <= maximum:
        bound = f">= {minimum:g}" if x < minimum else f"<= {maximum:g}"
        raise error(f"{name} must be {bound}, got {value}", code)  # as given: 1000000000, not 1e+09
    return x


def seconds(timeout, name: str = "timeout") -> float | None:
    """A wait's limit in seconds: None (the call's default) or a finite number >= 0 (BAD_TIMEOUT)."""
    return None if timeout is None else number(timeout, f"{name} (seconds; None: the default)", code="BAD_TIMEOUT")


def scalar(value):
    """A numpy scalar (``np.int64(5)``, ``np.bool_``, ``np.datetime64``, ``np.timedelta64``) as the Python
    value it holds: int, float, bool, str, ``datetime.datetime``, ``datetime.timedelta``, None for NaT
    (numpy's, and pandas' ``pd.NaT``). Times go through microseconds, the engine's unit: a time finer
    than that (numpy's or pandas' nanoseconds) raises QueryError, never truncated. Anything else is
    returned as it is.

    Duck-typed: the query layer imports neither numpy nor pandas.
    """
    if isinstance(value, (dt.datetime, dt.timedelta)):
        if value != value:  # pd.NaT, a datetime unequal to itself
            return None
        if getattr(value, "nanosecond", 0) or getattr(value, "nanoseconds", 0):  # pandas' Timestamp, Timedelta
            raise QueryError(_finer(value, '.floor("us") in pandas'))
        return value
    if type(value).__module__ != "numpy" or getattr(value, "ndim", None) != 0:
        return value
    kind = value.dtype.kind
    if kind in ("M", "m"):
        unit = "datetime64[us]" if kind == "M" else "timedelta64[us]"
        us = value.astype(unit)
        if us != value and value == value:  # NaT equals nothing, itself included
            raise QueryError(_finer(value, f'.astype("{unit}") in numpy'))
        return us.item()
    return value.item()


def _finer(value, rounding: str) -> str:
    """Why the time ``value`` is refused, and ``rounding``: how to round it."""
    return f"{value!r} is finer than the microseconds the engine keeps; round it first, e.g. with {rounding}"


def function(value, name: str, optional: bool = False, error=QueryError, code: str = "BAD_CALLBACK"):
    """``value`` if it can be called (or is None and ``optional``), else ``error`` with ``code``: a
    callback that is not one would fail only later, when it is first called."""
    if value is None and optional or callable(value):
        return value
    raise error(f"{name} must be a function, got {value!r} ({type(value).__name__})", code)


def bounded(kind, minimum, maximum=None):
    """A command line's number: an argparse ``type`` reading the text as ``kind`` (int or float; an int
    may be written ``1e6``), from ``minimum`` up to ``maximum`` (argparse then names the argument in its
    error)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = whole_number(text) if kind is int else None
            if value is None:
                raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, "
                                                 f"got {text!r}") from None
        if not math.isfinite(value) or value < minimum or (maximum is not None and value > maximum):
            span = f"from {minimum:,} to {maximum:,}" if maximum is not None else f"{minimum:,} or more"
            raise argparse.ArgumentTypeError(f"must be {span}, got {text}")
        return value
    return parse


def whole_number(text: str) -> int | None:
    """``text`` as an integer when it writes a whole number in float notation (``1e6``), else None."""
    try:
        f = float(text)
    except ValueError:
        return None
    return int(f) if math.isfinite(f) and f.is_integer() else None


def bounded_list(kind, minimum, maximum=None):
    """A command line's comma-separated numbers (``100,10000`` or ``1e5,1e6``), each as :func:`bounded`
    reads it: an argparse ``type`` giving a list of at least one."""
    one = bounded(kind, minimum, maximum)

    def parse(text: str):
        items = [t.strip() for t in text.split(",")]
        if not all(items):
            raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}")
        return [one(t) for t in items]
    return parse


def host_port(listen: str, code: str = "BAD_LISTEN") -> tuple[str, int]:
    """``(host, port)`` of an address to listen on, ``"HOST:PORT"`` (``"[::1]:PORT"`` too; port 0: any free
    one); EngineError ``code`` when it is not one."""
    host, sep, port = listen.rpartition(":") if isinstance(listen, str) else ("", "", "")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdecimal() or int(port) > 65535:
        raise EngineError(f"listen={listen!r}: expected HOST:PORT with a port 0-65535 (0: any free port), "
                          "e.g. '127.0.0.1:0'; other hosts reach it only on an explicit address such as "
                          "'0.0.0.0:PORT'", code)
    return host, int(port)
