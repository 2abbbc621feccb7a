"""The spark-submit job and the fixwindow notebook run, and their results are the engine's.

Each starts its own Spark (a spark-submit driver, a notebook kernel), in a
fresh interpreter that finds ``format("upmcep")`` by auto-registration only.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from chispa import assert_df_equality
from spark_harness import spark_df

import sparkcep as cep

ROOT = Path(__file__).resolve().parents[2]
COLS = ["window_start", "window_end", "ip", "count", "first"]


def _fixwindow_reference(input_dir: Path):
    from sparkcep.bench import workloads

    with cep.Engine.local() as e:
        e.deploy(workloads.query("fixwindow"))
        for f in sorted(input_dir.glob("*.parquet")):
            e.send(workloads.STREAM, pq.read_table(f))
        e.end(workloads.STREAM)
        return e.collect("fixwindow")


def test_spark_submit_job(spark, tmp_path):
    import pyspark

    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARKCEP_HOME=str(tmp_path / "home"))
    run = subprocess.run([str(submit), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
                          "--conf", "spark.ui.showConsoleProgress=false",
                          str(ROOT / "examples" / "spark_submit_job.py"), "--output", str(tmp_path / "out"),
                          "--input", str(tmp_path / "in"), "--events", "30000", "--files", "3", "--rate", "1000",
                          "--ips", "20"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "rows written to" in run.stdout
    want = _fixwindow_reference(tmp_path / "in")
    assert want.num_rows == 3 * 20
    got = spark.read.parquet(str(tmp_path / "out"))
    assert_df_equality(got.select(*COLS), spark_df(spark, want, COLS), ignore_row_order=True, ignore_nullable=True)


def test_fixwindow_notebook_executes(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("SPARKCEP_HOME", str(tmp_path / "home"))  # the kernel's own engine, found by discovery
    nb = nbformat.read(ROOT / "notebooks" / "fixwindow.ipynb", as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 2  # live metrics (redrawn in place), results
    assert any("200 window results, 40,000 records counted" in o.get("text", "") for o in outputs)
    text = "".join(o.get("text", "") for o in outputs)
    redraws = re.search(r"the plot was redrawn (\d+) times while Spark fed the engine", text)
    assert redraws and int(redraws[1]) >= 2, text  # a live plot, not one drawn at the end
