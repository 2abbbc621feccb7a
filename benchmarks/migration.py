"""Megaphone's migration micro-benchmark (§5.3) on sparkcep: a keyed count, half its bins moved live.

    python benchmarks/migration.py --quick                     # under a minute
    python benchmarks/migration.py                             # 10^5..10^7 keys x 2^4..2^12 bins
    python benchmarks/migration.py --keys 1e5 --bins 16,256 --strategies fluid --plot /tmp/m.png

The query is Megaphone's *key count*: ``aggregate(cep.Running(), by="k",
n=cep.count())``, the cumulative count per key, on ``Engine.local(workers=2)``
at parallelism 2. It measures migration best: its state is one entry per key,
never expires (a time window would drop it at each close), every key is
pre-loaded (Megaphone too), and every send emits the updated counts of the
keys it held, so each epoch's latency (arrival at the engine -> its results
in the output logs, ``dep.sink.epoch_log``) shows at once any stall a
migration causes; a window count would only show it at window closes.

For each key count and bin count: deploy and load every key once (timed:
that is also the peer's replay), measure the throughput as fast as possible
(a median of ``--tput-rounds`` rounds of ``--tput-s`` seconds, batches of
``--tput-rows``), then a sender thread sends ``--rows`` random keys
``--rate`` times a second for the rest of the run. For each strategy: a
steady window of ``--steady`` seconds (its p99 is the "before"), then half
of the bins move — a quarter of all bins from instance 0 to 1 and a quarter
from 1 to 0, so the load stays even and the next strategy starts from the
same shape (Megaphone moves half) — and the migration's report gives its
duration, max and p99 latency (over ``latency_epochs`` epochs), bytes and
steps. With ``--repeat N`` each migration runs N times; the table shows the
medians. Last, the peer: what a user pays without live migration, stopping
the query and restarting it with its state (undeploy, deploy a fresh one,
replay the input that built the state), beside our migration duration.

Megaphone's own figures come from a Rust timely-dataflow system and cannot
run here; the targets printed beside ours are this project's.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

try:
    import sparkcep as cep
except ModuleNotFoundError:  # run from a source checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import sparkcep as cep

STRATEGIES = ("all-at-once", "batched", "fluid")
LOAD_ROWS = 200_000  # rows per send while loading the state
QUICK = dict(keys="1e5", bins="16,256", steady=1.5, tput_s=0.5, tput_rounds=3)


def key_count_query() -> cep.Query:
    """Megaphone's key count: the running count of each key ``k``, updated after every send."""
    q = cep.Query("keycount")
    s = q.stream("ev", "k int64, ts timestamp")
    q.output("counts", s.aggregate(cep.Running(), by="k", n=cep.count(), name="agg"))
    return q


