"""sparkcep: the UPM-CEP streaming engine for Spark users.

>>> import sparkcep as cep
>>> q = cep.Query("demo")
>>> s = q.stream("connections", "ip string, ts timestamp, bytes int64")
>>> q.output("per_ip", s.aggregate(cep.TimeWindow("10s"), by=["ip"], n=cep.count()))

Names load on first use (PEP 562): a process that only needs the Spark data
source or the command line does not pay for the engine's compiled kernels.
"""

import importlib

_NAMES = {
    "Query": "sparkcep.query.query", "Stream": "sparkcep.query.operators",
    "StatefulOperator": "sparkcep.query.operators", "Schema": "sparkcep.schema", "Engine": "sparkcep.engine",
    "TimeWindow": "sparkcep.query.windows", "TupleWindow": "sparkcep.query.windows",
    "Running": "sparkcep.query.running", "Retention": "sparkcep.runtime.output_log", "col": "sparkcep.query.expressions", "lit": "sparkcep.query.expressions",
    **{f: "sparkcep.query.aggregates" for f in ("count", "sum", "avg", "min", "max", "first", "last")},
    **{e: "sparkcep.errors" for e in ("SparkcepError", "SchemaError", "QueryError", "InputError",
                                      "UnknownStreamError", "EngineError")},
    "spark": None,  # the Spark data source and configure(): pulls in pyspark
}

__all__ = [n for n in _NAMES if n != "spark"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name not in _NAMES:
        raise AttributeError(f"module 'sparkcep' has no attribute {name!r}")
    if name == "spark":
        return importlib.import_module("sparkcep.spark")
    value = getattr(importlib.import_module(_NAMES[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
