"""Options of the ``upmcep`` data source, checked once when Spark creates the data source.

=====================  ==================================================================
``engine``             unset or ``local``: the local engine (its published endpoint);
                       ``host:port``: that endpoint; ``zk://host:port/path``: the engine
                       host of that cluster (its registry's ``/engine``)
``tokenFile``          the file holding the engine's token; default: the file an engine of
                       this machine writes under ``$SPARKCEP_HOME``, else ``$SPARKCEP_TOKEN_FILE``;
                       required with ``zk://`` (the cluster's token)
``stream``             the engine stream: an output (read) or an input (write); ``load(name)``
                       and ``save(name)`` work too. ``$metrics`` reads the metric samples
``form``               ``$metrics`` only: ``long`` (default: ``time, name, value``, a row per
                       metric and sample) or ``wide`` (``time`` and a column per metric the
                       engine reports at ``load()``, a row per sample)
``startingOffsets``    ``earliest`` (default: every retained row), ``latest``, or JSON
                       ``{"partition": position}``; a checkpoint overrides it
``maxRecordsPerTrigger``  at most this many rows per micro-batch, spread over partitions
``rowsPerPartition``   at most this many rows per Spark task (default 1,000,000); a range is
                       split in equal parts
``includeMetadata``    ``true``: add ``_partition``, ``_offset`` and ``_seq`` (default ``false``)
``consumer``           name under which reads are committed; default: the streaming query's
                       own, kept in its offsets (so in its checkpoint). Rows are released once
                       every consumer of an output passed them
``metricsInterval``    seconds between two ``$metrics`` samples (default 1, at least 0.1)
=====================  ==================================================================

The options from ``startingOffsets`` on apply to reading only;
``startingOffsets``, ``maxRecordsPerTrigger`` and ``consumer`` to streaming
reads only (a batch read takes every row the output holds). Spark adds
``path`` (``load(name)``, ``save(name)``, ``start(name)``),
``checkpointLocation`` and ``queryName`` itself; any other key is refused
with the closest valid name.
"""

from __future__ import annotations

import difflib
import json
import math
from dataclasses import dataclass

from sparkcep.arguments import integer
from sparkcep.errors import SparkcepError

COMMON = ("stream", "engine", "tokenFile")
READ_ONLY = ("startingOffsets", "maxRecordsPerTrigger", "rowsPerPartition", "includeMetadata", "consumer",
             "metricsInterval", "form")
STREAM_READ_ONLY = ("startingOffsets", "maxRecordsPerTrigger", "consumer")
FROM_SPARK = ("path", "checkpointLocation", "queryName")  # what Spark itself passes to a Python data source
_NAMES = {n.lower(): n for n in COMMON + READ_ONLY + FROM_SPARK}
METRICS = "$metrics"
FORMS = ("long", "wide")  # of $metrics
INT64_MAX = (1 << 63) - 1
MIN_INTERVAL_S = 0.1  # metricsInterval: 0 sampled at every micro-batch, and the stream never caught up


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
    token_file: str | None = None
    starting: str | dict[int, int] = "earliest"
    max_records: int | None = None
    rows_per_partition: int = 1_000_000
    metadata: bool = False
    consumer: str | None = None  # None: the streaming query's own
    metrics_interval: float = 1.0
    form: str | None = None  # of $metrics: long or wide (None: long)
    given: frozenset[str] = frozenset()  # the options set, by their canonical names

    @classmethod
    def parse(cls, options) -> "SourceOptions":
        """Options from Spark's case-insensitive option map; SparkSourceError ``OPTION`` when invalid."""
        opts = {str(k).lower(): v for k, v in dict(options).items()}
        for key in opts:
            if key not in _NAMES:
                raise SparkSourceError(f"unknown option {key!r}{_suggest(key)}; the options are "
                                       f"{', '.join(COMMON + READ_ONLY)}", "OPTION")
        stream = opts.get("stream") or opts.get("path")
        if opts.get("stream") and opts.get("path") and opts["stream"] != opts["path"]:
            raise SparkSourceError(f"option stream={opts['stream']!r} and the name {opts['path']!r} given to "
                                   "load()/save()/start() name two streams: give one of them", "OPTION")
        if not stream:
            raise SparkSourceError("option 'stream' is required: .option('stream', '<engine stream name>')",
                                   "OPTION")
        for key, name in (("form", "form"), ("metricsinterval", "metricsInterval")):
            if key in opts and stream != METRICS:
                raise SparkSourceError(f"option {name} applies to stream {METRICS} only, not {stream!r}", "OPTION")
        for key, name in (("engine", "engine"), ("tokenfile", "tokenFile"), ("consumer", "consumer")):
            if key in opts and not str(opts[key]).strip():  # an empty shell variable: not the default, silently
                raise SparkSourceError(f"option {name} is empty: leave it out for the default, or give a value",
                                       "OPTION")
        return cls(engine=opts.get("engine") or None, stream=stream, token_file=opts.get("tokenfile") or None,
                   starting=_starting(opts.get("startingoffsets", "earliest")),
                   max_records=_positive(opts, "maxRecordsPerTrigger", None),
                   rows_per_partition=_positive(opts, "rowsPerPartition", 1_000_000),
                   metadata=_bool(opts, "includeMetadata", False),
                   consumer=opts.get("consumer") or None,
                   metrics_interval=_float(opts, "metricsInterval", 1.0),
                   form=_choice(opts, "form", FORMS),
                   given=frozenset(_NAMES[k] for k in opts))

    def check_batch_readable(self) -> None:
        """Refuse the options of streaming reads on a batch read (SparkSourceError ``OPTION``): a batch read
        takes every row the output holds, commits nothing."""
        misplaced = [n for n in STREAM_READ_ONLY if n in self.given]
        if misplaced:
            raise SparkSourceError(f"option {misplaced[0]} applies to streaming reads (readStream); a batch read "
                                   "takes every row the output holds now", "OPTION")

    def check_writable(self) -> None:
        """Refuse reading options on a writer (SparkSourceError ``OPTION``)."""
        misplaced = [n for n in READ_ONLY if n in self.given]
        if misplaced:
            raise SparkSourceError(f"option {misplaced[0]} applies to reading (read/readStream); a writer takes "
                                   f"{', '.join(COMMON)}", "OPTION")


