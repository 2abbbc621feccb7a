"""Options of the ``upmcep`` data source, checked once on the driver.

=====================  ==================================================================
``engine``             unset or ``local``: the local engine (its published endpoint);
                       ``host:port``: that endpoint; ``zk://host:port/path``: reserved for
                       engines registered in ZooKeeper
``stream``             the engine stream: an output (read) or an input (write); ``load(name)``
                       and ``save(name)`` work too. ``$metrics`` reads the metric samples
``startingOffsets``    ``earliest`` (default: every retained row), ``latest``, or JSON
                       ``{"partition": position}``; a checkpoint overrides it
``maxRecordsPerTrigger``  at most this many rows per micro-batch, spread over partitions
``rowsPerPartition``   rows per Spark task when planning a range (default 1,000,000)
``includeMetadata``    ``true`` (default): add ``_partition``, ``_offset`` and ``_seq``
``consumer``           name under which reads are committed (default ``spark``); rows
                       are released once every consumer of an output passed them
``metricsInterval``    seconds between two ``$metrics`` samples (default 1)
=====================  ==================================================================
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sparkcep.errors import SparkcepError


class SparkSourceError(SparkcepError):
    """The ``upmcep`` data source was misconfigured or its engine refused a request.

    The message starts with ``[UPMCEP_<CODE>]`` so the code shows in Spark's
    error text too, where only the message survives.
    """

    code = "SPARK"

    def __init__(self, message: str, code: str | None = None):
        code = code or self.code
        super().__init__(message if message.startswith("[UPMCEP_") else f"[UPMCEP_{code}] {message}", code)


def spark_error(e: SparkcepError) -> SparkSourceError:
    """``e`` as a SparkSourceError with the same code (for errors crossing into Spark)."""
    return e if isinstance(e, SparkSourceError) else SparkSourceError(str(e), e.code)


@dataclass(frozen=True)
class SourceOptions:
    engine: str | None
    stream: str
    starting: str | dict[int, int] = "earliest"
    max_records: int | None = None
    rows_per_partition: int = 1_000_000
    metadata: bool = True
    consumer: str = "spark"
    metrics_interval: float = 1.0

    @classmethod
    def parse(cls, options) -> "SourceOptions":
        """Options from Spark's case-insensitive option map; SparkSourceError ``OPTION`` when invalid."""
        opts = {str(k).lower(): v for k, v in dict(options).items()}
        stream = opts.get("stream") or opts.get("path")
        if not stream:
            raise SparkSourceError("option 'stream' is required: .option('stream', '<engine stream name>')",
                                   "OPTION")
        return cls(engine=opts.get("engine") or None, stream=stream,
                   starting=_starting(opts.get("startingoffsets", "earliest")),
                   max_records=_positive(opts, "maxrecordspertrigger", "maxRecordsPerTrigger", None),
                   rows_per_partition=_positive(opts, "rowsperpartition", "rowsPerPartition", 1_000_000),
                   metadata=_bool(opts, "includemetadata", "includeMetadata", True),
                   consumer=opts.get("consumer") or "spark",
                   metrics_interval=_float(opts, "metricsinterval", "metricsInterval", 1.0))


def _starting(value: str):
    v = value.strip()
    if v.lower() in ("earliest", "latest"):
        return v.lower()
    try:
        parsed = json.loads(v)
        return {int(p): int(pos) for p, pos in parsed.items()}
    except (ValueError, AttributeError, TypeError):
        raise SparkSourceError(f"option startingOffsets={value!r}: expected 'earliest', 'latest' or JSON "
                               '{"partition": position, ...}', "OPTION") from None


def _positive(opts: dict, key: str, name: str, default):
    if key not in opts:
        return default
    try:
        n = int(opts[key])
    except ValueError:
        n = 0
    if n < 1:
        raise SparkSourceError(f"option {name}={opts[key]!r}: expected a positive integer", "OPTION")
    return n


def _float(opts: dict, key: str, name: str, default: float) -> float:
    if key not in opts:
        return default
    try:
        x = float(opts[key])
    except ValueError:
        x = -1.0
    if x < 0:
        raise SparkSourceError(f"option {name}={opts[key]!r}: expected a number of seconds >= 0", "OPTION")
    return x


def _bool(opts: dict, key: str, name: str, default: bool) -> bool:
    if key not in opts:
        return default
    v = str(opts[key]).strip().lower()
    if v not in ("true", "false"):
        raise SparkSourceError(f"option {name}={opts[key]!r}: expected true or false", "OPTION")
    return v == "true"
