"""The ``upmcep`` Spark data source: engine streams as DataFrames, both ways.

>>> per_ip = spark.readStream.format("upmcep").option("stream", "per_ip").load()   # doctest: +SKIP
>>> events.writeStream.format("upmcep").option("stream", "connections") \\
...     .option("checkpointLocation", ck).start()                                     # doctest: +SKIP

Auto-registered through the top-level module ``pyspark_upmcep`` (Spark finds
any installed ``pyspark_*`` module with a ``DefaultSource``). Options: see
:mod:`sparkcep.spark.options`. The readers and writers it returns are
pickled to executors.

When Spark calls it (PySpark 4.3, measured): ``read.load()``,
``readStream.load()`` and ``write.save()`` create the data source on the
driver, in a Python process of their own, before they return: options, the
engine, its token, the stream, its direction and the schema are all checked
there, and a mistake fails the call with ``[UPMCEP_<CODE>]`` in the message.
``writeStream.start()`` runs no Python of the data source at all: the JVM
builds the sink from the DataFrame's schema (``PythonDataSourceV2`` accepts
external metadata, so ``schema()`` is never asked) and ``start()`` returns
once the query thread has started. The data source is created, and
``streamWriter()`` called, on the driver when each micro-batch is planned,
before any task runs: the same checks fail the query there, at its first
micro-batch, before a row is written.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource

from sparkcep.errors import SparkcepError
from sparkcep.spark.connection import call, target_of
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
            self.target = target_of(self.opts.engine, self.opts.token_file)
        except SparkcepError as e:
            raise spark_error(e) from None
        self._info: dict | None = None

    def _stream_info(self) -> dict:
        if self._info is None:
            self._info = call(self.target, lambda c: c.schema(self.opts.stream, self.opts.form))
        return self._info

    def schema(self):
        """The output's fields as a Spark schema (with ``includeMetadata``: ``_partition``, ``_offset``, ``_seq``).

        Asked by ``load()`` without a user schema, and only by reads (Spark's
        write paths pass the DataFrame's schema), so reading an input stream
        fails here, at ``load()``.
        """
        self._check_readable()
        return spark_schema(self._stream_info()["fields"], self.opts.metadata)

    def _check_readable(self) -> None:
        info = self._stream_info()
        if info["kind"] == "input":
            raise SparkSourceError(f"stream {self.opts.stream!r} is an input stream: write to it with "
                                   "writeStream/write, and read one of its query's outputs", "NOT_READABLE")
        if not info.get("retained", True):
            raise SparkSourceError(f"output {self.opts.stream!r} keeps no rows (its query was deployed with "
                                   "retain=False): nothing to read; deploy it with retain=True", "NOT_READABLE")

    def _readable(self, schema) -> None:
        self._check_readable()
        expected = spark_schema(self._stream_info()["fields"], self.opts.metadata)
        if [(f.name, f.dataType) for f in schema.fields] != [(f.name, f.dataType) for f in expected.fields]:
            raise SparkSourceError(f"a user-specified schema {schema.simpleString()} differs from stream "
                                   f"{self.opts.stream!r}'s schema {expected.simpleString()}; drop .schema()",
                                   "SCHEMA")

    def _writable(self, schema, overwrite: bool) -> list[str]:
        self.opts.check_writable()
        info = self._stream_info()
        if info["kind"] != "input":
            raise SparkSourceError(f"stream {self.opts.stream!r} is an {info['kind']} stream; only input streams "
                                   "of a deployed query can be written", "NOT_WRITABLE")
        if overwrite:
            raise SparkSourceError("an engine stream cannot be overwritten; use mode('append')", "MODE")
        return check_writable(self.opts.stream, info["fields"], schema)

    def reader(self, schema):
        from sparkcep.spark.reader import BatchReader

        self.opts.check_batch_readable()
        self._readable(schema)
        return BatchReader(self.target, self.opts, schema)

    def streamReader(self, schema):
        from sparkcep.spark.reader import StreamReader

        self._readable(schema)
        return StreamReader(self.target, self.opts, schema)

    def writer(self, schema, overwrite: bool):
        from sparkcep.spark.writer import BatchWriter

        return BatchWriter(self.target, self.opts.stream, self._writable(schema, overwrite))

    def streamWriter(self, schema, overwrite: bool):
        from sparkcep.spark.writer import StreamWriter

        return StreamWriter(self.target, self.opts.stream, self._writable(schema, overwrite))
