"""The warm-up leaves no kernel for the first batches to compile.

In a fresh interpreter: ``warm_up()``, then queries as users run them (windows that fire while
later windows stay open, a sliding window, tuple windows and running aggregates, each keyed by a
string and by an integer; joins on both kinds of key; string comparisons, ``startswith`` and
``split_part``), each on two instances. Every numba kernel of the core and the runtime must have
been compiled (or loaded from the cache) by the warm-up already: a signature it missed costs the
first window close or join about 0.7-0.85 s to compile on a fresh machine (the install's
``sparkcep warm-up`` does not cache it either), and a few ms to load in every new instance manager
after that.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = r"""
import importlib, json, pkgutil
import numpy as np
from numba.core.registry import CPUDispatcher
import sparkcep as cep
import sparkcep.core, sparkcep.runtime
from sparkcep.runtime.warmup import warm_up

modules = [importlib.import_module(m.name) for pkg in (sparkcep.core, sparkcep.runtime)
           for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")]

def signatures():
    return {f"{m.__name__}.{name}": {str(s) for s in f.signatures} for m in modules
            for name, f in vars(m).items() if isinstance(f, CPUDispatcher)}

warm_up()
before = signatures()
rng = np.random.default_rng(0)
T0 = 1_700_000_000_000_000

def feed(q, batches_of):
    with cep.Engine.local() as e:
        e.deploy(q, parallelism=2, bins=16)
        for j in range(12):
            for stream in q.sources:
                e.send(stream, batches_of(j))
        for stream in q.sources:
            e.end(stream)

def rows(j, n=400):
    k = rng.integers(0, 300, n)
    return {"ip": [f"10.0.{i % 7}.{i}" for i in k], "n": k, "v": rng.integers(0, 100, n), "x": rng.random(n),
            "ts": np.full(n, T0 + j * 400_000, "datetime64[us]")}

ddl = "ip string, n int64, v int64, x float64, ts timestamp"
for window in (cep.TimeWindow("1s"), cep.TimeWindow("2s", advance="1s"), cep.TupleWindow(3), cep.Running()):
    for key in ("ip", "n"):
        q = cep.Query("w")
        s = q.stream("ev", ddl, time="ts")
        q.output("o", s.aggregate(window, by=key, c=cep.count(), s=cep.sum("v"), m=cep.min("ts"),
                                  a=cep.avg("x"), f=cep.first("ip")))
        feed(q, rows)
q = cep.Query("s")
s = q.stream("ev", ddl, time="ts")
ip = cep.col("ip")
q.output("o", s.filter((ip == "10.0.1.8") | (ip < ip) | ip.startswith("10.0.2")).map(p=ip.split_part(".", 3), ts="ts"))
feed(q, rows)
for key in ("ip", "n"):
    q = cep.Query("j")
    left, right = q.stream("l", ddl, time="ts"), q.stream("r", ddl, time="ts")
    q.output("o", left.join(right, cep.TimeWindow("1s"), on=key))
    feed(q, rows)
q = cep.Query("p")
s = q.stream("ev", "value string, ts timestamp", time="ts")
q.output("o", s.map(ip=cep.col("value").split_part(",", 1), ts="ts").aggregate(cep.TimeWindow("1s"), by="ip",
                                                                                n=cep.count()))
feed(q, lambda j: {"value": [f"10.0.0.{i},x,y" for i in rng.integers(0, 50, 300)],
                   "ts": np.full(300, T0 + j * 400_000, "datetime64[us]")})
after = signatures()
print(json.dumps({k: sorted(v - before.get(k, set())) for k, v in after.items() if v - before.get(k, set())}))
"""


def test_a_run_after_the_warm_up_compiles_no_kernel():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    missed = json.loads(done.stdout.strip().splitlines()[-1])
    assert missed == {}, f"kernels the warm-up did not compile: {missed}"
