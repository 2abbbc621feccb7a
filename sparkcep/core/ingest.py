"""Turn what a user sends into a validated Arrow batch of a stream's schema.

Accepts a pyarrow Table/RecordBatch, a pandas DataFrame or a dict of columns.
A batch is checked whole before anything of it is applied: a missing or
unknown field, a value of the wrong type or out of its type's range, a null
event time or one implausibly far ahead of the stream's watermark raises
:class:`~sparkcep.errors.InputError` naming the stream, field and row.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkcep.arguments import did_you_mean
from sparkcep.errors import InputError
from sparkcep.schema import Schema, type_name

_BAD_VALUE = (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError)
# Casts taken (each value checked: out of range is refused); anything else must match exactly.
_SMALL_INTS = ("int8", "int16", "uint8", "uint16")
_SAFE = {("int32", "int64"), ("int32", "float64"), ("int64", "float64"), ("float32", "float64"),
         ("int32", "float32"), ("float64", "float32"), ("int64", "int32"), ("uint32", "int64"),
         ("uint64", "int64"), ("uint32", "int32"), ("halffloat", "float32"), ("halffloat", "float64"),
         *((small, wide) for small in _SMALL_INTS for wide in ("int32", "int64", "float32", "float64"))}
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def to_batch(stream: str, schema: Schema, data, time_field: str | None) -> pa.RecordBatch:
    """The validated batch (visible fields only) for ``data`` sent into ``stream``."""
    arrow = schema.to_arrow()
    if isinstance(data, pa.RecordBatch) and data.schema.equals(arrow, check_metadata=True):  # as it is
        return _check_times(stream, data, time_field)
    columns = _columns(stream, data)
    names = list(columns)
    unknown = [n for n in names if n not in schema.fields]
    if unknown:
        raise InputError(f"stream {stream!r}: unknown field {unknown[0]!r}{did_you_mean(unknown[0], schema.names)}; "
                         f"the stream's fields are {schema.names}", "UNKNOWN_FIELD")
    missing = [n for n in schema.names if n not in columns]
    if missing:
        raise InputError(f"stream {stream!r}: field {missing[0]!r} ({schema.fields[missing[0]]}) is missing",
                         "MISSING_FIELD")
    lengths = {len(c) for c in columns.values()}
    if len(lengths) > 1:
        raise InputError(f"stream {stream!r}: columns have different lengths {sorted(lengths)}", "LENGTH")
    arrays = [_convert(stream, name, t, columns[name]) for name, t in schema.fields.items()]
    return _check_times(stream, pa.RecordBatch.from_arrays(arrays, schema=arrow), time_field)


def _check_times(stream: str, batch: pa.RecordBatch, time_field: str | None) -> pa.RecordBatch:
    """``batch``, unless its event time is null somewhere."""
    if time_field is not None and batch.column(time_field).null_count:
        row = int(np.flatnonzero(~batch.column(time_field).is_valid().to_numpy(zero_copy_only=False))[0])
        raise InputError(f"stream {stream!r}: event-time field {time_field!r} is null at row {row}; "
                         "every tuple needs an event time", "NULL_TIME")
    return batch


def to_batches(stream: str, schema: Schema, data, time_field: str | None) -> list[pa.RecordBatch]:
    """The validated batches for ``data``: a Table's record batches converted piece by piece, never
    copied into one (a Spark micro-batch arrives as hundreds of MiB in pieces of about 1.5 MiB).

    Consecutive batches smaller than :data:`PIECE_BYTES` are joined first: every batch costs the
    engine a fixed amount, and ten thousand 10-row batches took 10.7 s against 0.013 s as one.
    Errors are those of :func:`to_batch` on the whole ``data``: rows count from its start.
    """
    if not isinstance(data, pa.Table) or data.num_rows == 0:
        return [to_batch(stream, schema, data, time_field)]
    try:
        return [to_batch(stream, schema, b, time_field) for b in _pieces(data)]
    except InputError:
        to_batch(stream, schema, data, time_field)  # the same error, its row counted from the table's start
        raise


PIECE_BYTES = 1 << 20  # smaller record batches of a table are joined up to this size


def _pieces(table: pa.Table):
    """The non-empty record batches of ``table``, runs of small ones joined into batches of ~PIECE_BYTES."""
    run, size = [], 0
    for b in table.to_batches():
        if not b.num_rows:
            continue
        run.append(b)
        size += b.nbytes
        if size >= PIECE_BYTES:
            yield _joined(run)
            run, size = [], 0
    if run:
        yield _joined(run)


def _joined(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    return batches[0] if len(batches) == 1 else pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def _columns(stream: str, data) -> dict:
    if isinstance(data, (pa.RecordBatch, pa.Table)):
        _check_unique(stream, data.schema.names)
        if isinstance(data, pa.RecordBatch):
            return {n: data.column(i) for i, n in enumerate(data.schema.names)}
        return {n: data.column(i).combine_chunks() for i, n in enumerate(data.schema.names)}
    if isinstance(data, dict):
        for name, values in data.items():
            if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
                raise InputError(f"stream {stream!r}: field {name!r} is one {type(values).__name__}, not a column: "
                                 f"a dict's values are columns, one value a row (one row: {{{name!r}: [value], ...}})",
                                 "BAD_DATA")
        return dict(data)
    if any(c.__name__ == "DataFrame" and c.__module__.startswith("pandas.") for c in type(data).__mro__):
        names = [str(c) for c in data.columns]
        _check_unique(stream, names)
        return {n: data.iloc[:, i] for i, n in enumerate(names)}
    if type(data).__module__.startswith("pyspark."):
        raise InputError(f"stream {stream!r}: cannot send a Spark {type(data).__name__}; write it into the stream "
                         "with df.writeStream.format(\"upmcep\") (or df.write), or send df.toArrow()", "BAD_DATA")
    raise InputError(f"stream {stream!r}: cannot send a {type(data).__name__}; send a pyarrow Table or "
                     "RecordBatch, a pandas DataFrame or a dict of columns", "BAD_DATA")


def _check_unique(stream: str, names: list[str]) -> None:
    seen = set()
    for n in names:
        if n in seen:
            raise InputError(f"stream {stream!r}: field {n!r} is given twice; send each field once", "DUPLICATE_FIELD")
        seen.add(n)


def _detached(values):
    """A numpy or pandas column copied: Arrow wraps their buffers without copying, and a caller may
    reuse its buffer once the send returned, while the engine keeps the rows (outputs, join state)."""
    if isinstance(values, np.ndarray) or type(values).__module__.startswith("pandas"):
        return values.copy()
    return values


def _convert(stream: str, field: str, want: str, values) -> pa.Array:
    target = pa.schema([(field, _arrow(want))]).field(0).type
    if want == "timestamp" and isinstance(values, (list, tuple)):  # pyarrow drops a pd.Timestamp's nanoseconds
        for row, v in enumerate(values):
            if getattr(v, "nanosecond", 0):
                raise InputError(f"stream {stream!r}: field {field!r}: {_finer(field, row, v.to_datetime64())}", "TYPE")
    try:
        arr = values if isinstance(values, pa.Array) else pa.array(_detached(values), from_pandas=True)
    except _BAD_VALUE:
        arr = _convert_explicit(stream, field, want, values, target)
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_dictionary(arr.type):  # pandas' category dtype: its values are what is sent
        arr = arr.dictionary_decode()
    if arr.type == target:
        return arr
    if pa.types.is_null(arr.type) or len(arr) == 0:  # no value to convert (pandas makes empty columns float64)
        return pa.nulls(len(arr), target)
    try:
        got = type_name(arr.type)
    except Exception:
        got = str(arr.type)
    if (got, want) in _SAFE or (got == want):
        why = _overflows_float32(arr) if want == "float32" else None
        if why is None:
            try:
                return arr.cast(target, safe=True)
            except pa.ArrowInvalid as e:
                why = _sub_microsecond(field, arr) or f"cannot convert {got} to {want}: {e}{_first_bad(arr, target)}"
        raise InputError(f"stream {stream!r}: field {field!r}: {why}", "TYPE") from None
    if want in ("int32", "int64") and pa.types.is_floating(arr.type):
        hint = _float_for_int(field, arr, want)
    else:
        hint = _first_bad(values, target)
    if want == "timestamp" and got in ("int32", "int64"):
        hint = "; send datetimes or a pyarrow timestamp column (integers are ambiguous: s, ms or us?)" + hint
    raise InputError(f"stream {stream!r}: field {field!r} expects {want}, got {got}{hint}", "TYPE")


def _overflows_float32(arr: pa.Array) -> str | None:
    """Why ``arr`` cannot be float32, naming the first finite value past its range (None: it can)."""
    if not pa.types.is_floating(arr.type) or arr.type.bit_width <= 32:
        return None
    x = pc.fill_null(arr, 0.0).to_numpy()
    bad = np.flatnonzero(np.isfinite(x) & (np.abs(x) > _FLOAT32_MAX))
    if not len(bad):
        return None
    return f"row {int(bad[0])} is {float(x[bad[0]])!r}, out of float32's range (+-{_FLOAT32_MAX:.6g}); declare the field float64"


def _float_for_int(field: str, arr: pa.Array, want: str) -> str:
    """What to do about float values sent to an integer field, naming the first row in the way."""
    x = arr.to_numpy(zero_copy_only=False)
    missing = np.flatnonzero(np.isnan(x))
    if len(missing):
        return (f" (row {int(missing[0])} is missing: pandas holds integers with missing values as floats; "
                f"send a nullable integer column, e.g. df[{field!r}].astype(\"Int64\"))")
    fractional = np.flatnonzero(x != np.trunc(x))
    if len(fractional):
        return f" (row {int(fractional[0])}: {float(x[fractional[0]])!r})"
    return f" (whole numbers: cast the column, e.g. df[{field!r}].astype(\"{want}\"))"


def _convert_explicit(stream, field, want, values, target):
    """``values`` Arrow could not type by itself (e.g. Python objects of mixed types) converted to ``target``;
    refused naming the first value that does not convert."""
    try:
        return pa.array(values, type=target, from_pandas=True)
    except _BAD_VALUE as e:
        bad = _first_unconverted(values, target)
        raise InputError(f"stream {stream!r}: field {field!r} expects {want}"
                         + (f", got {type(bad[1]).__name__} at row {bad[0]}: {bad[1]!r}" if bad else f": {e}"),
                         "TYPE") from None


def _sub_microsecond(field: str, arr: pa.Array) -> str | None:
    """Why nanosecond timestamps ``arr`` cannot be taken, naming the first that is no whole microsecond
    (None when every one is)."""
    if not pa.types.is_timestamp(arr.type) or arr.type.unit != "ns":
        return None
    ns = pc.fill_null(arr.view(pa.int64()), 0).to_numpy()
    bad = np.flatnonzero(ns % 1000)
    if not len(bad):
        return None
    return _finer(field, int(bad[0]), np.datetime64(int(ns[bad[0]]), "ns"))


def _finer(field: str, row: int, value: np.datetime64) -> str:
    return (f"row {row} is {value}, finer than the microseconds the engine keeps; "
            f"round the times first, e.g. df[{field!r}].dt.floor(\"us\") in pandas")


def _first_bad(values, target) -> str:
    """' (row i: v)' of the first value that does not convert to ``target`` — only on the error path, so a
    Python loop is fine."""
    bad = _first_unconverted(values, target)
    return "" if bad is None else f" (row {bad[0]}: {bad[1]!r})"


def _first_unconverted(values, target) -> tuple[int, object] | None:
    try:
        items = values.to_pylist() if isinstance(values, pa.Array) else list(values)
    except Exception:
        return None
    for i, v in enumerate(items):
        try:
            pa.array([v], type=target, from_pandas=True)
        except _BAD_VALUE:
            return i, v
    return None


def check_event_times(stream: str, time_field: str, times: list[pa.Array], peaks: list[int],
                      watermark: int | None, max_ahead_us: int | None) -> None:
    """Refuse event times more than ``max_ahead_us`` ahead of the stream's ``watermark``.

    ``times``: the event times of a send's batches (int64), ``peaks`` the largest of each;
    ``watermark``: the largest event time the stream took so far (None before
    its first tuple: then the send's earliest time is the reference). One
    event dated centuries ahead would otherwise make every later one late.
    """
    if max_ahead_us is None or not peaks:
        return
    ref = min(int(t.to_numpy().min()) for t in times) if watermark is None else watermark
    if max(peaks) > ref + max_ahead_us:
        ts = np.concatenate([t.to_numpy() for t in times])
        row = int(np.argmax(ts > ref + max_ahead_us))
        at, base = _iso(int(ts[row])), _iso(ref)
        what = "the stream's watermark" if watermark is not None else "the batch's earliest event time"
        raise InputError(f"stream {stream!r}: event-time field {time_field!r} at row {row} is {at}, more than "
                         f"{max_ahead_us / 86_400e6:g} days ahead of {what} ({base}); a clock or unit error? "
                         "Raise the bound with q.stream(..., max_ahead=...) (None: no bound)", "TIME_AHEAD")


def _iso(us: int) -> str:
    return str(np.datetime64(us, "us"))


def _arrow(name: str) -> pa.DataType:
    from sparkcep.schema import TYPES
    return TYPES[name]
