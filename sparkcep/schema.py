"""Stream schemas: named, typed fields backed by Arrow types.

Accepted spellings wherever a schema is expected: a :class:`Schema`, a dict
``{"ip": "string", ...}``, a ``pyarrow.Schema`` or a DDL string
``"ip string, ts timestamp, bytes int64"``.
"""

from __future__ import annotations

import pyarrow as pa

from sparkcep.arguments import did_you_mean
from sparkcep.errors import SchemaError

# Engine type name -> Arrow type. Timestamps are microseconds since epoch, UTC.
TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "int64": pa.int64(),
    "int32": pa.int32(),
    "float64": pa.float64(),
    "float32": pa.float32(),
    "bool": pa.bool_(),
    "timestamp": pa.timestamp("us"),
}
ALIASES = {
    "str": "string", "varchar": "string", "long": "int64", "bigint": "int64",
    "int": "int32", "integer": "int32", "double": "float64", "float": "float32",
    "boolean": "bool", "timestamp_us": "timestamp",
}


def type_name(arrow_type: pa.DataType) -> str:
    """The engine's name of an Arrow type; SchemaError for unsupported ones."""
    if pa.types.is_timestamp(arrow_type):
        return "timestamp"
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or pa.types.is_string_view(arrow_type):
        return "string"
    for name, t in TYPES.items():
        if t == arrow_type:
            return name
    raise SchemaError(f"unsupported type {arrow_type}; supported: {', '.join(TYPES)}")


def arrow_type(name: str) -> pa.DataType:
    if not isinstance(name, str):
        raise SchemaError(f"unknown type {name!r}; supported: {', '.join(TYPES)} (or a pyarrow type)")
    key = ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in TYPES:
        raise SchemaError(f"unknown type {name!r}; supported: {', '.join(TYPES)}")
    return TYPES[key]


class Schema:
    """An ordered set of named, typed fields."""

    def __init__(self, fields: "dict[str, str] | Schema | pa.Schema | str"):
        if isinstance(fields, Schema):
            self.fields: dict[str, str] = dict(fields.fields)
        elif isinstance(fields, pa.Schema):
            self.fields = _checked([(f.name, f.type) for f in fields], f"pyarrow schema ({', '.join(fields.names)})")
        elif isinstance(fields, str):
            self.fields = _checked(_parse_ddl(fields), f"DDL {fields!r}")
        elif isinstance(fields, dict):
            self.fields = _checked(fields.items(), "dict")
        else:
            raise SchemaError(f"cannot make a schema from {type(fields).__name__}")
        if not self.fields:
            raise SchemaError("a schema needs at least one field")

    @property
    def names(self) -> list[str]:
        return list(self.fields)

    def type_of(self, name: str, where: str = "") -> str:
        if name not in self.fields:
            at = f" in {where}" if where else ""
            raise SchemaError(f"unknown field {name!r}{at}{did_you_mean(name, self.names)}; fields are {self.names}")
        return self.fields[name]

    def to_arrow(self) -> pa.Schema:
        """The Arrow schema, made once (every send checks its batch against it)."""
        arrow = self.__dict__.get("_arrow")
        if arrow is None:
            arrow = self._arrow = pa.schema([(n, TYPES[t]) for n, t in self.fields.items()])
        return arrow

    def time_field(self) -> str | None:
        """The event-time field: the first timestamp field, if any."""
        return next((n for n, t in self.fields.items() if t == "timestamp"), None)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and self.fields == other.fields

    def __repr__(self) -> str:
        return "Schema(" + ", ".join(f"{n} {t}" for n, t in self.fields.items()) + ")"


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not name or name.startswith("__"):
        raise SchemaError(f"invalid field name {name!r} (names starting with '__' are reserved)")
    return name


def _checked(pairs, where: str) -> dict[str, str]:
    """The fields of every spelling, from its (name, type) pairs: each name valid and given once, each type
    an engine type (an Arrow type or a name)."""
    fields = {}
    for name, t in pairs:
        if _check_name(name) in fields:
            raise SchemaError(f"field {name!r} appears twice in {where}")
        fields[name] = type_name(t) if isinstance(t, pa.DataType) else type_name(arrow_type(t))
    return fields


def _parse_ddl(ddl: str) -> list[tuple[str, str]]:
    """The (name, type) pairs of a DDL string ``"ip string, bytes int64"``."""
    pairs = []
    for part in ddl.split(","):
        words = part.split()
        if len(words) != 2:
            raise SchemaError(f"cannot parse {part.strip()!r} in DDL {ddl!r}; expected 'name type'")
        pairs.append(tuple(words))
    return pairs


def as_schema(value) -> Schema:
    return value if isinstance(value, Schema) else Schema(value)