def batch(keys: np.ndarray) -> dict:
    """A send of ``keys`` stamped with the current time."""
    return {"k": keys, "ts": np.full(len(keys), time.time_ns() // 1000, "datetime64[us]")}


def deploy_loaded(engine, keys: int, bins: int):
    """Deploy the key count with ``bins`` bins and send every key once; returns (deployment, seconds)."""
    t0 = time.perf_counter()
    dep = engine.deploy(key_count_query(), parallelism=2, bins=bins, retain=False)
    for start in range(0, keys, LOAD_ROWS):
        engine.send("ev", batch(np.arange(start, min(keys, start + LOAD_ROWS), dtype=np.int64)))
    dep.wait()
    return dep, time.perf_counter() - t0


def throughput(engine, dep, keys: int, rows: int, seconds: float, rounds: int) -> float:
    """Rows/s as fast as possible: batches of ``rows`` random keys for ``seconds``, until their
    results are out; the median of ``rounds`` rounds."""
    rng = np.random.default_rng(1)
    rates = []
    for _ in range(rounds):
        sent, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            sent += engine.send("ev", batch(rng.integers(0, keys, rows)))
        dep.wait()
        rates.append(sent / (time.perf_counter() - t0))
    return statistics.median(rates)


class Sender:
    """A thread sending ``rows`` random keys of ``keys`` ``rate`` times a second (fixed schedule: a late
    send does not shift the next ones) until :meth:`stop`."""

    def __init__(self, engine, keys: int, rows: int, rate: float):
        self.engine, self.keys, self.rows, self.rate = engine, keys, rows, rate
        self.sent, self.error = 0, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sender", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        rng = np.random.default_rng(2)
        t0 = time.perf_counter()
        try:
            while not self._stop.is_set():
                self.engine.send("ev", batch(rng.integers(0, self.keys, self.rows)))
                self.sent += 1
                wait = t0 + self.sent / self.rate - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
        except cep.SparkcepError as e:
            self.error = e

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self.error is not None:
            raise self.error


def steady_latency(dep, seconds: float) -> dict:
    """Epoch latencies (ms) of the sends made during the next ``seconds``: p50, p99, max, epochs."""
    first = dep.epoch
    time.sleep(seconds)
    last = dep.epoch - 1
    dep.wait()
    lat = np.array([ns for _, e, ns in list(dep.sink.epoch_log) if first <= e <= last], np.float64) / 1e6
    if not lat.size:
        return {"p50": float("nan"), "p99": float("nan"), "max": float("nan"), "epochs": 0}
    return {"p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
            "max": float(lat.max()), "epochs": int(lat.size)}


def half_swap(dep) -> dict[int, int]:
    """Half of the bins change instance: every other bin of each instance goes to the other one."""
    owners = dep.bin_owners("agg")
    moving = {}
    for i in (0, 1):
        mine = [b for b, o in enumerate(owners) if o == i]
        moving.update(dict.fromkeys(mine[::2], 1 - i))
    return moving


def run_config(engine, keys: int, bins: int, a) -> dict:
    """One (keys, bins) point: load, throughput, each strategy's migrations, the restart peer."""
    dep, load_s = deploy_loaded(engine, keys, bins)
    gc.collect()
    gc.freeze()  # the engine's long-lived objects out of the cyclic collector's scans (as sparkcep.bench does)
    warm = {b: 1 - o for b, o in enumerate(dep.bin_owners("agg")) if b in (0, bins - 1)}
    for back in (False, True):  # untimed: each worker loads the kernels a move uses, then it moves back
        dep.migrate("agg", {b: 1 - i for b, i in warm.items()} if back else warm, strategy="all-at-once")
    throughput(engine, dep, keys, a.tput_rows, a.tput_s / 2, 1)  # untimed warm-up round
    tput = throughput(engine, dep, keys, a.tput_rows, a.tput_s, a.tput_rounds)
    sender = Sender(engine, keys, a.rows, a.rate)
    out = {"keys": keys, "bins": bins, "load_s": load_s, "throughput": tput, "runs": {}}
    try:
        for strategy in a.strategies:
            samples = []
            for _ in range(a.repeat):
                before = steady_latency(dep, a.steady)
                report = dep.migrate("agg", half_swap(dep), strategy=strategy, batch=a.batch)
                samples.append({**report, "before": before})
            out["runs"][strategy] = samples
        sender.stop()
    finally:
        sender._stop.set()
    dep.wait()
    t0 = time.perf_counter()
    engine.undeploy("keycount")  # the peer: stop the query, start it again with its state
    _, reload_s = deploy_loaded(engine, keys, bins)
    out["restart_s"] = time.perf_counter() - t0
    out["replay_s"] = reload_s
    engine.undeploy("keycount")
    gc.unfreeze()
    gc.collect()
    return out


def median_of(samples: list[dict], key: str) -> float:
    return statistics.median(s[key] for s in samples)


def print_config(r: dict) -> None:
    """The rows of one (keys, bins) point, one per strategy, as they are measured."""
    for strategy, samples in r["runs"].items():
        n = len(samples)
        before = statistics.median(s["before"]["p99"] for s in samples)
        before_n = sum(s["before"]["epochs"] for s in samples) // n
        dur = median_of(samples, "duration_s")
        print(f"{r['keys']:>10,} {r['bins']:>5} {strategy:>11} {dur:>9.3f} {median_of(samples, 'max_latency_ms'):>8.1f} "
              f"{median_of(samples, 'p99_latency_ms'):>8.1f} {median_of(samples, 'latency_epochs'):>6.0f} "
              f"{before:>8.1f} {before_n:>5} {median_of(samples, 'bytes') / 2 ** 20:>8.1f} "
              f"{median_of(samples, 'steps'):>6.0f} {r['restart_s']:>8.2f} {r['restart_s'] / dur:>7.1f}x "
              f"{r['throughput']:>11,.0f}", flush=True)


HEADER = (f"{'keys':>10} {'bins':>5} {'strategy':>11} {'dur s':>9} {'max ms':>8} {'p99 ms':>8} {'epochs':>6} "
          f"{'pre p99':>8} {'(n)':>5} {'MiB':>8} {'steps':>6} {'restart':>8} {'ratio':>8} {'rows/s max':>11}")


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def print_targets(results: list[dict]) -> None:
    """Each target beside the figures it is judged on, "met" or "NOT met"."""
    def fig(keys, bins, strategy, key):
        r = next((r for r in results if r["keys"] == keys and r["bins"] == bins), None)
        if r is None or strategy not in r["runs"]:
            return None
        return median_of(r["runs"][strategy], key)

    keys = sorted({r["keys"] for r in results})
    bins = sorted({r["bins"] for r in results})
    print("\ntargets")
    if 1_000_000 in keys:
        for s in ("all-at-once", "batched"):
            durs = {b: fig(1_000_000, b, s, "duration_s") for b in bins}
            durs = {b: d for b, d in durs.items() if d is not None}
            if durs:
                worst = max(durs, key=durs.get)
                print(f"  10^6 keys move in under 1 s ({s}): {', '.join(f'{b} bins {d:.3f} s' for b, d in durs.items())}"
                      f" -> worst {durs[worst]:.3f} s: {verdict(durs[worst] < 1.0)}")
    else:
        print("  10^6 keys move in under 1 s: not measured in this run (--keys without 1e6)")
    top = bins[-1]
    for s in ("fluid", "batched", "all-at-once"):
        lat = {k: fig(k, top, s, "max_latency_ms") for k in keys}
        lat = {k: v for k, v in lat.items() if v is not None}
        if not lat:
            continue
        text = ", ".join(f"{k:.0e} keys {v:.1f} ms" for k, v in lat.items())
        growth = lat[max(lat)] / max(lat[min(lat)], 1e-9)
        if s == "all-at-once":
            ok = len(lat) > 1 and growth >= 2
            print(f"  all-at-once max latency grows with state ({top} bins): {text}; x{growth:.1f} "
                  f"(target: x2 or more): {verdict(ok) if len(lat) > 1 else 'one key count only'}")
        else:
            under = max(lat.values()) < 50
            flat = growth <= 2
            print(f"  {s} max latency under 50 ms and flat as state grows ({top} bins): {text}; "
                  f"under 50 ms: {verdict(under)}; x{growth:.1f} from least to most state (flat: x2 or less): "
                  f"{verdict(flat) if len(lat) > 1 else 'one key count only'}")
    lo, hi = bins[0], bins[-1]
    for k in keys:
        t = {r["bins"]: r["throughput"] for r in results if r["keys"] == k}
        if lo in t and hi in t and lo != hi:
            cost = 1 - t[hi] / t[lo]
            print(f"  {hi} bins cost under 10% of the throughput of {lo} ({k:,} keys): {t[lo]:,.0f} vs "
                  f"{t[hi]:,.0f} rows/s, cost {cost:.1%}: {verdict(cost < 0.10)}")


def plot(results: list[dict], path: str) -> None:
    """Megaphone's Figures 16-18: max latency vs duration per strategy (a panel per key count, a point
    per bin count), and max latency vs state size per strategy at the largest bin count."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    keys = sorted({r["keys"] for r in results})
    top = max(r["bins"] for r in results)
    fig, axes = plt.subplots(1, len(keys) + 1, figsize=(4.2 * (len(keys) + 1), 3.8), squeeze=False)
    colors = {"all-at-once": "tab:red", "batched": "tab:blue", "fluid": "tab:green"}
    for ax, k in zip(axes[0], keys):
        for s, c in colors.items():
            pts = [(median_of(r["runs"][s], "duration_s"), median_of(r["runs"][s], "max_latency_ms"), r["bins"])
                   for r in sorted(results, key=lambda r: r["bins"]) if r["keys"] == k and s in r["runs"]]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=c, label=s)
                for x, y, b in pts:
                    ax.annotate(str(b), (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set(xscale="log", yscale="log", xlabel="migration duration (s)", ylabel="max latency (ms)",
               title=f"{k:,} keys (labels: bins)")
        ax.grid(True, which="both", alpha=0.3)
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.legend(fontsize=8)
    ax = axes[0][-1]
    for s, c in colors.items():
        pts = [(r["keys"], median_of(r["runs"][s], "max_latency_ms")) for r in sorted(results, key=lambda r: r["keys"])
               if r["bins"] == top and s in r["runs"]]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=c, label=s)
    ax.axhline(50, color="grey", ls="--", lw=1, label="50 ms target")
    ax.set(xscale="log", yscale="log", xlabel="keys (state size)", ylabel="max latency (ms)",
           title=f"max latency vs state, {top} bins")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help=f"a small run, under a minute: {QUICK}")
    p.add_argument("--keys", default="1e5,1e6,1e7", help="key counts, comma-separated (1e6 or 1000000)")
    p.add_argument("--bins", default="16,64,256,1024,4096", help="bin counts (powers of two), comma-separated")
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--rate", type=float, default=150, help="sends per second during the steady run")
    p.add_argument("--rows", type=int, default=1000, help="random keys per send")
    p.add_argument("--steady", type=float, default=4.0, help="seconds of steady input before each migration")
    p.add_argument("--batch", type=int, default=16, help="bins per pair of instances per step, batched")
    p.add_argument("--repeat", type=int, default=1, help="migrations per strategy (medians are shown)")
    p.add_argument("--tput-rows", type=int, default=20_000, help="rows per send, throughput rounds")
    p.add_argument("--tput-s", type=float, default=1.0, help="seconds per throughput round")
    p.add_argument("--tput-rounds", type=int, default=3)
    p.add_argument("--plot", default="docs/migration.png")
    a = p.parse_args(argv)
    if a.quick:
        defaults = {k: p.get_default(k) for k in QUICK}
        for k, v in QUICK.items():  # what the command line set explicitly wins
            if getattr(a, k) == defaults[k]:
                setattr(a, k, v)
    a.keys = [int(float(k)) for k in a.keys.split(",")]
    a.bins = [int(b) for b in a.bins.split(",")]
    a.strategies = [s.strip() for s in a.strategies.split(",")]
    bad = [s for s in a.strategies if s not in STRATEGIES]
    if bad:
        p.error(f"unknown strategies {bad}; choose from {', '.join(STRATEGIES)}")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    t0 = time.perf_counter()
    print(f"key count (Running count by key), Engine.local(workers=2), parallelism 2; {os.cpu_count()} CPUs, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"steady input: {a.rows} random keys x {a.rate:g} sends/s; migration: half of the bins "
          f"(a quarter each way); batched: {a.batch} bins per step and direction; {a.repeat} run(s) per strategy "
          f"(medians)")
    print("latency: per send, arrival -> results out; 'max ms'/'p99 ms' over the 'epochs' sends that arrived "
          "during the migration; 'pre p99' over the '(n)' sends of the steady window before it")
    print("restart: the peer without live migration (undeploy, deploy, replay every key); ratio = restart / "
          "our duration; rows/s max: throughput as fast as possible, median of "
          f"{a.tput_rounds} rounds of {a.tput_s:g} s, {a.tput_rows:,} rows a send\n")
    print(HEADER)
    results = []
    with cep.Engine.local(workers=2) as engine:
        for keys in a.keys:
            for bins in a.bins:
                results.append(run_config(engine, keys, bins, a))
                print_config(results[-1])
    print_targets(results)
    plot(results, a.plot)
    print(f"\nplot: {a.plot}; {time.perf_counter() - t0:.0f} s in all; load average at the end "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
