"""Engines with instance managers, shared by the runtime tests (starting processes costs time)."""

import itertools

import pytest

import sparkcep as cep
from harness import Run, plain, table

_names = itertools.count(1)


@pytest.fixture(autouse=True)
def own_home(tmp_path_factory, monkeypatch):
    """Engines started here publish themselves in a private SPARKCEP_HOME, not the user's."""
    home = tmp_path_factory.getbasetemp() / "sparkcep-home"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("SPARKCEP_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def worker_engines():
    """``get(n)``: a session-wide engine with ``n`` instance managers."""
    engines: dict[int, cep.Engine] = {}

    def get(n: int) -> cep.Engine:
        if n not in engines:
            engines[n] = cep.Engine.local(workers=n)
        return engines[n]
    yield get
    for e in engines.values():
        e.close()


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


def fresh_name(prefix: str) -> str:
    return f"{prefix}{next(_names)}"
