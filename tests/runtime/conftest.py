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


_engines: dict[int, cep.Engine] = {}


@pytest.fixture(scope="session")
def worker_engines():
    """``get(n)``: an engine with ``n`` instance managers, shared until the last runtime test."""
    def get(n: int) -> cep.Engine:
        if n not in _engines:
            _engines[n] = cep.Engine.local(workers=n)
        return _engines[n]
    yield get
    _close_engines()


def pytest_runtest_teardown(item, nextitem):
    """Their instance managers stop with the runtime tests, not at the end of the whole run."""
    if nextitem is None or nextitem.path.parent != item.path.parent:
        _close_engines()


def _close_engines() -> None:
    while _engines:
        _engines.popitem()[1].close()
