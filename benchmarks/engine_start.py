"""How long an engine takes to start its instance managers, beside starting as many workers alone.

    python benchmarks/engine_start.py [--workers 2] [--runs 3]

Ours: ``Engine.local(workers=N)`` in one process, the first (which starts the
instance-manager template) and then ``--runs`` more (forks of it), each closed
before the next. The peer, in the same run: N ``sparkcep worker`` processes
started alone (``start_worker``) until their READY lines, as engines started
them before the template. Prints seconds per start and the medians.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import sparkcep as cep
from sparkcep import auth
from sparkcep.runtime.worker_start import Starting, start_worker, wait_ready


def engine_start(workers: int) -> float:
    t0 = time.monotonic()
    engine = cep.Engine.local(workers=workers)
    took = time.monotonic() - t0
    engine.close()
    return took


def alone_start(workers: int, token_file: str) -> float:
    t0 = time.monotonic()
    procs = [start_worker(f"alone-{i}", i % 2, "127.0.0.1:0", token_file) for i in range(workers)]
    wait_ready([Starting(p, f"worker alone-{i}") for i, p in enumerate(procs)])
    took = time.monotonic() - t0
    for p in procs:
        p.kill()
        p.wait()
        p.stdout.close()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    first = engine_start(args.workers)
    later = [engine_start(args.workers) for _ in range(args.runs)]
    with tempfile.TemporaryDirectory() as d:
        token_file = str(auth.write(Path(d) / "token", auth.generate()))
        alone = [alone_start(args.workers, token_file) for _ in range(args.runs)]
    print(f"instance managers: {args.workers}, runs: {args.runs}")
    print(f"  sparkcep Engine.local, first in the process (starts the template): {first:.2f} s")
    print(f"  sparkcep Engine.local, later ones (forks): {', '.join(f'{t:.2f}' for t in later)} s; "
          f"median {statistics.median(later):.2f} s")
    print(f"  workers started alone: {', '.join(f'{t:.2f}' for t in alone)} s; median {statistics.median(alone):.2f} s")
    print(f"  ratio alone / later engine starts: {statistics.median(alone) / statistics.median(later):.1f}x")


if __name__ == "__main__":
    main()
