"""The leading orchestrator's records of deployments (``/deployments``) against what the data path serves.

A real ZooKeeper, a real orchestrator (not running its loop: the test calls its refresh and undeploy) and a real engine
endpoint as the cluster's ``/engine``. An engine host taking over serves metrics while it replays its
journal, with only the queries replayed so far: a refresh then must leave the records alone. Before, it
deleted the records of the queries not replayed yet, and wrote them again afterwards without their deploy
options.
"""

from __future__ import annotations

import base64
import uuid

import cloudpickle
import psutil
import pytest

import sparkcep as cep
from harness import wait
from sparkcep import auth
from sparkcep.control import tree
from sparkcep.control.orchestrator import Orchestrator
from sparkcep.control.registry import open_registry
from sparkcep.errors import QueryError
from sparkcep.gateway.discovery import EngineNotFoundError


def query(name: str) -> cep.Query:
    q = cep.Query(name)
    s = q.stream(f"{name}_in", "k int64, ts timestamp", time="ts")
    q.output(f"{name}_out", s.aggregate(cep.TimeWindow("1s"), by="k", name="agg", n=cep.count()))
    return q


@pytest.fixture
def cluster(zookeeper, tmp_path):
    """(orchestrator leading a fresh root, the engine it sees as the data path, the engine's endpoint)."""
    token = auth.generate()
    zk = f"zk://{zookeeper}/o{uuid.uuid4().hex[:8]}"
    orch = Orchestrator(open_registry(zk, session_timeout=2.0, token=token), zk, "o1",
                        str(auth.write(tmp_path / "token", token)))
    engine = cep.Engine.local(token=token)
    try:
        wait(orch.leading.is_set, "the orchestrator to lead")
        orch.registry.create(tree.ENGINE, {"name": "h1", "address": engine.endpoint.address, "era": 1, "run": "r"})
        yield orch, engine
    finally:
        orch.close()
        engine.close()


def deploy(orch: Orchestrator, q: cep.Query, **options) -> None:
    orch._deploy({"query": base64.b64encode(cloudpickle.dumps(q)).decode(), "options": options})


def record(orch: Orchestrator, name: str) -> dict | None:
    sealed = orch.registry.get(f"{tree.DEPLOYMENTS}/{name}")
    return None if sealed is None else auth.unseal(sealed, orch.token, "a deployment")


def test_a_refresh_during_a_take_over_keeps_the_records_of_queries_not_replayed_yet(cluster):
    orch, engine = cluster
    deploy(orch, query("a"), bins=64)
    deploy(orch, query("b"), bins=32)
    assert record(orch, "b")["options"] == {"bins": 32}

    engine.undeploy("b")  # what a host taking over serves before it replayed b
    engine.endpoint.role = lambda: "taking-over"
    orch._refresh()
    assert record(orch, "b")["options"] == {"bins": 32}
    assert orch.registry.get(f"{tree.STREAMS}/b_in") == {"query": "b"}

    engine.deploy(query("b"), bins=32)  # replayed: the take-over is done
    engine.endpoint.role = lambda: "primary"
    orch._refresh()
    assert record(orch, "b")["options"] == {"bins": 32}
    assert orch.registry.get(f"{tree.DEPLOYMENTS}/b/metrics")["state"] == "running"


def test_a_refresh_forgets_a_query_the_serving_data_path_no_longer_runs(cluster):
    orch, engine = cluster
    deploy(orch, query("a"))
    engine.undeploy("a")  # by another client of the data path
    orch._refresh()
    assert record(orch, "a") is None


def test_an_undeploy_whose_answer_was_lost_to_a_fail_over_is_done(cluster, monkeypatch):
    """The primary undeploys the query, then dies before it answers: the orchestrator's retry on the primary
    that took over finds the query gone. That raised UNKNOWN_QUERY to a caller whose undeploy succeeded."""
    from sparkcep.gateway.client import EngineClient
    from sparkcep.gateway.discovery import EngineNotFoundError
    orch, engine = cluster
    deploy(orch, query("u"))
    undeploy, calls = EngineClient.undeploy, []

    def answer_lost(client, name):
        calls.append(name)
        undeploy(client, name)
        if len(calls) == 1:
            raise EngineNotFoundError("the engine closed the connection (it died)", "ENGINE_NOT_FOUND")
    monkeypatch.setattr(EngineClient, "undeploy", answer_lost)
    assert orch._undeploy({"query": "u"}) == {"query": "u"}
    assert calls == ["u", "u"] and "u" not in engine.deployments and record(orch, "u") is None



def open_to(address: str) -> int:
    """This process's open TCP connections to ``address`` (host:port)."""
    port = int(address.rpartition(":")[2])
    return sum(1 for c in psutil.Process().net_connections("tcp")
               if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED)


def test_a_call_that_fails_for_good_after_a_retry_leaves_no_connection_open(cluster):
    """The connection the data path's call opened to try again was left open when the call then failed:
    the caller, which gets the connection back only with a result, could not close it."""
    orch, engine = cluster
    before = open_to(engine.endpoint.address)
    tries = []

    def fn(client):
        tries.append(client)
        client.hello()  # a round trip: the connection is open
        if len(tries) == 1:
            raise EngineNotFoundError("the data path moved")  # tried again on a new connection
        raise QueryError("no query named 'x' is deployed", "UNKNOWN_QUERY")  # fails for good
    with pytest.raises(QueryError):
        orch.path.call("a test", fn)
    assert len(tries) == 2 and open_to(engine.endpoint.address) == before
