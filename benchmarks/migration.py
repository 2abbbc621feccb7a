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

First the cost of bins: for each ``--tput-keys`` key count, one loaded
deployment per bin count side by side, each sent random keys as fast as
possible (``--tput-rows`` a send) for rounds of ``--tput-s`` seconds taken in
turn, the median of ``--tput-rounds`` rounds per bin count.

Then, for each key count and bin count: deploy and load every key once,
then a sender thread sends ``--rows`` random keys ``--rate`` times a second
for the rest of the run. For each strategy: a steady window of ``--steady``
seconds (its p99 is the "before"), then half of the bins move (Megaphone
moves half): ``--moves swap`` (the default) moves half of each instance's
bins to the other one, both directions in the same steps, so the load stays
even; ``--moves one-way`` moves every bin of one instance to the other, and
the next migration moves half of them back. The migration's report gives its duration, max and p99
latency (over ``latency_epochs`` epochs), bytes and steps. With ``--repeat
N`` each migration runs N times; the table shows the medians. A migration
that fails is shown with its error and the run goes on on a fresh engine.
Last, the peer: what a user pays without live migration, stopping the
query and restarting it with its state (undeploy, deploy a fresh one,
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

from sparkcep.arguments import bounded, bounded_list
from sparkcep.bench.steady import KeySender
from sparkcep.runtime.deployment import MAX_BINS
from sparkcep.runtime.sink import EPOCH_LOG

STRATEGIES = ("all-at-once", "batched", "fluid")
LOAD_ROWS = 200_000  # rows per send while loading the state
CLOSE_TIMEOUT_S = 30.0  # an engine left by a failed migration must close within this long
QUICK = dict(keys=[100_000], bins=[16, 256], steady=1.5, tput_keys=[100_000], tput_s=0.5, tput_rounds=3)
MAX_KEYS = 10 ** 7  # keys per deployment: ~130 B of table each, and --tput-keys loads one deployment per bin count
MAX_ROWS = 10 ** 6  # random keys per send
MAX_REPEAT = 100
MAX_SECONDS = 3600  # of a steady window or a throughput round


def key_count_query(stream: str = "ev") -> cep.Query:
    """Megaphone's key count over ``stream``: the running count of each key ``k``, updated after every send."""
    q = cep.Query(f"keycount_{stream}")
    s = q.stream(stream, "k int64, ts timestamp")
    q.output(f"counts_{stream}", s.aggregate(cep.Running(), by="k", n=cep.count(), name="agg"))
    return q


def batch(keys: np.ndarray) -> dict:
    """A send of ``keys`` stamped with the current time."""
    return {"k": keys, "ts": np.full(len(keys), now_us(), "datetime64[us]")}


def now_us(_send: int = 0) -> int:
    """The event time of a send: the wall clock (HiBench's key), in microseconds."""
    return time.time_ns() // 1000


def deploy_loaded(engine, keys: int, bins: int, stream: str = "ev"):
    """Deploy the key count with ``bins`` bins and send every key once; returns (deployment, seconds)."""
    t0 = time.perf_counter()
    dep = engine.deploy(key_count_query(stream), parallelism=2, bins=bins, retain=False)
    for start in range(0, keys, LOAD_ROWS):
        engine.send(stream, batch(np.arange(start, min(keys, start + LOAD_ROWS), dtype=np.int64)))
    dep.wait()
    return dep, time.perf_counter() - t0


def throughput_round(engine, dep, stream: str, keys: int, rows: int, seconds: float, rng) -> float:
    """Rows/s as fast as possible: batches of ``rows`` random keys for ``seconds``, until their results
    are out."""
    sent, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        sent += engine.send(stream, batch(rng.integers(0, keys, rows)))
    dep.wait()
    return sent / (time.perf_counter() - t0)


def throughput_by_bins(engine, keys: int, bins: list[int], a) -> dict[int, float]:
    """The key count's throughput with each bin count: one deployment per bin count side by side, rounds
    taken in turn (16, 64, ..., 16, 64, ...) so a machine's load drifting over the run weighs on each alike;
    the median of ``a.tput_rounds`` rounds per bin count."""
    deps = {b: deploy_loaded(engine, keys, b, f"ev{b}")[0] for b in bins}
    rng = np.random.default_rng(1)
    for b, dep in deps.items():  # untimed warm-up
        throughput_round(engine, dep, f"ev{b}", keys, a.tput_rows, a.tput_s / 4, rng)
    rates: dict[int, list[float]] = {b: [] for b in bins}
    for _ in range(a.tput_rounds):
        for b, dep in deps.items():
            rates[b].append(throughput_round(engine, dep, f"ev{b}", keys, a.tput_rows, a.tput_s, rng))
    for b in bins:
        engine.undeploy(f"keycount_ev{b}")
    return {b: statistics.median(r) for b, r in rates.items()}


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


def half_of_bins(dep, moves: str) -> dict[int, int]:
    """Half of the bins change instance: ``one-way``, half of all bins from the instance holding the most
    (instance 0 on a tie: all of its bins) to the other; ``swap``, every other bin of each instance goes to
    the other one."""
    owners = dep.bin_owners("agg")
    if moves == "one-way":
        src = 0 if owners.count(0) >= owners.count(1) else 1
        return dict.fromkeys([b for b, o in enumerate(owners) if o == src][:len(owners) // 2], 1 - src)
    moving = {}
    for i in (0, 1):
        mine = [b for b, o in enumerate(owners) if o == i]
        moving.update(dict.fromkeys(mine[::2], 1 - i))
    return moving


class Bench:
    """The run's engine and options; a fresh engine after a migration failed and took its deployment
    (and the engine's link to a worker) down."""

    def __init__(self, a):
        self.a = a
        self.engine = cep.Engine.local(workers=2)

    def renew(self) -> None:
        closing = threading.Thread(target=self.engine.close, daemon=True)
        closing.start()
        closing.join(CLOSE_TIMEOUT_S)
        if closing.is_alive():  # its connections are stuck (a failed handoff): leave it, go on without it
            print(f"    (the failed engine did not close within {CLOSE_TIMEOUT_S:.0f} s; left behind)", flush=True)
        self.engine = cep.Engine.local(workers=2)

    def start(self, keys: int, bins: int):
        """Deploy and load the key count, warm it up; returns (deployment, load seconds)."""
        dep, load_s = deploy_loaded(self.engine, keys, bins)
        owner = dep.bin_owners("agg")[0]
        for to in (1 - owner, owner):  # untimed: each worker loads what a move uses; one way at a time
            dep.migrate("agg", {0: to}, strategy="fluid")
        throughput_round(self.engine, dep, "ev", keys, 1000, 0.3, np.random.default_rng(3))  # untimed warm-up
        return dep, load_s

    def config(self, keys: int, bins: int) -> dict:
        """One (keys, bins) point: load, each strategy's migrations, the restart peer."""
        a = self.a
        gc.collect()
        gc.freeze()  # the engine's long-lived objects out of the cyclic collector's scans (as sparkcep.bench does)
        dep, load_s = self.start(keys, bins)
        out = {"keys": keys, "bins": bins, "load_s": load_s, "runs": {}}
        sender = KeySender(self.engine, keys, a.rows, a.rate, now_us)
        for strategy in a.strategies:
            samples = out["runs"][strategy] = []
            for _ in range(a.repeat):
                before = steady_latency(dep, a.steady)
                try:
                    report = dep.migrate("agg", half_of_bins(dep, a.moves), strategy=strategy, batch=a.batch)
                except cep.SparkcepError as e:  # reported as measured; the next strategy starts afresh
                    samples.append({"error": f"[{e.code}] {e}", "before": before})
                    sender.stop()
                    self.renew()
                    dep, _ = self.start(keys, bins)
                    sender = KeySender(self.engine, keys, a.rows, a.rate, now_us)
                    break
                samples.append({**report, "before": before})
        error = sender.stop()
        if error is not None:
            raise error
        dep.wait()
        t0 = time.perf_counter()
        self.engine.undeploy("keycount_ev")  # the peer: stop the query, start it again with its state
        _, out["replay_s"] = deploy_loaded(self.engine, keys, bins)
        out["restart_s"] = time.perf_counter() - t0
        self.engine.undeploy("keycount_ev")
        gc.unfreeze()
        return out


def median_of(samples: list[dict], key: str) -> float | None:
    """The median of ``key`` over the migrations that succeeded (None: none did)."""
    ok = [s[key] for s in samples if "error" not in s]
    return statistics.median(ok) if ok else None


def print_config(r: dict) -> None:
    """The rows of one (keys, bins) point, one per strategy, as they are measured."""
    for strategy, samples in r["runs"].items():
        before = statistics.median(s["before"]["p99"] for s in samples)
        before_max = statistics.median(s["before"]["max"] for s in samples)
        before_n = statistics.median(s["before"]["epochs"] for s in samples)
        dur = median_of(samples, "duration_s")
        if dur is None:
            print(f"{r['keys']:>10,} {r['bins']:>5} {strategy:>11}    FAILED {'':>8} {'':>8} {'':>6} "
                  f"{before:>8.1f} {before_max:>8.1f} {before_n:>5.0f} {'':>8} {'':>6} {r['restart_s']:>8.2f}\n"
                  f"    {samples[-1]['error']}", flush=True)
            continue
        m = {k: median_of(samples, k) for k in ("max_latency_ms", "p99_latency_ms", "latency_epochs")}
        capped = "*" if m["latency_epochs"] >= EPOCH_LOG - 1 else " "
        print(f"{r['keys']:>10,} {r['bins']:>5} {strategy:>11} {dur:>9.3f} {m['max_latency_ms']:>8.1f} "
              f"{m['p99_latency_ms']:>8.1f} {m['latency_epochs']:>6.0f}{capped}"
              f"{before:>8.1f} {before_max:>8.1f} {before_n:>5.0f} {median_of(samples, 'bytes') / 2 ** 20:>8.1f} "
              f"{median_of(samples, 'steps'):>6.0f} {r['restart_s']:>8.2f} {r['restart_s'] / dur:>7.1f}x", flush=True)
        failed = [s["error"] for s in samples if "error" in s]
        if failed:
            print(f"    {len(failed)} of {len(samples)} failed: {failed[0]}", flush=True)


HEADER = (f"{'keys':>10} {'bins':>5} {'strategy':>11} {'dur s':>9} {'max ms':>8} {'p99 ms':>8} {'epochs':>6} "
          f"{'pre p99':>8} {'pre max':>8} {'(n)':>5} {'MiB':>8} {'steps':>6} {'restart':>8} {'ratio':>8}")


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def print_throughput(keys: int, rates: dict[int, float], a) -> None:
    """The throughput table of one key count: rows/s per bin count, and beside the fewest bins."""
    base = rates[min(rates)]
    print(f"throughput, {keys:,} keys, as fast as possible ({a.tput_rows:,} random keys a send; median of "
          f"{a.tput_rounds} rounds of {a.tput_s:g} s per bin count, rounds taken in turn)")
    for b, r in rates.items():
        print(f"  {b:>5} bins {r:>12,.0f} rows/s  {r / base:>6.1%} of {min(rates)} bins")


def print_targets(results: list[dict], throughputs: dict[int, dict[int, float]]) -> None:
    """Each target beside the figures it is judged on, "met" or "NOT met" (a failed migration misses it)."""
    def figures(pairs, strategy, key, unit, fmt):
        """{label: value} of the migrations that succeeded, and their text (FAILED for the others)."""
        got, text = {}, []
        for label, r in pairs:
            if strategy not in r["runs"]:
                continue
            v = median_of(r["runs"][strategy], key)
            text.append(f"{label} {'FAILED' if v is None else format(v, fmt) + unit}")
            if v is not None:
                got[label] = v
        return got, ", ".join(text), len(text)

    print("\ntargets")
    for k, t in throughputs.items():
        lo, hi = min(t), max(t)
        if lo != hi:
            cost = 1 - t[hi] / t[lo]
            print(f"  {hi} bins cost under 10% of the throughput of {lo} bins ({k:,} keys): {t[lo]:,.0f} vs "
                  f"{t[hi]:,.0f} rows/s, cost {cost:.1%}: {verdict(cost < 0.10)}")
    if not results:
        return
    at_1e6 = [(f"{r['bins']} bins", r) for r in sorted(results, key=lambda r: r["bins"]) if r["keys"] == 1_000_000]
    for s in ("all-at-once", "batched"):
        got, text, n = figures(at_1e6, s, "duration_s", " s", ".3f")
        if n:
            print(f"  10^6 keys move in under 1 s ({s}): {text}: "
                  f"{verdict(len(got) == n and max(got.values()) < 1.0)}")
    if not at_1e6:
        print("  10^6 keys move in under 1 s: not measured (no 1e6 in --keys)")
    top = max(r["bins"] for r in results)
    at_top = [(f"{r['keys']:.0e} keys", r) for r in sorted(results, key=lambda r: r["keys"]) if r["bins"] == top]
    for s in ("fluid", "batched", "all-at-once"):
        got, text, n = figures(at_top, s, "max_latency_ms", " ms", ".1f")
        if not n:
            continue
        vals = list(got.values())
        if len(vals) > 1:
            growth = f"x{vals[-1] / max(vals[0], 1e-9):.1f} from least to most state"
            grows, flat = verdict(vals[-1] >= 2 * vals[0]), verdict(len(got) == n and vals[-1] <= 2 * vals[0])
        else:
            growth, grows = "one key count", "not judged"
            flat = grows
        if s == "all-at-once":
            print(f"  all-at-once max latency grows with state ({top} bins): {text}; {growth} (x2 or more): {grows}")
        else:
            print(f"  {s} max latency under 50 ms and flat as state grows ({top} bins): {text}; under 50 ms: "
                  f"{verdict(len(got) == n and max(vals) < 50)}; {growth} (flat: x2 or less): {flat}")


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
                   for r in sorted(results, key=lambda r: r["bins"]) if r["keys"] == k and s in r["runs"]
                   and median_of(r["runs"][s], "duration_s") is not None]
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
               if r["bins"] == top and s in r["runs"] and median_of(r["runs"][s], "max_latency_ms") is not None]
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


def key_counts(text: str) -> list[int]:
    """``--keys``/``--tput-keys``: comma-separated key counts (1e6 or 1000000) up to MAX_KEYS; empty: none."""
    return bounded_list(int, 1, MAX_KEYS)(text) if text.strip() else []


def bin_counts(text: str) -> list[int]:
    """``--bins``: comma-separated powers of two from 2 (an instance holds a bin at least) to MAX_BINS."""
    counts = bounded_list(int, 2, MAX_BINS)(text)
    bad = [b for b in counts if b & (b - 1)]
    if bad:
        raise argparse.ArgumentTypeError(f"bin counts must be powers of two, got {', '.join(map(str, bad))}")
    return counts


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help=f"a small run, under a minute: {QUICK}")
    p.add_argument("--keys", type=key_counts, default="1e5,1e6,1e7",
                   help=f"key counts, comma-separated (1e6 or 1000000; at most {MAX_KEYS:,}; empty: the "
                   "throughput only)")
    p.add_argument("--bins", type=bin_counts, default="16,64,256,1024,4096",
                   help=f"bin counts (powers of two, 2 to {MAX_BINS}), comma-separated")
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--rate", type=bounded(float, 0.1), default=150, help="sends per second during the steady run")
    p.add_argument("--rows", type=bounded(int, 1, MAX_ROWS), default=1000, help="random keys per send")
    p.add_argument("--steady", type=bounded(float, 0.1, MAX_SECONDS), default=4.0,
                   help="seconds of steady input before each migration")
    p.add_argument("--moves", choices=("swap", "one-way"), default="swap",
                   help="swap: half of each instance's bins both ways; one-way: one instance's bins to the other")
    p.add_argument("--batch", type=bounded(int, 1), default=16, help="bins per pair of instances per step, batched")
    p.add_argument("--repeat", type=bounded(int, 1, MAX_REPEAT), default=1,
                   help="migrations per strategy (medians are shown)")
    p.add_argument("--tput-keys", type=key_counts, default="1e6", help="key counts of the throughput by bin count "
                   "(one deployment per bin count, side by side; empty: none)")
    p.add_argument("--tput-rows", type=bounded(int, 1, MAX_ROWS), default=20_000,
                   help="rows per send, throughput rounds")
    p.add_argument("--tput-s", type=bounded(float, 0.01, MAX_SECONDS), default=1.0, help="seconds per throughput round")
    p.add_argument("--tput-rounds", type=bounded(int, 1, MAX_REPEAT), default=5)
    p.add_argument("--plot", default="docs/migration.png")
    a = p.parse_args(argv)
    if a.quick:
        defaults = vars(p.parse_args([]))
        for k, v in QUICK.items():  # what the command line set explicitly wins
            if getattr(a, k) == defaults[k]:
                setattr(a, k, v)
    a.strategies = [s.strip() for s in a.strategies.split(",")]
    bad = [s for s in a.strategies if s not in STRATEGIES]
    if bad:
        p.error(f"unknown strategies {bad}; choose from {', '.join(STRATEGIES)}")
    return a


