"""Active replication (UPM-CEP §6, Flux): what a second replica costs and what it buys.

    python benchmarks/replication.py --quick     # under a minute
    python benchmarks/replication.py             # 10^4..10^6 keys, 3 kills each

Three measurements, each on a fresh ``Engine.local`` (a 2-core machine: one
instance manager per core, plus idle standbys where a killed replica is
rebuilt; ``--quick`` starts one engine with every standby it needs and runs
all three on it, instance managers taking 2-3 s each to start):

(a) **Throughput**, HiBench fixwindow (:mod:`sparkcep.bench.workloads`: count
    and min time per IP over 10 s tumbling windows, 100K IPs, 200-byte
    records of :mod:`sparkcep.bench.generator`), sent as fast as the engine
    takes them in batches of 65,536 records (event time = send time, as
    HiBench keys them), then end of input (every window fires); records/s =
    records / (first send -> ``end`` returned). The same
    ``Engine.local(workers=2)`` runs ``deploy(q, parallelism=2)`` (replicas=1:
    the 4 instances spread over both instance managers) and ``deploy(q,
    parallelism=2, replicas=2)`` (one instance manager per replica, 4
    instances each), alternately, ``--rounds`` timed rounds each after one
    untimed round; medians. Target: replicated >= half of unreplicated
    (Flux measured 44%).
(b) **Output gap at a kill**: a keyed running count (``aggregate(Running(),
    by="k")``, 10^4 keys), which publishes rows every send, fed ``--rows``
    random keys ``--rate`` times a second on a fixed schedule;
    ``Engine.local(workers=2, standby=--kills)``, replicas=2. A subscriber
    notes when each epoch is first published (the dedup sink's first copy).
    After ``--steady`` s one replica's instance manager is SIGKILLed
    (alternating replicas), and once ``dep.replicas()`` are all running
    again and ``--steady`` more seconds passed, the next. Figure: the largest
    interval between consecutive publications, from the one spanning the kill
    to 0.5 s after the replica runs again, beside the steady intervals (median
    and max over the ``--steady`` s before: on a loaded machine the max shows
    what the load alone does). Target: under 100 ms (median over the kills).
(c) **Catch-up vs state size**: a keyed count over a 1-hour window
    (``TimeWindow("1h")``, by ``k``: the state is one entry per key, never
    expiring in the run), every key sent once first, then the steady input of
    (b) over all keys; kill replica 0's (then 1's, ...) instance manager;
    ``catchups[-1]``: ``duration_s`` (rebuild started -> every copy
    installed) and ``bytes``; wall time kill -> ``dep.replicas()`` all
    running; the survivor's worst epoch latency (arrival -> published)
    meanwhile. Target: 10^6 keys caught up in under 1 s.

Prints each figure with the samples it summarises, the targets "met" / "NOT
met", and the load average (other jobs share the 2 cores); plots catch-up
time vs keys and the publication intervals around each kill (``--plot``).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np
import pyarrow as pa

try:
    import sparkcep as cep
except ModuleNotFoundError:  # run from a source checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import sparkcep as cep

from sparkcep.arguments import bounded, bounded_list
from sparkcep.bench import workloads
from sparkcep.bench.generator import RECORD_SCHEMA, UserVisits
from sparkcep.bench.steady import KeySender
from sparkcep.runtime.capacity import MAX_WORKERS_PER_CPU
from sparkcep.runtime.topology import Topology

TPUT_ROWS = 65_536  # records per send, throughput rounds
LOAD_ROWS = 200_000  # keys per send while building the state of (c)
GAP_KEYS = 10_000  # keys of the running count of (b)
QUICK = dict(tput_s=1.0, rounds=2, kills=2, steady=1.0, keys=[10_000, 1_000_000], repeat=1)
WORKERS = 2  # instance managers serving the replicas; a kill's standbys come on top
MAX_KEYS = 10 ** 7  # keys of (c): ~130 B of table each, in both replicas and the copy a catch-up makes
MAX_ROWS = 10 ** 6  # random keys per send
MAX_ROUNDS = 100
MAX_SECONDS = 3600  # of a throughput round, of steady input
MIN_SENDS = 10  # sends of the steady input before a kill: (b)'s steady intervals are between them


def load():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def took(t0: float) -> str:
    return f"[{time.perf_counter() - t0:.0f} s in, load average {load()}]"


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


# --- (a) throughput --------------------------------------------------------------------------
def throughput_round(engine, replicas: int, seconds: float, values: list) -> float:
    """Deploy fixwindow, send as fast as possible for ``seconds``, end input; records/s, undeployed."""
    q = workloads.query("fixwindow", name="fw")
    engine.deploy(q, parallelism=2, replicas=replicas, retain=False)
    sent, j, last = 0, 0, 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        last = max(time.time_ns() // 1000, last + 1)
        keys = pa.array(np.full(TPUT_ROWS, last, np.int64), pa.timestamp("us"))
        sent += engine.send(workloads.STREAM, pa.RecordBatch.from_arrays([keys, values[j % len(values)]],
                                                                         schema=RECORD_SCHEMA))
        j += 1
    engine.end(workloads.STREAM)
    rate = sent / (time.perf_counter() - t0)
    engine.undeploy("fw")
    return rate


def measure_throughput(a, shared) -> dict:
    gen = UserVisits(seed=0, distinct_ips=100_000)
    values = [gen.values(k * TPUT_ROWS, TPUT_ROWS) for k in range(16)]
    rates = {1: [], 2: []}
    with engine_for(shared, 0) as engine:
        for r in (1, 2):  # untimed: every instance manager loads the kernels and grows its tables
            throughput_round(engine, r, a.tput_s / 2, values)
        for _ in range(a.rounds):
            for r in (1, 2):
                rates[r].append(throughput_round(engine, r, a.tput_s, values))
    return rates


@contextmanager
def engine_for(shared, standby: int):
    """The engine of one measurement: ``shared`` (--quick: one engine for all, its instance managers
    started once) or a fresh ``Engine.local(workers=2, standby=standby)``."""
    if shared is not None:
        yield shared
        return
    with cep.Engine.local(workers=2, standby=standby) as engine:
        yield engine


# --- steady input, kills ---------------------------------------------------------------------
def kill_replica(engine, dep, replica: int, limit_s: float = 60.0) -> dict:
    """SIGKILL an instance manager running ``replica``; wait until every replica runs again.
    Returns the kill's and the recovery's times (time.time()) and the catch-up report."""
    victim = next(im for im in engine.instance_managers()
                  if im["replica"] == replica and im["alive"] and im["instances"])
    done = len(dep.catchups)
    t_kill, m_kill = time.time(), time.monotonic_ns()
    os.kill(victim["pid"], signal.SIGKILL)
    deadline = time.monotonic() + limit_s
    while len(dep.catchups) <= done or any(r["state"] != "running" for r in dep.replicas()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"replica {replica} not running again {limit_s:.0f} s after the kill: {dep.replicas()}")
        time.sleep(0.002)
    t_running, m_running = time.time(), time.monotonic_ns()
    catchup = dict(dep.catchups[-1])
    failover = dep.failovers[-1]
    return {"replica": replica, "im": victim["name"], "kill": t_kill, "running": t_running,
            "failed": failover["time"], "catchup": catchup,
            "mono": (m_kill, m_running)}


def running_count() -> cep.Query:
    q = cep.Query("kc")
    s = q.stream("ev", "k int64, ts timestamp")
    q.output("counts", s.aggregate(cep.Running(), by="k", n=cep.count(), name="agg"))
    return q


def window_count() -> cep.Query:
    q = cep.Query("wc")
    s = q.stream("ev", "k int64, ts timestamp")
    q.output("counts", s.aggregate(cep.TimeWindow("1h"), by="k", n=cep.count(), name="agg"))
    return q


def hour_start_us() -> int:
    """The start of the current hour (event times of (c) stay in one 1-hour window)."""
    return time.time_ns() // 1000 // 3_600_000_000 * 3_600_000_000


# --- (b) the gap in the output at a kill -----------------------------------------------------
def measure_gap(a, shared) -> list[dict]:
    kills = []
    with engine_for(shared, a.kills) as engine:
        dep = engine.deploy(running_count(), parallelism=2, replicas=2, retain=False)
        published: dict[int, int] = {}  # epoch -> when its first copy reached the output (ns)

        def seen(_batch) -> None:  # on the collector thread, inside the dedup sink: its epoch is `published`
            published.setdefault(dep.dedup.published, time.time_ns())

        engine.subscribe("counts", seen)
        t0_us = time.time_ns() // 1000
        sender = KeySender(engine, GAP_KEYS, a.rows, a.rate, lambda i: t0_us + i)
        try:
            for k in range(a.kills):
                time.sleep(a.steady)
                kills.append(kill_replica(engine, dep, k % 2))
            time.sleep(a.steady)
        finally:
            error = sender.stop()
        if error is not None:
            raise error
        engine.undeploy("kc")
        times = np.array(sorted(published.values()), np.int64) / 1e9
    for kl in kills:
        gaps = np.diff(times)
        ends = times[1:]
        before = gaps[(ends > kl["kill"] - a.steady) & (ends <= kl["kill"])] * 1e3
        after = (ends > kl["kill"]) & (times[:-1] < kl["running"] + 0.5)  # the one spanning the kill, and on
        i = int(np.argmax(np.where(after, gaps, -1)))
        shown = (ends > kl["kill"] - 0.5) & (times[:-1] < kl["running"] + 0.5)
        kl.update(steady_ms=float(np.median(before)), steady_max_ms=float(before.max()), steady_n=int(before.size),
                  gap_ms=float(gaps[i] * 1e3), gap_from_s=float(times[i] - kl["kill"]), after_n=int(after.sum()),
                  series=(ends[shown] - kl["kill"], gaps[shown] * 1e3))
    return kills


# --- (c) catch-up vs state size --------------------------------------------------------------
def measure_catchup(a, keys: int, shared) -> list[dict]:
    out = []
    t0_us = hour_start_us()
    with engine_for(shared, a.repeat) as engine:
        dep = engine.deploy(window_count(), parallelism=2, replicas=2, retain=False)
        for start in range(0, keys, LOAD_ROWS):
            k = np.arange(start, min(keys, start + LOAD_ROWS), dtype=np.int64)
            engine.send("ev", {"k": k, "ts": np.full(len(k), t0_us, "datetime64[us]")})
        dep.wait()
        sender = KeySender(engine, keys, a.rows, a.rate, lambda i: t0_us + 1 + i)
        try:
            for k in range(a.repeat):
                time.sleep(a.steady)
                kl = kill_replica(engine, dep, k % 2)
                survivor = dep.members[1 - kl["replica"]]
                lo, hi = kl["mono"]  # the sink logs time.monotonic_ns()
                lat = [ns for t, _, ns in list(survivor.sink.epoch_log) if lo <= t <= hi + 500_000_000]
                kl["survivor_max_ms"] = max(lat, default=0) / 1e6
                out.append(kl)
        finally:
            error = sender.stop()
        if error is not None:
            raise error
        engine.undeploy("wc")
    return out


# --- report ----------------------------------------------------------------------------------
def plot(kills: list[dict], catchups: dict[int, list[dict]], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    ks = sorted(catchups)
    figures = (("catch-up duration (catchups[...])", "o-", lambda c: c["catchup"]["duration_s"]),
               ("kill -> all replicas running (wall)", "s--", lambda c: c["running"] - c["kill"]),
               ("survivor's worst epoch latency meanwhile", "^:", lambda c: c["survivor_max_ms"] / 1e3))
    for label, style, fig_of in figures:
        left.plot(ks, [statistics.median(fig_of(c) for c in catchups[k]) for k in ks], style, label=label)
    left.axhline(1.0, color="grey", ls=":", label="1 s target")
    left.set(xscale="log", yscale="log", xlabel="keys of state", ylabel="seconds (median)",
             title="catch-up time vs state size")
    left.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=8)
    for n, kl in enumerate(kills):
        x, y = kl["series"]
        right.plot(x, y, ".-", ms=3, lw=0.4, label=f"kill {n + 1} (replica {kl['replica']})")
        right.axvline(kl["running"] - kl["kill"], color=f"C{n}", ls=":", lw=0.8)
    right.axvline(0, color="black", lw=1)
    right.axhline(100, color="grey", ls="--", label="100 ms target")
    right.set(xlabel="publication time - kill (s); dotted: replica running again",
              ylabel="interval since previous publication (ms)",
              title="output publications around each kill")
    right.grid(True, which="both", alpha=0.3)
    right.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def parse_args(argv=None):
    # the engine refuses more instance managers (workers and standbys) than MAX_WORKERS_PER_CPU a CPU
    standbys = MAX_WORKERS_PER_CPU * len(Topology.load().cpus) - WORKERS
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help=f"a small run, under a minute: {QUICK}")
    p.add_argument("--tput-s", type=bounded(float, 0.1, MAX_SECONDS), default=3.0,
                   help="seconds of input per throughput round")
    p.add_argument("--rounds", type=bounded(int, 1, MAX_ROUNDS), default=5,
                   help="timed throughput rounds per replica count")
    p.add_argument("--rate", type=bounded(float, 0.1), default=150, help="sends per second of the steady input")
    p.add_argument("--rows", type=bounded(int, 1, MAX_ROWS), default=1000,
                   help="random keys per send of the steady input")
    p.add_argument("--steady", type=bounded(float, 0.1, MAX_SECONDS), default=3.0,
                   help=f"seconds of steady input before each kill (--rate x --steady: {MIN_SENDS} sends at least)")
    p.add_argument("--kills", type=bounded(int, 1, standbys), default=6,
                   help=f"kills in (b) (a standby each; at most {standbys} on this machine)")
    p.add_argument("--keys", type=bounded_list(int, 1, MAX_KEYS), default="1e4,1e5,1e6",
                   help=f"key counts of (c), comma-separated (1e6 or 1000000; at most {MAX_KEYS:,})")
    p.add_argument("--repeat", type=bounded(int, 1, standbys), default=3,
                   help=f"kills per key count in (c) (a standby each; at most {standbys} on this machine)")
    p.add_argument("--plot", default="docs/replication.png")
    a = p.parse_args(argv)
    if a.quick:
        defaults = vars(p.parse_args([]))
        for k, v in QUICK.items():  # what the command line set explicitly wins
            if getattr(a, k) == defaults[k]:
                setattr(a, k, v)
        standby = a.kills + a.repeat * len(a.keys)  # main() starts one engine with all of them
        if standby > standbys:
            p.error(f"--quick starts a standby for each kill, --kills + --repeat x (key counts of --keys) = "
                    f"{standby}: at most {standbys} on this machine")
    if a.rate * a.steady < MIN_SENDS:
        p.error(f"--rate x --steady must make {MIN_SENDS} sends at least before a kill, got {a.rate:g} x "
                f"{a.steady:g}")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    t_start = time.perf_counter()
    print(f"{os.cpu_count()} CPUs, load average {load()} (1/5/15 min; other jobs share the machine)")
    shared = None
    if a.quick:  # instance managers take 2-3 s each to start on a loaded machine: start them once
        standby = a.kills + a.repeat * len(a.keys)
        shared = cep.Engine.local(workers=2, standby=standby)
        print(f"--quick: one Engine.local(workers=2, standby={standby}) for every measurement (the standbys idle "
              f"until a kill puts one to use) {took(t_start)}")
    print()
    with shared or nullcontext():
        return report(a, shared, t_start)


def report(a, shared, t_start: float) -> int:
    def config(standby: int) -> str:
        if shared:
            return "the shared engine"
        return f"Engine.local(workers=2{f', standby={standby}' if standby else ''})"

    rates = measure_throughput(a, shared)
    m1, m2 = statistics.median(rates[1]), statistics.median(rates[2])
    print(f"(a) throughput, HiBench fixwindow (10 s windows, 100K IPs, 200-byte records, {TPUT_ROWS:,} a send, as "
          f"fast as possible, then end of input), {config(0)}, parallelism 2; median of {a.rounds} "
          f"rounds of {a.tput_s:g} s each, alternating")
    for r, m in ((1, m1), (2, m2)):
        print(f"    replicas={r}: {m:>12,.0f} records/s   (rounds: {', '.join(f'{x:,.0f}' for x in rates[r])})")
    pairs = [r2 / r1 for r1, r2 in zip(rates[1], rates[2])]  # each replicas=2 round / the round just before it
    print(f"    ratio replicas=2 / replicas=1: {m2 / m1:.2f} (of the medians; round by round: "
          f"{', '.join(f'{x:.2f}' for x in pairs)})   Flux: 0.44   {took(t_start)}\n")

    kills = measure_gap(a, shared)
    print(f"(b) output gap at a kill: running count of {GAP_KEYS:,} keys, {a.rows} keys x {a.rate:g} sends/s, "
          f"{config(a.kills)}, parallelism 2, replicas=2; {len(kills)} kill(s)")
    print(f"    {'kill':>4} {'replica':>7} {'steady ms':>9} {'(max)':>7} {'(n)':>5} {'gap ms':>8} {'at s':>6} "
          f"{'(n)':>5} {'failover ms':>11} {'running s':>9} {'catch-up s':>10}")
    for n, kl in enumerate(kills):
        print(f"    {n + 1:>4} {kl['replica']:>7} {kl['steady_ms']:>9.1f} {kl['steady_max_ms']:>7.1f} "
              f"{kl['steady_n']:>5} {kl['gap_ms']:>8.1f} {kl['gap_from_s']:>6.2f} {kl['after_n']:>5} "
              f"{(kl['failed'] - kl['kill']) * 1e3:>11.1f} {kl['running'] - kl['kill']:>9.2f} "
              f"{kl['catchup'].get('duration_s', float('nan')):>10.3f}")
    print("    steady: median interval between publications in the steady s before the kill (max, intervals); "
          "gap: the longest from the one spanning the kill to 0.5 s after all replicas run, beginning 'at s' "
          "after the kill ((n): intervals); failover: kill -> replica marked failed; running: kill -> all running")
    gap = statistics.median(k["gap_ms"] for k in kills)
    print(f"    median longest gap {gap:.1f} ms, worst {max(k['gap_ms'] for k in kills):.1f} ms, steady "
          f"{statistics.median(k['steady_ms'] for k in kills):.1f} ms   {took(t_start)}\n")

    catchups = {}
    print(f"(c) catch-up vs state: count over TimeWindow(1h) by key, every key sent once, then the steady input of "
          f"(b); {config(a.repeat)} per size, parallelism 2, 128 bins, replicas=2; "
          f"{a.repeat} kill(s) per size, medians")
    print(f"    {'keys':>10} {'catch-up s':>10} {'wall s':>8} {'MiB':>8} {'survivor max ms':>15} {'epoch':>6}")
    for keys in a.keys:
        catchups[keys] = cs = measure_catchup(a, keys, shared)
        print(f"    {keys:>10,} {statistics.median(c['catchup']['duration_s'] for c in cs):>10.3f} "
              f"{statistics.median(c['running'] - c['kill'] for c in cs):>8.3f} "
              f"{statistics.median(c['catchup']['bytes'] for c in cs) / 2 ** 20:>8.1f} "
              f"{statistics.median(c['survivor_max_ms'] for c in cs):>15.1f} "
              f"{statistics.median(c['catchup']['epoch'] for c in cs):>6.0f}", flush=True)
    print(f"    catch-up: catchups[...]['duration_s']; wall: kill -> dep.replicas() all running; survivor max: the "
          f"surviving replica's worst epoch latency meanwhile   {took(t_start)}\n")

    print("targets")
    print(f"  replicated throughput >= 1/2 of unreplicated: {m2:,.0f} / {m1:,.0f} = {m2 / m1:.2f}: "
          f"{verdict(m2 / m1 >= 0.5)}")
    print(f"  output gap at a kill under 100 ms: median {gap:.1f} ms over {len(kills)} kills "
          f"(worst {max(k['gap_ms'] for k in kills):.1f} ms): {verdict(gap < 100)}")
    if 1_000_000 in catchups:
        d = statistics.median(c["catchup"]["duration_s"] for c in catchups[1_000_000])
        w = statistics.median(c["running"] - c["kill"] for c in catchups[1_000_000])
        print(f"  catch-up of 10^6 keys under 1 s: {d:.3f} s (wall {w:.3f} s), {len(catchups[1_000_000])} kill(s): "
              f"{verdict(d < 1.0)}")
    else:
        print("  catch-up of 10^6 keys under 1 s: not measured in this run (--keys without 1e6)")
    plot(kills, catchups, a.plot)
    print(f"\nplot: {a.plot}; {time.perf_counter() - t_start:.0f} s in all; load average at the end {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
