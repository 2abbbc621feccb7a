"""The README's main job: ``examples/fixwindow.py`` runs on instance managers and reports
results that add up to the records it sent."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_fixwindow_example_runs_on_two_workers():
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "fixwindow.py"), "--workers", "2",
                          "--events", "40000", "--rate", "20000", "--ips", "500"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "records/s" in out.stdout and "busiest IPs of any window" in out.stdout
    counted = re.search(r"counts sum to ([\d,]+)", out.stdout)
    assert counted and int(counted.group(1).replace(",", "")) == 40_000


def test_the_main_job_refuses_a_count_it_cannot_run_naming_it():
    """``--events 0`` ended in a TypeError traceback, ``--ips 0`` in a ValueError one, ``--window 0s`` and
    ``--window abc`` in a QueryError one; ``--events 1e12`` ran until memory ran out, ``--rate 0.01`` sent
    one record a hundred seconds."""
    for argv, says in [(["--events", "0"], "argument --events: must be from 1 to 20,000,000, got 0"),
                       (["--events", "1e12"], "argument --events: must be from 1 to 20,000,000, got 1e12"),
                       (["--rate", "0.01"], "argument --rate: must be 0 (as fast as possible) or 1 or more, got 0.01"),
                       (["--ips", "0"], "argument --ips: must be from 1 to 4,194,304, got 0"),
                       (["--window", "0s"], "argument --window: must be above zero, got 0s"),
                       (["--window", "abc"], "argument --window: cannot read window 'abc'; write e.g. '10s', "
                                             "'500ms', '5m' or a timedelta")]:
        out = subprocess.run([sys.executable, str(ROOT / "examples" / "fixwindow.py"), *argv],
                             capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.strip().splitlines()[-1] == f"fixwindow.py: error: {says}", out.stderr
