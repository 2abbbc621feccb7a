"""Engine types as Spark types, and Spark types as engine types."""

from __future__ import annotations

from sparkcep.spark.options import SparkSourceError

# engine type -> Spark SQL type
SPARK_TYPES = {"string": "StringType", "int64": "LongType", "int32": "IntegerType", "float64": "DoubleType",
               "float32": "FloatType", "bool": "BooleanType", "timestamp": "TimestampType"}
# Spark type (simpleString) -> engine type
ENGINE_TYPES = {"string": "string", "bigint": "int64", "int": "int32",
                "double": "float64", "float": "float32", "boolean": "bool", "timestamp": "timestamp"}
# what the engine's ingest converts without loss (see sparkcep.core.ingest)
_WIDENS = {("int32", "int64"), ("int32", "float64"), ("int64", "float64"), ("float32", "float64"),
           ("int32", "float32")}

METADATA = {"_partition": "IntegerType", "_offset": "LongType", "_seq": "LongType"}


def spark_schema(fields: dict[str, str], metadata: bool):
    """The Spark StructType of an engine stream's ``fields`` (plus the metadata columns)."""
    from pyspark.sql import types as T

    cols = dict((name, SPARK_TYPES.get(t)) for name, t in fields.items())
    bad = [n for n, t in cols.items() if t is None]
    if bad:
        raise SparkSourceError(f"field {bad[0]!r} has type {fields[bad[0]]}, which has no Spark type", "TYPE")
    if metadata:
        clash = [n for n in METADATA if n in cols]
        if clash:
            raise SparkSourceError(f"the stream has a field named {clash[0]!r}, like a metadata column; read it "
                                   "with .option('includeMetadata', 'false')", "METADATA_CLASH")
        cols.update(METADATA)
    return T.StructType([T.StructField(n, getattr(T, t)(), True) for n, t in cols.items()])


def check_writable(stream: str, fields: dict[str, str], spark_schema) -> list[str]:
    """The Spark columns to send, in the stream's field order; SparkSourceError ``SCHEMA`` on a mismatch."""
    names = [f.name for f in spark_schema.fields]
    twice = [n for n in names if names.count(n) > 1]
    if twice:  # after a join, say: Spark would fail each task with an Arrow error
        raise SparkSourceError(f"column {twice[0]!r} appears {names.count(twice[0])} times in the DataFrame; "
                               f"stream {stream!r} takes each field once: .select() or rename them first", "SCHEMA")
    got = {f.name: f.dataType.simpleString() for f in spark_schema.fields}
    missing = [n for n in fields if n not in got]
    if missing:
        raise SparkSourceError(f"stream {stream!r} needs field {missing[0]!r} ({fields[missing[0]]}), which the "
                               f"DataFrame lacks; its columns are {list(got)}", "SCHEMA")
    extra = [n for n in got if n not in fields]
    if extra:
        raise SparkSourceError(f"column {extra[0]!r} is not a field of stream {stream!r} (fields: "
                               f"{list(fields)}); .select() the stream's fields before writing", "SCHEMA")
    for name, want in fields.items():
        if got[name] == "timestamp_ntz" and want == "timestamp":
            raise SparkSourceError(f"column {name!r} is timestamp_ntz, a wall-clock time of no time zone, but "
                                   f"stream {stream!r} holds instants: cast it to timestamp first (Spark then "
                                   "reads it in the session time zone)", "SCHEMA")
        have = ENGINE_TYPES.get(got[name])
        if have != want and (have, want) not in _WIDENS:
            raise SparkSourceError(f"column {name!r} is {got[name]} but stream {stream!r} expects {want} "
                                   f"(Spark {SPARK_TYPES.get(want, want)}); cast it first", "SCHEMA")
    return list(fields)
