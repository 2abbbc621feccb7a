"""sparkcep: the UPM-CEP streaming engine for Spark users.

>>> import sparkcep as cep
>>> q = cep.Query("demo")
>>> s = q.stream("connections", "ip string, ts timestamp, bytes int64")
>>> q.output("per_ip", s.aggregate(cep.TimeWindow("10s"), by=["ip"], n=cep.count()))
"""

from sparkcep.errors import (EngineError, InputError, QueryError, SchemaError, SparkcepError,
                             UnknownStreamError)
from sparkcep.query.aggregates import avg, count, first, last, max, min, sum
from sparkcep.query.expressions import col, lit
from sparkcep.query.operators import StatefulOperator, Stream
from sparkcep.query.query import Query
from sparkcep.query.running import Running
from sparkcep.query.windows import TimeWindow, TupleWindow
from sparkcep.engine import Engine
from sparkcep.schema import Schema

__all__ = ["Query", "Stream", "Schema", "Engine", "TimeWindow", "TupleWindow", "Running", "col", "lit",
           "count", "sum", "avg", "min", "max", "first", "last", "StatefulOperator",
           "SparkcepError", "SchemaError", "QueryError", "InputError", "UnknownStreamError", "EngineError"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # sparkcep.spark (the Spark data source and configure()) pulls in pyspark: load it on first use
    if name == "spark":
        import importlib
        return importlib.import_module("sparkcep.spark")
    raise AttributeError(f"module 'sparkcep' has no attribute {name!r}")
