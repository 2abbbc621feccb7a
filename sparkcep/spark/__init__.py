"""Spark integration: the ``upmcep`` data source and the JVM plugin's helpers.

``configure(builder)`` adds the executor plugin that starts instance managers
with each Spark executor (see ``jvm-shim/``).
"""

from sparkcep.spark.plugin import configure

__all__ = ["configure"]
