"""Shared test set-up: import paths, a bounded hypothesis profile, small fixtures.

Helpers live in ``harness.py`` (run a query on rows sent in chunks) and the
independent semantics in ``reference.py``; both are importable from tests.
"""

import os
import sys
import tempfile

import pytest
from hypothesis import HealthCheck, settings

# Engines announce themselves in $SPARKCEP_HOME/local.json: keep the test run's out of ~/.sparkcep.
os.environ.setdefault("SPARKCEP_HOME", tempfile.mkdtemp(prefix="sparkcep-tests-"))

HERE = os.path.dirname(os.path.abspath(__file__))
for path in (HERE, os.path.dirname(HERE)):
    if path not in sys.path:
        sys.path.insert(0, path)

# Bounded so the whole core suite stays within a few minutes on 2 shared cores;
# SPARKCEP_HYPOTHESIS=thorough runs more examples when hunting bugs.
settings.register_profile("core", max_examples=40, deadline=None, derandomize=False,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("thorough", max_examples=400, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("SPARKCEP_HYPOTHESIS", "core"))


@pytest.fixture(scope="session")
def zookeeper():
    """``host:port`` of a ZooKeeper server on loopback, started once for the run by ``sparkcep zookeeper``'s
    code (about 1 s), stopped at the end with its data. Tests take a root of their own under it."""
    import time

    from sparkcep.control.zookeeper import ZooKeeperServer
    server = ZooKeeperServer()
    started = time.monotonic()
    address = server.start(timeout=60)
    print(f"\nZooKeeper on {address}, answering {time.monotonic() - started:.2f} s after launch")
    yield address
    server.stop()


@pytest.fixture
def engine():
    """A fresh in-process engine, closed after the test."""
    import sparkcep as cep
    with cep.Engine.local(workers=0) as e:
        yield e


_engines: dict = {}  # instance managers per engine -> the shared engine


@pytest.fixture(scope="session")
def worker_engines():
    """``get(n)``: an engine with ``n`` instance managers, shared by the tests of one directory."""
    def get(n: int):
        if n not in _engines:
            from sparkcep import Engine
            _engines[n] = Engine.local(workers=n)
        return _engines[n]
    yield get
    _close_engines()


def pytest_runtest_teardown(item, nextitem):
    """Their instance managers stop with the tests of a directory, not at the end of the whole run."""
    if nextitem is None or nextitem.path.parent != item.path.parent:
        _close_engines()


def _close_engines() -> None:
    while _engines:
        _engines.popitem()[1].close()