def print_legend(a) -> None:
    """What the migration table's columns are."""
    print(f"\nmigrations: steady input {a.rows} random keys x {a.rate:g} sends/s; half of the bins move "
          f"({a.moves}); batched: {a.batch} bins per step and direction; {a.repeat} run(s) per strategy, "
          "medians shown")
    print("latency: per send, arrival -> results out; 'max ms'/'p99 ms' over the 'epochs' sends that arrived "
          "during the migration; 'pre p99'/'pre max' over the '(n)' sends of the steady window before it")
    print(f"(* the sink remembers the last {EPOCH_LOG:,} sends: a longer migration's latency covers its last "
          f"{EPOCH_LOG:,} sends only)")
    print("restart: the peer without live migration, stop and restart with the state (undeploy, deploy, "
          "replay every key), in s; ratio = restart / our duration\n")
    print(HEADER)


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv=None) -> int:
    a = parse_args(argv)
    t0 = time.perf_counter()
    print(f"key count (Running count by key), Engine.local(workers=2), parallelism 2; {os.cpu_count()} CPUs, "
          f"load average {load_average()}")
    bench = Bench(a)
    results, throughputs = [], {}
    try:
        for keys in a.tput_keys:
            throughputs[keys] = throughput_by_bins(bench.engine, keys, a.bins, a)
            print_throughput(keys, throughputs[keys], a)
        if a.keys:
            print_legend(a)
        for keys in a.keys:
            for bins in a.bins:
                results.append(bench.config(keys, bins))
                print_config(results[-1])
    finally:
        bench.engine.close()
    print_targets(results, throughputs)
    if results:
        plot(results, a.plot)
        print(f"\nplot: {a.plot}")
    print(f"\n{time.perf_counter() - t0:.0f} s in all; load average at the end {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
