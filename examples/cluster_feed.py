"""Feed the README's cluster walkthrough: sends clicks to the cluster's engine, prints what comes out.

    python3 examples/cluster_feed.py --zk zk://127.0.0.1:2181/demo --token-file cluster.token

Sends go straight to the engine host (where the registry says the stream's
source lives), never through the orchestrator.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pyarrow as pa

import sparkcep as cep


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--zk", required=True, help="the cluster: zk://HOST:PORT/PATH")
    p.add_argument("--token-file", required=True)
    p.add_argument("--sends", type=int, default=50)
    p.add_argument("--rows", type=int, default=2_000)
    a = p.parse_args()
    rng = np.random.default_rng(0)
    start = time.time_ns() // 1000
    with cep.Engine.connect(a.zk, token_file=a.token_file) as engine:
        for i in range(a.sends):
            ts = pa.array(start + i * 400_000 + np.sort(rng.integers(0, 400_000, a.rows)), pa.timestamp("us"))
            engine.send("clicks", {"ip": [f"10.0.0.{k}" for k in rng.integers(0, 64, a.rows)], "ts": ts,
                                   "bytes": rng.integers(40, 1500, a.rows)})
        engine.end("clicks")
        out = engine.collect("clicks_per_ip")
    print(f"sent {a.sends * a.rows:,} clicks; {out.num_rows} rows out, clicks sum to "
          f"{sum(out.column('clicks').to_pylist()):,}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
