"""Helpers of the runtime tests: run a query on an engine with instance managers.

A module of its own name (not conftest): worker processes unpickle test
queries by importing their test module, and ``conftest`` is ambiguous there.
"""

import sparkcep as cep
from harness import Run, plain, table

def run_on(engine: cep.Engine, query: cep.Query, sends, parallelism=1, bins: int = 128) -> Run:
    """Deploy ``query`` on ``engine``, send ``sends`` = [(stream, rows)], end its streams, collect, undeploy."""
    schemas = {n: s.schema.fields for n, s in query.sources.items()}
    engine.deploy(query, parallelism=parallelism, bins=bins)
    try:
        for stream, rows in sends:
            if rows:
                engine.send(stream, table(rows, schemas[stream]))
        for stream in query.sources:
            engine.end(stream)
        arrow = {o: engine.collect(o, timeout=60) for o in query.outputs}
        metrics = engine.metrics()
    finally:
        engine.undeploy(query.name)
    late = sum(metrics["late"].get(query.name, {}).values())
    return Run({o: plain(t) for o, t in arrow.items()}, arrow, late, metrics)
