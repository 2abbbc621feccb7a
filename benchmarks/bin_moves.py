"""Moving bins of a window aggregate between instances: ``take_bins`` + ``put_bins``.

Shape: a 10 s tumbling count by key over 10^6 distinct keys, all in one
window, 4096 bins, every bin held by instance A (the HiBench fixwindow
aggregate scaled up). Moves 1024 and 2048 of the bins from A to an instance
that holds other bins (Megaphone's case) and to a brand-new instance, and
pickles what moves (protocol 5, as between processes). Prints the median of
``--repeat`` runs in wall and CPU seconds beside the per-bin loop this
replaced: 5.96 s for 1024 bins (5.8 ms a bin, each extract scanning the whole
table), measured before on the project's machines.

    python benchmarks/bin_moves.py [--keys 1000000] [--bins 4096] [--repeat 3]
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

try:
    import sparkcep as cep
except ModuleNotFoundError:  # run from a source checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import sparkcep as cep

from sparkcep.arguments import bounded
from sparkcep.core import columns
from sparkcep.core.operators import WM_NONE, physical
from sparkcep.runtime.deployment import MAX_BINS

T0 = 1_700_000_000_000_000
PER_BIN_LOOP_S = 5.96  # the former take_bin/put_bin loop, 1024 of 4096 bins, 10^6 keys
PER_BIN_LOOP_BINS = 1024
MOVES = (1024, 2048)  # bins moved, out of the 7/8 of them A keeps
MIN_BINS = 4096  # the fewest bins whose 7/8 hold MOVES[-1]
MAX_KEYS = 10 ** 7  # made up front: 10^7 peak at 3 GB (keys, table, the bins moved, their pickle), 20 s a run
MAX_REPEAT = 100


class Clock:
    """Wall-clock and process CPU time of a block (CPU time: what a busy machine does not inflate)."""

    def __enter__(self):
        self.w, self.c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.w, time.process_time() - self.c


def aggregate_op():
    q = cep.Query("bin_moves")
    q.output("out", q.stream("ev", "ip string, ts timestamp", time="ts")
             .aggregate(cep.TimeWindow("10s"), by="ip", n=cep.count()))
    return q.outputs["out"]


def loaded(op, keys: int, bins: int):
    """An instance of ``op`` holding one window entry for each of ``keys`` keys."""
    ip = pa.array(np.char.add("10.", np.arange(keys).astype(str)))
    if isinstance(ip, pa.ChunkedArray):  # pyarrow cuts a numpy str array of 1.8M keys or more in chunks
        ip = ip.combine_chunks()
    n = len(ip)
    batch = pa.RecordBatch.from_arrays(
        [ip, pa.array(np.full(n, T0), pa.timestamp("us")), pa.array(np.arange(n, dtype=np.int64)),
         pa.array(np.zeros(n, np.int64)), pa.array(np.full(n, T0)), pa.array(np.full(n, WM_NONE))],
        names=["ip", "ts"] + list(columns.HIDDEN))
    inst = physical(op, bins)
    inst.process(0, batch)
    assert list(inst.advance(n, WM_NONE)) == []  # nothing fires: the rows only open windows, and wait
    inst.settle()  # in the table, as an instance manager settles between batches
    assert inst.agg.table.n_live == keys, inst.agg.table.n_live
    return inst


def one_run(op, keys: int, bins: int, moving: int, fresh: bool) -> dict[str, float]:
    """Times of moving ``moving`` bins from a loaded instance to another one (``fresh``: a new one)."""
    a, b = loaded(op, keys, bins), physical(op, bins)
    if not fresh:  # b holds other bins, so it has a's table shape
        b.put_bins(a.take_bins(np.arange(bins - bins // 8, bins)))
    held = a.agg.table.n_live + b.agg.table.n_live
    chosen = np.random.default_rng(0).choice(bins - bins // 8, moving, replace=False)
    had = a.agg.table.n_live
    with Clock() as take:
        moved = a.take_bins(chosen)
    entries = had - a.agg.table.n_live
    with Clock() as put:
        b.put_bins(moved)
    with Clock() as dumps:
        data = pickle.dumps(moved, protocol=5)
    with Clock() as loads:
        pickle.loads(data)
    assert a.agg.table.n_live + b.agg.table.n_live == held
    return {"take": take.wall, "put": put.wall, "move": take.wall + put.wall, "move_cpu": take.cpu + put.cpu,
            "dumps": dumps.wall, "loads": loads.wall, "entries": entries,
            "mib": moved.nbytes / 2 ** 20}


def bin_count(text: str) -> int:
    """``--bins``: a power of two from MIN_BINS to MAX_BINS."""
    n = bounded(int, MIN_BINS, MAX_BINS)(text)
    if n & (n - 1):
        raise argparse.ArgumentTypeError(f"must be a power of two, got {text}")
    return n


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=bounded(int, 1, MAX_KEYS), default=1_000_000)
    ap.add_argument("--bins", type=bin_count, default=4096, help=f"a power of two from {MIN_BINS} to {MAX_BINS}")
    ap.add_argument("--repeat", type=bounded(int, 1, MAX_REPEAT), default=3)
    args = ap.parse_args(argv)
    op = aggregate_op()
    one_run(op, 10_000, 64, 8, False)  # compile the kernels before the clock
    print(f"window aggregate: {args.keys:,} keys in {args.bins} bins; median of {args.repeat} runs, wall s")
    print(f"{'bins':>5} {'to':>13} {'entries':>8} {'MiB':>6} {'take':>7} {'put':>7} {'move':>7} {'(cpu)':>7} "
          f"{'dumps':>7} {'loads':>7} {'per-bin loop':>13} {'ratio':>6}")
    per_bin = PER_BIN_LOOP_S / PER_BIN_LOOP_BINS
    for moving in MOVES:
        for fresh in (False, True):
            runs = [one_run(op, args.keys, args.bins, moving, fresh) for _ in range(args.repeat)]
            m = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            old = per_bin * moving
            note = "" if moving == PER_BIN_LOOP_BINS else "*"
            print(f"{moving:>5} {'a new one' if fresh else 'a holder':>13} {m['entries']:>8,.0f} {m['mib']:>6.1f} "
                  f"{m['take']:>7.3f} {m['put']:>7.3f} {m['move']:>7.3f} {m['move_cpu']:>7.3f} {m['dumps']:>7.3f} "
                  f"{m['loads']:>7.3f} {old:>12.2f}{note or ' '} {old / m['move']:>5.0f}x")
    print(f"per-bin loop: {PER_BIN_LOOP_S} s measured for {PER_BIN_LOOP_BINS} bins; * = {per_bin * 1000:.1f} ms "
          f"a bin scaled")


if __name__ == "__main__":
    main()
