"""Makes ``spark.read.format("upmcep")`` work without ``spark.dataSource.register``.

PySpark (>= 4) imports every installed top-level module named ``pyspark_*``
and registers its ``DefaultSource`` under ``DefaultSource.name()``.
"""

from sparkcep.spark.source import UpmcepDataSource as DefaultSource

__all__ = ["DefaultSource"]
