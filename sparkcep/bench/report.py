"""``python -m sparkcep.bench.report [PATH]``: regenerate ``docs/benchmarks.md``.

The same as ``sparkcep bench all --compare spark --workers 2 --report
docs/benchmarks.md``: every workload on sparkcep (2 instance managers) and on
Spark (local[2]), side by side in one run; the table's numbers are that run's.
"""

from __future__ import annotations

import sys

from sparkcep.cli import main

if __name__ == "__main__":
    path = sys.argv[1] if len(sys.argv) > 1 else "docs/benchmarks.md"
    sys.exit(main(["bench", "all", "--compare", "spark", "--workers", "2", "--report", path, *sys.argv[2:]]))
