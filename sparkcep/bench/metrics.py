"""Throughput and latency of a driven run, as HiBench reports them.

Latency is one sample per output row: the time the row left the engine (the
``engine.subscribe`` callback's clock) minus the arrival of the input tuple
it answers, where arrival is the wall-clock time just before the ``send``
that carried that tuple:

* identity, repartition — the row's own tuple (found by its key);
* wordcount — the newest tuple of that IP in the batch that updated it (the
  row carries its key);
* fixwindow — the tuple that closed the window: the first tuple whose event
  time is at or past the window's end (the first batch whose last key is
  ``>= window_end``); windows still open at the end of input are closed by
  ``engine.end``, whose call time is then the arrival.

HiBench itself reports ``outTime - inTime`` per record, with ``inTime`` the
record's key; for fixwindow it uses the window's *earliest* record, which adds
the window length to every sample. We measure from the closing tuple so the
figure is the engine's delay, not the window's. Throughput is input records
over the time from the first send to the last result (HiBench: records over
first-in to last-out).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from sparkcep.bench.driver import Run

PERCENTILES = {"p50": 50, "p75": 75, "p95": 95, "p99": 99, "p99.9": 99.9}


def _ints(arr) -> np.ndarray:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_timestamp(arr.type):
        arr = arr.cast(pa.int64())
    return arr.to_numpy(zero_copy_only=False)


def latency_columns(workload: str) -> list[str]:
    """The output columns :func:`arrivals` reads."""
    return ["window_end"] if workload == "fixwindow" else ["key"]


def arrivals(workload: str, run: Run, batch: pa.RecordBatch) -> np.ndarray:
    """Arrival time (ns) of the tuple each row of an output batch answers."""
    send_t, first, last, _ = run.arrays()
    if workload == "fixwindow":
        ends = _ints(batch.column("window_end"))
        b = np.searchsorted(last, ends, side="left")
        closed_by_end = b >= len(send_t)
        return np.where(closed_by_end, run.t_end, send_t[np.minimum(b, len(send_t) - 1)])
    keys = _ints(batch.column("key"))
    b = np.searchsorted(first, keys, side="right") - 1
    return send_t[np.clip(b, 0, len(send_t) - 1)]


def latencies(workload: str, run: Run) -> tuple[np.ndarray, np.ndarray]:
    """(latency ns, time out ns) per output row."""
    lat, when = [], []
    for t_out, batch in zip(run.out_t, run.out):
        if batch.num_rows:
            lat.append(t_out - arrivals(workload, run, batch))
            when.append(np.full(batch.num_rows, t_out, np.int64))
    if not lat:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(lat), np.concatenate(when)


def percentiles_ms(lat_ns: np.ndarray) -> dict[str, float]:
    """p50 .. p99.9, max and mean of latency samples, in ms (NaN when there are none)."""
    if len(lat_ns) == 0:
        return {k: float("nan") for k in list(PERCENTILES) + ["max", "mean"]}
    ms = lat_ns / 1e6
    out = {k: float(np.percentile(ms, q)) for k, q in PERCENTILES.items()}
    out["max"] = float(ms.max())
    out["mean"] = float(ms.mean())
    return out


def summarize(run: Run, lat: tuple[np.ndarray, np.ndarray]) -> dict:
    """Throughput (records/s), latency percentiles (ms) and counts of a run."""
    last_out = max(run.out_t) if run.out_t else run.t_done
    elapsed = max(last_out, run.t_done) - run.t_start
    return {
        "events": run.events,
        "output_rows": int(run.out_rows),
        "seconds": elapsed / 1e9,
        "send_seconds": (run.t_end - run.t_start) / 1e9,
        "throughput": run.events / (elapsed / 1e9) if elapsed > 0 else float("nan"),
        "offered_rate": run.rate,
        "latency_ms": percentiles_ms(lat[0]),
    }


def timeline(run: Run, lat: tuple[np.ndarray, np.ndarray], step_s: float = 1.0) -> dict[str, list]:
    """Per ``step_s`` since the start: input records/s, output rows/s, latency p50/p99 (ms)."""
    send_t, _, _, rows = run.arrays()
    return series(run.t_start, max([run.t_done] + run.out_t), send_t, rows, lat[0], lat[1], step_s)


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
