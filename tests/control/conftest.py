"""Fixtures of the control-plane tests: a real ZooKeeper server for the whole run, registry sessions."""

from __future__ import annotations

import time
import uuid

import pytest
from zk_harness import SESSION_TIMEOUT

from sparkcep.control.registry import EmbeddedRegistry, Store, ZkRegistry
from sparkcep.control.zookeeper import ZooKeeperServer


@pytest.fixture(scope="session")
def zookeeper():
    """``host:port`` of a ZooKeeper server on loopback, started once for the run by ``sparkcep zookeeper``'s
    code (about 1 s), stopped at the end with its data."""
    server = ZooKeeperServer()
    started = time.monotonic()
    address = server.start(timeout=60)
    print(f"\nZooKeeper on {address}, answering {time.monotonic() - started:.2f} s after launch")
    yield address
    server.stop()


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
