"""Enabling the JVM plugin (``jvm-shim/``) on a SparkSession builder.

>>> import sparkcep.spark
>>> builder = SparkSession.builder.master("local[2]")          # doctest: +SKIP
>>> spark = sparkcep.spark.configure(builder).getOrCreate()     # doctest: +SKIP

With it every executor runs instance managers (``sparkcep worker``
processes, one per core) that serve the engine and host instances of the
queries it deploys (see :mod:`sparkcep.spark.executor`). The plugin's jar is
compiled on first use with ``javac`` against the jars of the installed
pyspark (about 5 s), into ``$SPARKCEP_HOME/jars/`` under a name that changes
with the Java sources; ``$SPARKCEP_SHIM_JAR`` names a prebuilt jar instead.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from sparkcep.arguments import integer
from sparkcep.gateway import discovery
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
              token_file: str | None = None, listen: str | None = None, python: str | None = None,
              zk: str | None = None):
    """Add the sparkcep plugin to a ``SparkSession.Builder`` (before ``getOrCreate``); returns the builder.

    Always sets ``spark.jars`` (adds the plugin's jar, built if needed) and
    ``spark.plugins`` (adds ``org.sparkcep.shim.SparkcepPlugin``); each
    argument given sets one option the executors read:

    * ``instance_managers`` -> ``spark.sparkcep.instanceManagers``: per
      executor (default: the executor's cores);
    * ``engine`` -> ``spark.sparkcep.engine``: ``host:port`` of the engine's
      endpoint (default: the local engine, whenever one runs);
    * ``zk`` -> ``spark.sparkcep.zk``: instead of an engine, a cluster's
      registry (``zk://HOST:PORT/PATH``): the instance managers join it as
      members, and its engine host deploys to them;
    * ``token_file`` -> ``spark.sparkcep.tokenFile``: that engine's token, a
      path on the executors' hosts (default: the file an engine of the same
      host writes); with ``zk`` the cluster's token, required;
    * ``listen`` -> ``spark.sparkcep.listen``: where the instance managers
      listen: ``loopback`` (default), ``host`` (the executor host's address)
      or ``HOST[:PORT]``; beyond loopback only for an engine on another host;
    * ``python`` -> ``spark.sparkcep.python``: the interpreter that runs them
      (default: the one of Spark's Python workers: ``spark.pyspark.python``,
      ``$PYSPARK_PYTHON`` or ``python3``).
    """
    options = getattr(builder, "_options", {})
    jars = [j for j in options.get("spark.jars", "").split(",") if j]
    plugins = [p for p in options.get("spark.plugins", "").split(",") if p]
    builder = builder.config("spark.jars", ",".join(jars + [str(shim_jar())])) \
        .config("spark.plugins", ",".join(plugins + [PLUGIN_CLASS] if PLUGIN_CLASS not in plugins else plugins))
    settings = {"instanceManagers": None if instance_managers is None else
                str(integer(instance_managers, "instance_managers", minimum=1, code="OPTION")),
                "engine": engine, "zk": zk, "tokenFile": token_file, "listen": listen, "python": python}
    for key, value in settings.items():
        if value is not None:
            builder = builder.config(f"spark.sparkcep.{key}", value)
    return builder
