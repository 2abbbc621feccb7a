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


@pytest.fixture
def engine():
    """A fresh in-process engine, closed after the test."""
    import sparkcep as cep
    with cep.Engine.local(workers=0) as e:
        yield e
