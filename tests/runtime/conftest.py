"""The runtime tests' engines publish themselves in a home of their own."""

import pytest


@pytest.fixture(autouse=True)
def own_home(tmp_path_factory, monkeypatch):
    """Engines started here publish themselves in a private SPARKCEP_HOME, not the user's."""
    home = tmp_path_factory.getbasetemp() / "sparkcep-home"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("SPARKCEP_HOME", str(home))
    return home
