"""Compile (or load from numba's on-disk cache) the kernels deployments use, before the first batch.

An instance manager calls :func:`warm_up` before it says it is ready, so it
answers its first batch at once instead of compiling for seconds (all of
them at the same time); with numba's cache warm it takes about a second.
"""

from __future__ import annotations

import datetime as dt
import threading

_done = False
_lock = threading.Lock()


def warm_up() -> None:
    """Run a tiny query over every kernel family once in this process (idempotent)."""
    global _done
    with _lock:
        if _done:
            return
        from sparkcep.core.columns import stamp
        from sparkcep.core.ingest import to_batch
        from sparkcep.query import aggregates as fn
        from sparkcep.query.expressions import col
        from sparkcep.query.query import Query
        from sparkcep.query.running import Running
        from sparkcep.query.windows import TimeWindow, TupleWindow
        from sparkcep.runtime.deployment import Deployment

        schema = "k string, g int64, ts timestamp, v int64, x float64"
        q = Query("__sparkcep_warm_up__")
        s, r = q.stream("__warm_l", schema), q.stream("__warm_r", schema)
        funcs = dict(n=fn.count(), c=fn.count("v"), sv=fn.sum("v"), sx=fn.sum("x"), a=fn.avg("x"),
                     mi=fn.min("v"), mx=fn.max("x"), ms=fn.min("k"), Ms=fn.max("k"), f=fn.first("v"),
                     lx=fn.last("x"), fs=fn.first("k"), ls=fn.last("k"))
        f = s.filter((col("v") > 0) | col("k").is_null())
        q.output("__warm_a", f.aggregate(TimeWindow("10s", advance="5s"), by=["k"], **funcs))
        q.output("__warm_b", s.aggregate(TupleWindow(2), by=["g", "k"], **funcs))
        q.output("__warm_c", s.aggregate(TupleWindow(2), n=fn.count()))
        q.output("__warm_d", s.map(k="k", ts="ts", w=col("v") * 2).join(r, TimeWindow("10s"), on="k"))
        q.output("__warm_e", s.join(r, TimeWindow("10s"), where=col("v_left") < col("v_right")))
        q.output("__warm_f", f.union(s.filter(col("v") < 2)).aggregate(Running(), by=["k"], **funcs))
        q.output("__warm_g", s.map(k=col("k").split_part(",", 1), ts="ts").aggregate(Running(), by="k",
                                                                                     n=fn.count()))
        t0 = dt.datetime(2024, 1, 1)
        rows = {"k": ["a", None, "b", "a"], "g": [1, 2, None, 1], "v": [1, None, 3, 4], "x": [0.5, 1.0, None, 2.0],
                "ts": [t0 + dt.timedelta(seconds=i) for i in range(4)]}
        many = {"k": [f"key-{i}" for i in range(200)], "g": list(range(200)), "v": list(range(200)),
                "x": [0.5] * 200, "ts": [t0] * 200}  # enough keys to grow the tables: rebuilds compile too
        dep = Deployment("warm#1", q, parallelism=2, bins=4)
        seq = 0
        for stream in ("__warm_l", "__warm_r"):
            src = q.sources[stream]
            for data in (rows, many, rows):
                batch = to_batch(stream, src.schema, data, src.time_field)
                dep.push(stream, stamp(batch, seq, src.time_field, dep.sources[stream].max_ts))
                seq += batch.num_rows
                dep.progress(seq - 1)
            dep.end(stream, seq - 1)
        _done = True
