"""Enabling the JVM plugin (``jvm-shim/``) on a SparkSession builder.

>>> import sparkcep.spark
>>> builder = SparkSession.builder.master("local[2]")          # doctest: +SKIP
>>> spark = sparkcep.spark.configure(builder).getOrCreate()     # doctest: +SKIP

The plugin starts the instance managers of every executor with it (see
:mod:`sparkcep.spark.executor`). Its jar is compiled on first use with
``javac`` against the jars of the installed pyspark (about 5 s), into
``$SPARKCEP_HOME/jars/`` under a name that changes with the Java sources;
``$SPARKCEP_SHIM_JAR`` names a prebuilt jar instead.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from sparkcep.control import discovery
from sparkcep.errors import SparkcepError

PLUGIN_CLASS = "org.sparkcep.shim.SparkcepPlugin"
SHIM_DIR = Path(__file__).resolve().parents[2] / "jvm-shim"


class ShimBuildError(SparkcepError):
    """The JVM plugin jar could not be built."""

    code = "SHIM_BUILD"


def shim_jar(rebuild: bool = False) -> Path:
    """The plugin jar: ``$SPARKCEP_SHIM_JAR``, or built from ``jvm-shim/`` (cached by source hash)."""
    if os.environ.get("SPARKCEP_SHIM_JAR"):
        jar = Path(os.environ["SPARKCEP_SHIM_JAR"])
        if not jar.is_file():
            raise ShimBuildError(f"SPARKCEP_SHIM_JAR={jar} is not a file")
        return jar
    sources = sorted((SHIM_DIR / "src").rglob("*.java"))
    if not sources:
        raise ShimBuildError(f"no Java sources under {SHIM_DIR / 'src'}: sparkcep is installed without its "
                             "jvm-shim/ directory; build the jar from a source checkout with jvm-shim/build.sh "
                             "and set SPARKCEP_SHIM_JAR to it")
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:12]
    jar = discovery.home() / "jars" / f"sparkcep-shim-{digest}.jar"
    if jar.is_file() and not rebuild:
        return jar
    run = subprocess.run(["bash", str(SHIM_DIR / "build.sh"), str(jar)], capture_output=True, text=True,
                         env={**os.environ, "PYTHON": sys.executable})
    if run.returncode != 0:
        raise ShimBuildError(f"building {jar} failed (jvm-shim/build.sh needs javac and jar from a JDK >= 17):\n"
                             f"{run.stderr.strip()}")
    return jar


def configure(builder, instance_managers: int | None = None, engine: str | None = None,
              python: str | None = None):
    """Add the sparkcep plugin to a ``SparkSession.Builder``; returns the builder.

    ``instance_managers``: per executor (default: its cores, or the CPUs of
    this machine in local mode); ``engine``: ``host:port`` of the engine the
    instance managers register with (default: the local engine); ``python``:
    the interpreter that runs them (default: this one).
    """
    options = getattr(builder, "_options", {})
    jars = [j for j in options.get("spark.jars", "").split(",") if j]
    plugins = [p for p in options.get("spark.plugins", "").split(",") if p]
    builder = builder.config("spark.jars", ",".join(jars + [str(shim_jar())])) \
        .config("spark.plugins", ",".join(plugins + [PLUGIN_CLASS] if PLUGIN_CLASS not in plugins else plugins)) \
        .config("spark.sparkcep.python", python or sys.executable)
    if instance_managers is not None:
        builder = builder.config("spark.sparkcep.instanceManagers", str(int(instance_managers)))
    if engine is not None:
        builder = builder.config("spark.sparkcep.engine", engine)
    return builder
