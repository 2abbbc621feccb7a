"""The README's live rescale: ``examples/live_rescale.py`` goes from two instances to three while records
flow, reports the rescale, counts every record once and draws the latency plot."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_live_rescale_example_counts_every_record_once(tmp_path):
    png = tmp_path / "rescale.png"
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "live_rescale.py"), "--rate", "10000",
                          "--seconds", "4", "--rescale-at", "1.5", "--ips", "5000", "--plot", str(png)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    after = out.stdout.split("instance managers after:")[1].split("rescale report:")[0]
    assert "SQ2[2]" in after, out.stdout
    report = dict(re.findall(r"^\s+(\w+): (.+)$", out.stdout.split("rescale report:")[1], re.M))
    assert report["kind"] == "rescale" and int(report["bins"]) == 4096 // 3, report
    assert "every record counted once" in out.stdout
    assert png.stat().st_size > 10_000
