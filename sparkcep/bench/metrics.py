"""Throughput and latency of a driven run, per result row and per window close.

Latency is one sample per output row: the time the row left the engine (the
``engine.subscribe`` callback's clock) minus the arrival of the input it
answers, where arrival is the wall-clock time just before the chunk that
carried that input was sent. What a row answers depends on the workload
(:data:`ANSWERS`):

* ``record`` (identity, repartition) — its own record, found by its key;
* ``occurrence`` (wordcount, wordcount_tuples) — the record that made the
  row's count: the ``count``-th record of the row's IP (wordcount_tuples:
  the ``window_end``-th), found from the generator's IP of every record;
* ``window`` (fixwindow, NEXMark) — the input that closed the window: the
  first chunk whose last event time is at or past ``window_end``; windows
  still open at the end of input are closed by ``engine.end``, whose call
  time is then the arrival.

Windowed workloads are also measured per *window close*: one sample per
distinct ``window_end``, from its arrival to the moment its last row left.
Every row of one close shares its arrival, so per-row percentiles weigh a
close by its rows; the per-close ones count each close once.

HiBench itself reports ``outTime - inTime`` per record, with ``inTime`` the
record's key; for fixwindow it uses the window's *earliest* record, which
adds the window length to every sample. We measure from the closing input
so the figure is the engine's delay, not the window's. Throughput is input
events over the time from the first send to the last result (HiBench:
records over first-in to last-out).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkcep.bench.driver import Run

PERCENTILES = {"p50": 50, "p75": 75, "p95": 95, "p99": 99, "p99.9": 99.9}
ANSWERS = {"identity": "record", "repartition": "record", "wordcount": "occurrence",
           "wordcount_tuples": "occurrence", "fixwindow": "window", "q5": "window", "q7": "window",
           "q8": "window"}
ORDINAL = {"wordcount": "count", "wordcount_tuples": "window_end"}  # the column counting an IP's records


@dataclass
class Latency:
    """Latency samples of a run (ns): per result row (with the time each left), and per window close."""

    rows: np.ndarray
    when: np.ndarray
    closes: np.ndarray | None = None  # None: the workload has no windows


class Occurrences:
    """Where the ``k``-th record of each key sits in the input: from the index into ``pool`` of
    every record's key (the generator's IPs)."""

    def __init__(self, pool: pa.Array, index: np.ndarray):
        self.pool = pool
        self.order = np.argsort(index, kind="stable")
        self.starts = np.concatenate([[0], np.cumsum(np.bincount(index, minlength=len(pool)))])

    def positions(self, keys: pa.Array, k: np.ndarray) -> np.ndarray:
        """Input position of the ``k[i]``-th record (from 1) of key ``keys[i]``."""
        idx = pc.index_in(keys, value_set=self.pool).to_numpy(zero_copy_only=False)
        return self.order[self.starts[idx] + k - 1]


def _ints(arr) -> np.ndarray:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_timestamp(arr.type):
        arr = arr.cast(pa.int64())
    return arr.to_numpy(zero_copy_only=False)


def latency_columns(workload: str) -> list[str]:
    """The output columns :func:`arrivals` reads."""
    return {"record": ["key"], "occurrence": ["ip", ORDINAL.get(workload, "count")],
            "window": ["window_end"]}[ANSWERS[workload]]


def arrivals(workload: str, run: Run, batch: pa.RecordBatch, occurrences: Occurrences | None = None) -> np.ndarray:
    """Arrival time (ns) of the input each row of an output batch answers."""
    send_t, first, last, rows = run.arrays()
    answers = ANSWERS[workload]
    if answers == "window":
        b = np.searchsorted(last, _ints(batch.column("window_end")), side="left")
        return np.where(b >= len(send_t), run.t_end, send_t[np.minimum(b, len(send_t) - 1)])
    if answers == "occurrence":
        pos = occurrences.positions(batch.column("ip"), _ints(batch.column(ORDINAL[workload])))
        b = np.searchsorted(np.cumsum(rows), pos, side="right")
    else:
        b = np.searchsorted(first, _ints(batch.column("key")), side="right") - 1
    return send_t[np.clip(b, 0, len(send_t) - 1)]


def latencies(workload: str, run: Run, occurrences: Occurrences | None = None) -> Latency:
    """The latency samples of a run: per row, and per window close for windowed workloads."""
    lat, when, ends = [], [], []
    for t_out, batch in zip(run.out_t, run.out):
        if batch.num_rows:
            lat.append(t_out - arrivals(workload, run, batch, occurrences))
            when.append(np.full(batch.num_rows, t_out, np.int64))
            if ANSWERS[workload] == "window":
                ends.append(_ints(batch.column("window_end")))
    if not lat:
        return Latency(np.zeros(0, np.int64), np.zeros(0, np.int64),
                       np.zeros(0, np.int64) if ANSWERS[workload] == "window" else None)
    rows, when = np.concatenate(lat), np.concatenate(when)
    closes = per_close(np.concatenate(ends), rows) if ends else None
    return Latency(rows, when, closes)


def per_close(ends: np.ndarray, rows_ns: np.ndarray) -> np.ndarray:
    """One sample per window close (distinct ``ends``): the largest latency of its rows, i.e. from
    its arrival to its last row out."""
    _, inverse = np.unique(ends, return_inverse=True)
    out = np.full(inverse.max() + 1 if len(inverse) else 0, np.iinfo(np.int64).min, np.int64)
    np.maximum.at(out, inverse, rows_ns)
    return out


def percentiles_ms(lat_ns: np.ndarray) -> dict[str, float]:
    """p50 .. p99.9, max and mean of latency samples, in ms (NaN when there are none)."""
    if len(lat_ns) == 0:
        return {k: float("nan") for k in list(PERCENTILES) + ["max", "mean"]}
    ms = lat_ns / 1e6
    out = {k: float(np.percentile(ms, q)) for k, q in PERCENTILES.items()}
    out["max"] = float(ms.max())
    out["mean"] = float(ms.mean())
    return out


def latency_summary(lat: Latency) -> dict:
    """Percentiles per row and per close, with how many samples each summarises."""
    out = {"latency_ms": percentiles_ms(lat.rows), "latency_samples": int(len(lat.rows))}
    if lat.closes is not None:
        out.update(close_latency_ms=percentiles_ms(lat.closes), closes=int(len(lat.closes)))
    return out


def summarize(run: Run, lat: Latency) -> dict:
    """Throughput (events/s), latency percentiles (ms) and counts of a run."""
    last_out = max(run.out_t) if run.out_t else run.t_done
    elapsed = max(last_out, run.t_done) - run.t_start
    return {
        "events": run.events,
        "output_rows": int(run.out_rows),
        "seconds": elapsed / 1e9,
        "send_seconds": (run.t_end - run.t_start) / 1e9,
        "throughput": run.events / (elapsed / 1e9) if elapsed > 0 else float("nan"),
        "offered_rate": run.rate,
        **latency_summary(lat),
    }


def timeline(run: Run, lat: Latency, step_s: float = 1.0) -> dict[str, list]:
    """Per ``step_s`` since the start: input events/s, output rows/s, latency p50/p99 (ms)."""
    send_t, _, _, rows = run.arrays()
    return series(run.t_start, max([run.t_done] + run.out_t), send_t, rows, lat.rows, lat.when, step_s)


def series(t_start: int, t_end: int, in_t: np.ndarray, in_rows: np.ndarray, lat_ns: np.ndarray,
           when_ns: np.ndarray, step_s: float = 1.0) -> dict[str, list]:
    """Input rate, output rate and latency p50/p99 per time step (times in ns since the epoch)."""
    nsteps = max(1, int(np.ceil((t_end - t_start) / (step_s * 1e9))))
    edges = t_start + (np.arange(nsteps + 1) * step_s * 1e9).astype(np.int64)
    edges[-1] = max(edges[-1], t_end + 1)
    sent = np.histogram(in_t, bins=edges, weights=in_rows)[0] / step_s
    out = np.histogram(when_ns, bins=edges)[0] / step_s
    p50 = np.full(nsteps, np.nan)
    p99 = np.full(nsteps, np.nan)
    idx = np.clip(np.searchsorted(edges, when_ns, side="right") - 1, 0, nsteps - 1)
    order = np.argsort(idx, kind="stable")
    bounds = np.searchsorted(idx[order], np.arange(nsteps + 1))
    for k in range(nsteps):
        seg = lat_ns[order[bounds[k]:bounds[k + 1]]]
        if len(seg):
            p50[k], p99[k] = np.percentile(seg, 50) / 1e6, np.percentile(seg, 99) / 1e6
    return {"t_s": ((edges[:-1] - t_start) / 1e9).tolist(), "input_rate": sent.tolist(),
            "output_rate": out.tolist(), "latency_p50_ms": p50.tolist(), "latency_p99_ms": p99.tolist()}