def _suggest(key: str, names: dict[str, str] = _NAMES) -> str:
    close = difflib.get_close_matches(key, list(names), n=1, cutoff=0.6)
    return f" (did you mean {names[close[0]]}?)" if close else ""


def _choice(opts: dict, name: str, values: tuple[str, ...]) -> str | None:
    key = name.lower()
    if key not in opts:
        return None
    v = str(opts[key]).strip().lower()
    if v not in values:
        raise SparkSourceError(f"option {name}={opts[key]!r}: expected {' or '.join(values)}"
                               f"{_suggest(v, {x: x for x in values})}", "OPTION")
    return v


def _starting(value: str):
    v = value.strip()
    if v.lower() in ("earliest", "latest"):
        return v.lower()
    try:
        parsed = json.loads(v)
        return {_integer(p, f"option startingOffsets={value!r}: partition {p!r}", 0):
                _integer(pos, f"option startingOffsets={value!r}: the position of partition {p}", 0)
                for p, pos in parsed.items()}
    except (ValueError, AttributeError, TypeError):
        raise SparkSourceError(f"option startingOffsets={value!r}: expected 'earliest', 'latest' or JSON "
                               '{"partition": position, ...}', "OPTION") from None


def _positive(opts: dict, name: str, default):
    key = name.lower()
    return _integer(opts[key], f"option {name}={opts[key]!r}", 1) if key in opts else default


def _integer(value, name: str, minimum: int) -> int:
    """``value`` as an int: a string of digits (Spark hands options over as strings), or what
    :func:`operator.index` takes; a bool, a float or a number below ``minimum`` or past a 64-bit integer
    (what Spark and the engine count rows and positions in) raises ``OPTION``."""
    if isinstance(value, str):
        text = value.strip()
        value = int(text) if text.isascii() and text.lstrip("-").isdecimal() else text
    return integer(value, name, minimum=minimum, maximum=INT64_MAX, error=SparkSourceError, code="OPTION")


def _float(opts: dict, name: str, default: float) -> float:
    key = name.lower()
    if key not in opts:
        return default
    try:
        x = float(opts[key])
    except ValueError:
        x = -1.0
    if not MIN_INTERVAL_S <= x < math.inf:  # nan too
        raise SparkSourceError(f"option {name}={opts[key]!r}: expected a number of seconds >= {MIN_INTERVAL_S}",
                               "OPTION")
    return x


def _bool(opts: dict, name: str, default: bool) -> bool:
    key = name.lower()
    if key not in opts:
        return default
    v = str(opts[key]).strip().lower()
    if v not in ("true", "false"):
        raise SparkSourceError(f"option {name}={opts[key]!r}: expected true or false", "OPTION")
    return v == "true"
