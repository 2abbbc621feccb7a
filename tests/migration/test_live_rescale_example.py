"""The README's live rescale: ``examples/live_rescale.py`` goes from two instances to three while records
flow, reports the rescale, checks every window's count of every IP against the records sent and draws
the latency plot where it is told (by default in the directory it runs in, never over the README's
``docs/live_rescale.png``)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_live_rescale_example_counts_every_record_once_per_window_and_ip(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "live_rescale.py"), "--rate", "10000",
                          "--seconds", "4", "--rescale-at", "1.5", "--ips", "5000"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    after = out.stdout.split("instance managers after:")[1].split("rescale report:")[0]
    assert "SQ2[2]" in after, out.stdout
    report = dict(re.findall(r"^\s+(\w+): (.+)$", out.stdout.split("rescale report:")[1], re.M))
    assert report["kind"] == "rescale" and int(report["bins"]) == 4096 // 3, report
    sent = re.search(r"^([\d,]+) records in [\d,]+ sends", out.stdout, re.M)[1]
    counts = re.search(r"^([\d,]+) \(window, IP\) counts out, adding up to ([\d,]+): every record counted once, "
                       r"under its window and IP$", out.stdout, re.M)
    assert counts and counts[2] == sent and int(counts[1].replace(",", "")) > 5000, out.stdout
    assert (tmp_path / "live_rescale.png").stat().st_size > 10_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["live_rescale.png"]  # nothing in a docs/ of its own
