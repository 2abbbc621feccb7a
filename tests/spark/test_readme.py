"""The pipeline that opens the README's Spark section runs as it is written, in this run's Spark session.

The block is taken from README.md (the ``python`` block after the marker), so it cannot drift from
what is tested; its windows are checked against pandas.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- spark-pipeline -->"


def readme_block(marker: str) -> str:
    """The ``python`` code block right after ``marker`` in README.md."""
    found = re.search(re.escape(marker) + r"\n```python\n(.*?)\n```\n", (ROOT / "README.md").read_text(), re.S)
    assert found, f"README.md has no python block right after {marker}"
    return found[1]


def test_readme_spark_pipeline_runs_as_written(spark, sparkcep_home):
    scope = {"__name__": "__readme__"}
    exec(compile(readme_block(MARKER), "README.md (spark-pipeline)", "exec"), scope)
    assert scope["spark"] is spark  # getOrCreate() found the run's session
    events = scope["events"]
    events = events.assign(window_start=events["ts"].dt.floor("10s").dt.tz_localize(None))
    want = (events.groupby(["window_start", "ip"]).agg(n=("bytes", "size"), total=("bytes", "sum")).reset_index()
            .sort_values(["window_start", "ip"], ignore_index=True))
    got = (spark.table("per_ip").select("window_start", "ip", "n", "total").toPandas()
           .sort_values(["window_start", "ip"], ignore_index=True))
    assert len(want) == 40
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
