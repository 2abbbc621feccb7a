"""Compile (or load from numba's on-disk cache) the kernels deployments use, before workers start.

A worker forked after :func:`warm_up` inherits the compiled kernels and
answers its first batch at once; otherwise every instance manager would
compile on its first batch (seconds each, all at the same time). The
forkserver imports :mod:`sparkcep.runtime.forkserver_preload`, which calls it.
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
        import sparkcep as cep
        from sparkcep.engine import Engine

        schema = "k string, g int64, ts timestamp, v int64, x float64"
        q = cep.Query("__sparkcep_warm_up__")
        s, r = q.stream("__warm_l", schema), q.stream("__warm_r", schema)
        funcs = dict(n=cep.count(), c=cep.count("v"), sv=cep.sum("v"), sx=cep.sum("x"), a=cep.avg("x"),
                     mi=cep.min("v"), mx=cep.max("x"), ms=cep.min("k"), Ms=cep.max("k"), f=cep.first("v"),
                     lx=cep.last("x"), fs=cep.first("k"), ls=cep.last("k"))
        f = s.filter((cep.col("v") > 0) | cep.col("k").is_null())
        q.output("__warm_a", f.aggregate(cep.TimeWindow("10s", advance="5s"), by=["k"], **funcs))
        q.output("__warm_b", s.aggregate(cep.TupleWindow(2), by=["g", "k"], **funcs))
        q.output("__warm_c", s.aggregate(cep.TupleWindow(2), n=cep.count()))
        q.output("__warm_d", s.map(k="k", ts="ts", w=cep.col("v") * 2).join(r, cep.TimeWindow("10s"), on="k"))
        q.output("__warm_e", s.join(r, cep.TimeWindow("10s"), where=cep.col("v_left") < cep.col("v_right")))
        t0 = dt.datetime(2024, 1, 1)
        rows = {"k": ["a", None, "b", "a"], "g": [1, 2, None, 1], "v": [1, None, 3, 4], "x": [0.5, 1.0, None, 2.0],
                "ts": [t0 + dt.timedelta(seconds=i) for i in range(4)]}
        many = {"k": [f"key-{i}" for i in range(200)], "g": list(range(200)), "v": list(range(200)),
                "x": [0.5] * 200, "ts": [t0] * 200}  # enough keys to grow the tables: rebuilds compile too
        with Engine(workers=0) as engine:
            engine.deploy(q, parallelism=2, bins=4)
            for stream in ("__warm_l", "__warm_r"):
                engine.send(stream, rows)
                engine.send(stream, many)
                engine.send(stream, rows)
                engine.end(stream)
        _done = True
