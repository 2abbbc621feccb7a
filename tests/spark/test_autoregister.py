"""``format("upmcep")`` needs nothing but ``pip install`` (acceptance 3).

The shared session of this suite never registers the source, so every Spark
test relies on auto-registration already; here a fresh interpreter, given
only a regular (non-editable) ``pip install`` of the package, finds the
source the way Spark's lookup worker does. The spark-submit example test runs
a whole job in a fresh interpreter the same way.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

LOOKUP = r"""
import importlib, pkgutil, sys
from pyspark.sql.datasource import DataSource
# what pyspark.sql.worker.lookup_data_sources does for the JVM
found = {}
for info in pkgutil.iter_modules():
    if info.name.startswith("pyspark_"):
        mod = importlib.import_module(info.name)
        if hasattr(mod, "DefaultSource") and issubclass(mod.DefaultSource, DataSource):
            found[mod.DefaultSource.name()] = mod.__file__
print(found["upmcep"])
"""


def test_plain_pip_install_is_found_by_spark_lookup(tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--disable-pip-version-check", "--target", str(target), str(ROOT)], check=True,
                   cwd=tmp_path, timeout=300)
    assert (target / "pyspark_upmcep" / "__init__.py").is_file()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    run = subprocess.run([sys.executable, "-c", LOOKUP], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().startswith(str(target)), run.stdout


def test_installed_checkout_is_visible_to_spark_lookup(tmp_path):
    """The development install (pip install -e) must be a plain path entry, not an import hook."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, "-c", LOOKUP], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, ("pyspark_upmcep is not found by pkgutil.iter_modules(): install sparkcep "
                                 "with pip (editable installs need pyproject's package-dir)\n" + run.stderr)
