"""Fixtures of the control-plane tests: registry sessions (the ZooKeeper server of the run, ``zookeeper``,
is in ``tests/conftest.py``: the Spark tests use it too)."""

from __future__ import annotations

import uuid

import pytest
from zk_harness import SESSION_TIMEOUT

from sparkcep.control.registry import EmbeddedRegistry, Store, ZkRegistry


@pytest.fixture(params=["zookeeper", "embedded"])
def open_session(request):
    """``open_session()``: a new registry session, on a namespace of this test's own: a fresh root on the
    test ZooKeeper, or one in-process store. Every session is closed after the test."""
    sessions = []
    root = f"/tests/{uuid.uuid4().hex[:12]}"
    if request.param == "zookeeper":
        hosts = request.getfixturevalue("zookeeper")

        def make():
            return ZkRegistry(hosts, root, session_timeout=SESSION_TIMEOUT, timeout=10)
    else:
        store = Store()

        def make():
            return EmbeddedRegistry(root, store=store)

    def open_():
        sessions.append(make())
        return sessions[-1]
    yield open_
    for session in sessions:
        session.close()
