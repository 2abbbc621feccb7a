"""``benchmarks/spark_pipeline.py`` runs as shipped: Spark's Python workers are started with the Python that
runs it, not the ``python3`` the PATH finds (without sparkcep there, Spark said ``DATA_SOURCE_NOT_FOUND:
upmcep``; the tests set ``PYSPARK_PYTHON``, the script did not)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_pipeline_benchmark_runs_with_another_python3_first_on_the_path(tmp_path):
    other = tmp_path / "bin"
    other.mkdir()
    (other / "python3").write_text("#!/bin/sh\necho 'not the benchmark's python' >&2\nexit 3\n")
    (other / "python3").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env["PATH"] = f"{other}{os.pathsep}{env['PATH']}"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "spark_pipeline.py"), "--events", "2000",
                          "--files", "1", "--span", "20", "--runs", "1", "--warm-ups", "0"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    if "DATA_SOURCE_NOT_FOUND" in run.stdout + run.stderr:
        pytest.fail("Spark's workers ran the python3 of the PATH:\n" + run.stdout[-2000:])
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "(results complete)" in run.stdout
