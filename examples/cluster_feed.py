"""Feed the README's cluster walkthrough: clicks as they happen, sent to the cluster's engine; prints what came out.

    python3 examples/cluster_feed.py --zk zk://127.0.0.1:2181/demo --token-file cluster.token

Each send carries the clicks of the last tenth of a second (``--sends`` sends,
``--rows`` clicks each, 10 sends a second), stamped with the time they
happened: the event time moves on with the clock, and each window of the
query closes once a later send shows the time past its end. The stream is
never ended, so the feed can run again, later, and the windows go on where
the last run left them (the last second of a run stays open until then).
Sends go straight to the engine host (where the registry says the stream's
source lives), never through the orchestrator.

It prints the windows that closed while it ran and checks them per IP: each
window's clicks and bytes per IP must be exactly what this run sent.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import numpy as np
import pyarrow as pa

import sparkcep as cep
from sparkcep.arguments import bounded

EVERY_S = 0.1  # a send carries the clicks of this long
WINDOW_US = 1_000_000  # the query's windows (examples/cluster_query.py)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--zk", required=True, help="the cluster: zk://HOST:PORT/PATH")
    p.add_argument("--token-file", required=True)
    p.add_argument("--sends", type=bounded(int, 1), default=50)
    p.add_argument("--rows", type=bounded(int, 1, 1_000_000), default=2_000)
    a = p.parse_args()
    rng = np.random.default_rng()
    sent_clicks, sent_bytes = Counter(), Counter()  # (window start, ip) -> what this run sent
    first = seen = watermark = None  # this run's first click; the latest one sent so far
    with cep.Engine.connect(a.zk, token_file=a.token_file) as engine:
        for _ in range(a.sends):
            now = time.time_ns() // 1000
            ts = np.sort(rng.integers(now - int(EVERY_S * 1e6), now + 1, a.rows))
            ips = np.array([f"10.0.0.{k}" for k in rng.integers(0, 64, a.rows)])
            nbytes = rng.integers(40, 1500, a.rows)
            engine.send("clicks", {"ip": ips, "ts": pa.array(ts, pa.timestamp("us")), "bytes": nbytes})
            watermark = seen  # the send's watermark: the windows ending at or before it have closed
            first = int(ts[0]) if first is None else first
            seen = int(ts[-1]) if seen is None else max(seen, int(ts[-1]))
            for w, ip, b in zip(ts - ts % WINDOW_US, ips, nbytes):
                sent_clicks[int(w), ip] += 1
                sent_bytes[int(w), ip] += int(b)
            time.sleep(max(0.0, now / 1e6 + EVERY_S - time.time()))
        out = engine.collect("clicks_per_ip")
    # windows wholly inside this run that closed: from the first window after its first click, ending by
    # the watermark of its last send (an earlier run's clicks are all before ``first``)
    lo, hi = first - first % WINDOW_US + WINDOW_US, watermark or 0
    got = {(r["window_start"], r["ip"]): (r["clicks"], r["bytes"]) for r in _rows(out) if lo <= r["window_start"]
           and r["window_end"] <= hi}
    want = {k: (n, sent_bytes[k]) for k, n in sent_clicks.items() if lo <= k[0] and k[0] + WINDOW_US <= hi}
    print(f"sent {a.sends * a.rows:,} clicks in {a.sends} sends; {out.num_rows:,} rows out so far")
    windows = sorted({w for w, _ in want})
    for w in windows:
        ips = [k for k in want if k[0] == w]
        print(f"  window {time.strftime('%H:%M:%S', time.gmtime(w // 1_000_000))}: {len(ips)} IPs, "
              f"{sum(want[k][0] for k in ips):,} clicks sent")
    same = got == want
    print(f"{len(windows)} windows closed during this run: per window and IP, clicks and bytes "
          f"{'equal what this run sent' if same else 'DIFFER from what this run sent'} ({len(want):,} rows)")
    return 0 if same and windows else 1


def _rows(table: pa.Table) -> list[dict]:
    """Rows with times as int microseconds."""
    t = table.set_column(0, "window_start", table.column("window_start").cast(pa.int64()))
    return t.set_column(1, "window_end", t.column("window_end").cast(pa.int64())).to_pylist()


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except cep.SparkcepError as e:  # the engine's own message says what failed (a worker's death, say)
        raise SystemExit(f"cluster_feed: {e} [{e.code}]") from None
