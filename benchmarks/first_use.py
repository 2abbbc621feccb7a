"""First use of each kind of operator after an install, beside its second use in the same run.

    python benchmarks/first_use.py

What a user meets on a fresh machine: the install fills numba's cache with
``sparkcep warm-up``, and every instance manager runs the same warm-up
before it says it is ready. A kernel the warm-up never ran with some
argument types compiles at its first use instead, in the middle of a
stream. This script fills a numba cache of its own (a temporary directory)
with ``sparkcep warm-up``, then, in a fresh process that ran the warm-up
as an instance manager does, feeds each case below to a new deployment
twice: the first time, and again (the peer: nothing left to compile). Each
case is timed from its first send to the return of ``end`` (in-process
engine, so the instances run inside ``send``). Prints both times per case.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])

CASES = r"""
import json, time
import numpy as np
import sparkcep as cep
from sparkcep.runtime.warmup import warm_up

T0 = 1_700_000_000_000_000
DDL = "ip string, n int64, ts timestamp"


def rows(j, n=2000):
    k = np.arange(n) % 500
    return {"ip": [f"10.0.{i % 7}.{i}" for i in k], "n": k, "ts": np.full(n, T0 + j * 600_000, "datetime64[us]")}


def windows(window, key):
    def make():
        q = cep.Query("c")
        q.output("o", q.stream("a", DDL, time="ts").aggregate(window, by=key, c=cep.count(), f=cep.first("ip")))
        return q
    return make


def join_on(key):
    def make():
        q = cep.Query("c")
        q.output("o", q.stream("a", DDL, time="ts").join(q.stream("b", DDL, time="ts"), cep.TimeWindow("1s"), on=key))
        return q
    return make


def startswith():
    q = cep.Query("c")
    q.output("o", q.stream("a", DDL, time="ts").filter(cep.col("ip").startswith("10.0.3")))
    return q


CASES = {
    "window close leaving windows open (by ip)": windows(cep.TimeWindow("1s"), "ip"),
    "join on an integer key": join_on("n"),
    "tuple window by a string": windows(cep.TupleWindow(3), "ip"),
    "running aggregate by an integer": windows(cep.Running(), "n"),
    "startswith filter": startswith,
}


def feed(make) -> float:
    q = make()
    with cep.Engine.local() as e:
        e.deploy(q)
        t = time.perf_counter()
        for j in range(4):
            for stream in q.sources:
                e.send(stream, rows(j))
        for stream in q.sources:
            e.end(stream)
        return time.perf_counter() - t


warm_up()
print(json.dumps({name: [feed(make), feed(make)] for name, make in CASES.items()}))
"""


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)  # no options: refuses any given
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p] + [ROOT]  # a given PYTHONPATH first
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    with tempfile.TemporaryDirectory(prefix="sparkcep-numba-") as cache:
        env["NUMBA_CACHE_DIR"] = cache
        print("filling a fresh numba cache with `sparkcep warm-up` (a minute or two) ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "sparkcep", "warm-up"], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        done = subprocess.run([sys.executable, "-c", CASES], env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"the timed process failed:\n{done.stderr[-3000:]}")
    times = json.loads(done.stdout.strip().splitlines()[-1])
    print("first use after an install (numba cache filled by `sparkcep warm-up`), in-process engine,")
    print("first send to end of input, ms; peer: the same case again in the same process")
    print(f"{'case':44s} {'first':>9s} {'again':>9s} {'first - again':>14s}")
    for name, (first, again) in times.items():
        print(f"{name:44s} {first * 1e3:9.1f} {again * 1e3:9.1f} {(first - again) * 1e3:14.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
