"""Run a sparkcep query on rows, sent in chunks, and read its outputs as plain frames.

Shared by the tests (and the benchmarks). Rows are dicts of plain Python
values; timestamps are int microseconds on both sides of a comparison.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass

import pandas as pd
import pyarrow as pa

import sparkcep as cep
from reference import stamp

ARROW = {"string": pa.string(), "int64": pa.int64(), "int32": pa.int32(), "float64": pa.float64(),
         "float32": pa.float32(), "bool": pa.bool_(), "timestamp": pa.timestamp("us")}


def table(rows: list[dict], schema: dict[str, str]) -> pa.Table:
    """An Arrow table of ``rows`` with the stream's ``schema`` ({field: engine type name})."""
    return pa.table({f: pa.array([r[f] for r in rows], ARROW[t]) for f, t in schema.items()})


def plain(t: pa.Table) -> pd.DataFrame:
    """An engine output as a DataFrame of Python values: timestamps as int us, nulls as None."""
    cols = {}
    for f in t.schema:
        c = t.column(f.name)
        if pa.types.is_timestamp(f.type):
            c = c.cast(pa.int64())
        cols[f.name] = pd.Series(c.to_pylist(), dtype=object)
    return pd.DataFrame(cols, columns=t.schema.names)


def chunk(sends, rng: random.Random | None = None, sizes=None):
    """Cut each send into consecutive pieces: random sizes, or the given ``sizes`` cycled."""
    out = []
    for stream, rows in sends:
        i, k = 0, 0
        while i < len(rows):
            n = sizes[k % len(sizes)] if sizes else rng.randint(1, max(1, len(rows)))
            out.append((stream, rows[i:i + n]))
            i, k = i + n, k + 1
    return out


def interleave(rng: random.Random, *sends_lists):
    """Merge several send lists, keeping each one's order."""
    lists = [list(s) for s in sends_lists]
    out = []
    while any(lists):
        pick = rng.choice([l for l in lists if l])
        out.append(pick.pop(0))
    return out


@dataclass
class Run:
    outputs: dict[str, pd.DataFrame]
    arrow: dict[str, pa.Table]
    late: int
    metrics: dict


def run(query: cep.Query, sends, parallelism=1, end=True, bins: int = 128, schemas=None) -> Run:
    """Deploy ``query`` on a fresh local engine, send ``sends`` = [(stream, rows)], end, collect."""
    schemas = schemas or {n: s.schema.fields for n, s in query.sources.items()}
    with cep.Engine.local(workers=0) as e:
        e.deploy(query, parallelism=parallelism, bins=bins)
        for stream, rows in sends:
            if rows:
                e.send(stream, table(rows, schemas[stream]))
        if end:
            for stream in query.sources:
                e.end(stream)
        arrow = {o: e.collect(o) for o in query.outputs}
        metrics = e.metrics()
    late = sum(metrics["late"].get(query.name, {}).values())
    return Run({o: plain(t) for o, t in arrow.items()}, arrow, late, metrics)


def stamped(query: cep.Query, sends):
    """The reference's view of ``sends`` into ``query``'s sources."""
    return stamp(sends, {n: s.time_field for n, s in query.sources.items()})


def wait(look, what: str, timeout: float = 60.0, every: float = 0.05):
    """``look()``'s first truthy value, asked every ``every`` s; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (value := look()):
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(every)
    return value


class InThread(threading.Thread):
    """``call()`` run in a daemon thread of its own, started at once: its ``result``, or the ``error`` it
    raised and when (``failed_at``, monotonic)."""

    def __init__(self, call):
        super().__init__(daemon=True)
        self.call, self.result, self.error, self.failed_at = call, None, None, None
        self.start()

    def run(self):
        try:
            self.result = self.call()
        except BaseException as e:  # noqa: BLE001 - the test asserts on it
            self.error, self.failed_at = e, time.monotonic()
