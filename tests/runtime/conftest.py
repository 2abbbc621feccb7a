"""Engines with instance managers, shared by the runtime tests (starting processes costs time)."""

import pytest

import sparkcep as cep


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
