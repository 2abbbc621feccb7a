"""Live rescaling: a keyed window count goes from two instances to three while events keep coming.

    python examples/live_rescale.py                      # about 20 s; draws live_rescale.png here
    python examples/live_rescale.py --rate 100000 --seconds 20 --rescale-at 8 --plot /tmp/rescale.png

HiBench-like ``uservisits`` records (200 bytes, keyed by the time they are
sent) arrive at a steady rate, ``--sends`` sends a second, on
``Engine.local(workers=2)``. The query counts them per source IP over 1 s
tumbling windows, on two instances. In the middle of the run,
``dep.rescale("agg", instances=3)`` adds a third instance of the window
count and moves a third of the bins (and their windows' state) to it while
the sends go on; nothing stops. The script prints the instance managers
and what they run before and after, the rescale's report, checks every
window's count of every IP against the records sent (nothing lost, nothing
counted twice, nothing counted under another IP), and plots each send's
latency (arrival at the engine -> its results out) through the run
(``--plot``; the README's ``docs/live_rescale.png`` is one such plot).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

try:
    import sparkcep as cep
except ModuleNotFoundError:  # run from a source checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import sparkcep as cep

from sparkcep.arguments import bounded
from sparkcep.bench.generator import MAX_IPS, RECORD_DDL, UserVisits


def window_count(window: str) -> cep.Query:
    """Records per source IP (the value's first field, as HiBench parses it) over tumbling windows."""
    q = cep.Query("per_ip")
    visits = q.stream("uservisits", RECORD_DDL, time="key")
    ips = visits.map(ip=cep.col("value").split_part(",", 1), name="parse")
    q.output("visits_per_ip", ips.aggregate(cep.TimeWindow(window), by="ip", n=cep.count(), name="agg"))
    return q


def show_instance_managers(engine, when: str) -> None:
    print(f"instance managers {when}:")
    for im in engine.instance_managers():
        print(f"  {im['name']} (cpu {im['cpu']}, pid {im['pid']}): {', '.join(im['instances'])}")


def send_steadily(engine, gen: UserVisits, rate: float, sends: float, window_us: int, stop: threading.Event,
                  sent: list, per_ip: Counter) -> None:
    """``rate`` records a second in ``sends`` sends a second, keyed by the time they are sent, until ``stop``;
    counts each (window start, IP) it sent in ``per_ip``, parsing the records as HiBench does."""
    rows = max(1, int(rate / sends))
    t0 = time.perf_counter()
    while not stop.is_set():
        k = len(sent)
        now_us = time.time_ns() // 1000
        batch = gen.records(k * rows, rows, now_us, keys=[now_us] * rows)
        engine.send("uservisits", batch)
        sent.append(rows)
        ips = pc.list_element(pc.split_pattern(batch.column("value"), ",", max_splits=1), 0)
        for ip_n in pc.value_counts(ips).to_pylist():
            per_ip[now_us - now_us % window_us, ip_n["values"]] += ip_n["counts"]
        pause = t0 + (k + 1) / sends - time.perf_counter()
        if pause > 0:
            time.sleep(pause)


def plot(epoch_log, t0: int, rescale: tuple[int, int], path: str) -> None:
    """Each send's latency against the time its results came out, the rescale shaded."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [(t - t0) / 1e9 for t, _, _ in epoch_log]
    y = [ns / 1e6 for _, _, ns in epoch_log]
    fig, ax = plt.subplots(figsize=(8, 3.2))
    ax.plot(x, y, ".", ms=2, color="tab:blue", label="latency of one send")
    ax.axvspan((rescale[0] - t0) / 1e9, (rescale[1] - t0) / 1e9, color="tab:orange", alpha=0.3,
               label='dep.rescale("agg", instances=3)')
    ax.set(yscale="log", xlabel="time (s)", ylabel="latency (ms)",
           title="a keyed window count rescaled from 2 to 3 instances, live")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=bounded(float, 1), default=50_000, help="records per second")
    p.add_argument("--sends", type=bounded(float, 1), default=100, help="sends per second")
    p.add_argument("--seconds", type=bounded(float, 1), default=12, help="how long the input runs")
    p.add_argument("--rescale-at", type=bounded(float, 0), default=5, help="seconds into the run")
    p.add_argument("--ips", type=bounded(int, 1, MAX_IPS), default=100_000, help="distinct source IPs (the keys)")
    p.add_argument("--window", default="1s")
    p.add_argument("--plot", default="live_rescale.png", help="where to draw the plot (default: here)")
    a = p.parse_args(argv)

    with cep.Engine.local(workers=2) as engine:
        dep = engine.deploy(window_count(a.window), parallelism=2, bins=4096, retain=False)
        out = []  # what the query produced, counted once the run is over
        engine.subscribe("visits_per_ip", out.append)
        show_instance_managers(engine, "before")

        stop, sent, per_ip = threading.Event(), [], Counter()
        sender = threading.Thread(target=send_steadily, args=(engine, UserVisits(distinct_ips=a.ips), a.rate, a.sends,
                                                              cep.TimeWindow(a.window).size_us, stop, sent, per_ip))
        t0 = time.monotonic_ns()
        sender.start()
        time.sleep(a.rescale_at)
        began = time.monotonic_ns()
        report = dep.rescale("agg", instances=3)
        ended = time.monotonic_ns()
        time.sleep(max(0.0, a.seconds - (ended - t0) / 1e9))
        stop.set()
        sender.join()
        engine.end("uservisits")  # every open window fires
        show_instance_managers(engine, "after")
        epoch_log = [e for e in dep.sink.epoch_log if e[0] >= t0]

    print("\nrescale report:")
    for key in ("kind", "strategy", "bins", "bytes", "steps", "duration_s", "max_latency_ms", "p99_latency_ms",
                "latency_epochs"):
        print(f"  {key:>15}: {report[key]}")
    lat = sorted(ns / 1e6 for _, _, ns in epoch_log)
    print(f"\n{sum(sent):,} records in {len(sent):,} sends; latency per send over the whole run ({len(lat):,} sends): "
          f"median {lat[len(lat) // 2]:.1f} ms, max {lat[-1]:.1f} ms")
    counted, twice = counts(out)
    wrong = {k for k in per_ip.keys() | counted.keys() if per_ip[k] != counted[k]}
    print(f"{len(counted):,} (window, IP) counts out, adding up to {sum(counted.values()):,}: " +
          ("every record counted once, under its window and IP" if not wrong and not twice else
           f"{len(wrong):,} differ from the records sent (e.g. {sorted(wrong)[:3]}), {twice} came out twice"))
    plot(epoch_log, t0, (began, ended), a.plot)
    print(f"plot: {a.plot}")
    return 0 if not wrong and not twice else 1


def counts(batches: list[pa.RecordBatch]) -> tuple[Counter, int]:
    """Each row's count under its (window start in us, IP), and how many (window, IP) came out more than once."""
    counted, twice = Counter(), 0
    for b in batches:
        starts = b.column("window_start").cast(pa.int64()).to_pylist()
        for key, n in zip(zip(starts, b.column("ip").to_pylist()), b.column("n").to_pylist()):
            twice += key in counted
            counted[key] += n
    return counted, twice


if __name__ == "__main__":
    sys.exit(main())
