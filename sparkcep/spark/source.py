"""The ``upmcep`` Spark data source: engine streams as DataFrames, both ways.

>>> per_ip = spark.readStream.format("upmcep").option("stream", "per_ip").load()   # doctest: +SKIP
>>> events.writeStream.format("upmcep").option("stream", "connections") \\
...     .option("checkpointLocation", ck).start()                                     # doctest: +SKIP

Auto-registered through the top-level module ``pyspark_upmcep`` (Spark finds
any installed ``pyspark_*`` module with a ``DefaultSource``). Options: see
:mod:`sparkcep.spark.options`. Spark creates the data source on the driver,
in a Python process of its own, when ``load()``/``start()`` plans a query:
the engine is resolved and the stream looked up there, so a wrong stream or
an unreachable engine fails at ``load()`` with ``[UPMCEP_<CODE>]`` in the
message. The readers and writers it returns are pickled to executors.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource

from sparkcep.control.client import resolve
from sparkcep.errors import SparkcepError
from sparkcep.spark import connection
from sparkcep.spark.options import SourceOptions, SparkSourceError, spark_error
from sparkcep.spark.types import check_writable, spark_schema


class UpmcepDataSource(DataSource):
    """Reads an engine output (or ``$metrics``), writes an engine input stream."""

    @classmethod
    def name(cls) -> str:
        return "upmcep"

    def __init__(self, options):
        super().__init__(options)
        try:
            self.opts = SourceOptions.parse(options)
            self.address = resolve(self.opts.engine)
        except SparkcepError as e:
            raise spark_error(e) from None
        self._info: dict | None = None

    def _stream_info(self) -> dict:
        if self._info is None:
            try:
                self._info = connection.call(self.address, lambda c: c.schema(self.opts.stream))
            except SparkcepError as e:
                raise spark_error(e) from None
        return self._info

    def schema(self):
        """The stream's fields as a Spark schema; for outputs plus ``_partition``, ``_offset``, ``_seq``."""
        info = self._stream_info()
        return spark_schema(info["fields"], self.opts.metadata and info["kind"] != "input")

    def _readable(self, schema) -> None:
        info = self._stream_info()
        if info["kind"] == "input":
            raise SparkSourceError(f"stream {self.opts.stream!r} is an input stream: write to it with "
                                   "writeStream/write, and read one of its query's outputs", "NOT_READABLE")
        expected = spark_schema(info["fields"], self.opts.metadata)
        if [(f.name, f.dataType) for f in schema.fields] != [(f.name, f.dataType) for f in expected.fields]:
            raise SparkSourceError(f"a user-specified schema {schema.simpleString()} differs from stream "
                                   f"{self.opts.stream!r}'s schema {expected.simpleString()}; drop .schema()",
                                   "SCHEMA")

    def _writable(self, schema, overwrite: bool) -> list[str]:
        info = self._stream_info()
        if info["kind"] != "input":
            raise SparkSourceError(f"stream {self.opts.stream!r} is an {info['kind']} stream; only input streams "
                                   "of a deployed query can be written", "NOT_WRITABLE")
        if overwrite:
            raise SparkSourceError("an engine stream cannot be overwritten; use mode('append')", "MODE")
        return check_writable(self.opts.stream, info["fields"], schema)

    def reader(self, schema):
        from sparkcep.spark.reader import BatchReader

        self._readable(schema)
        return BatchReader(self.address, self.opts, schema)

    def streamReader(self, schema):
        from sparkcep.spark.reader import StreamReader

        self._readable(schema)
        return StreamReader(self.address, self.opts, schema)

    def writer(self, schema, overwrite: bool):
        from sparkcep.spark.writer import BatchWriter

        return BatchWriter(self.address, self.opts.stream, self._writable(schema, overwrite))

    def streamWriter(self, schema, overwrite: bool):
        from sparkcep.spark.writer import StreamWriter

        return StreamWriter(self.address, self.opts.stream, self._writable(schema, overwrite))
