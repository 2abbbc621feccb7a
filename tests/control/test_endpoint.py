"""The loopback endpoint and its client, against an in-process engine: no Spark."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

import sparkcep as cep
from sparkcep.control import discovery
from sparkcep.control.client import EngineClient, resolve
from sparkcep.control.discovery import EngineNotFoundError
from sparkcep.errors import EngineError, InputError, UnknownStreamError

T0 = 1_704_067_200_000_000


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCEP_HOME", str(tmp_path))
    return tmp_path


@pytest.fixture
def served(home):
    q = cep.Query("demo")
    s = q.stream("connections", "ip string, ts timestamp, bytes int64")
    q.output("all", s.map(ip="ip", ts="ts", bytes="bytes"))
    with cep.Engine.local() as e:
        e.deploy(q)
        with EngineClient.connect() as c:
            yield e, c


def _rows(n, start=0):
    return pa.table({"ip": [f"h{i % 3}" for i in range(start, start + n)],
                     "ts": pa.array([T0 + i for i in range(start, start + n)], pa.timestamp("us")),
                     "bytes": list(range(start, start + n))})


def test_published_while_open_and_removed_at_close(home):
    with cep.Engine.local() as e:
        info = json.loads((home / "local.json").read_text())
        assert info["address"] == e.endpoint.address and resolve(None) == e.endpoint.address
    assert not (home / "local.json").exists()
    with pytest.raises(EngineNotFoundError) as err:
        EngineClient.connect()
    assert err.value.code == "ENGINE_NOT_FOUND"


def test_stale_file_of_a_dead_process_is_reported(home):
    (home / "local.json").write_text(json.dumps({"address": "127.0.0.1:1", "pid": 2**22 + 17}))
    with pytest.raises(EngineNotFoundError, match="no longer running"):
        discovery.local_address()


def test_schema_send_read_commit(served):
    e, c = served
    assert c.schema("all") == {"kind": "output", "fields": {"ip": "string", "ts": "timestamp", "bytes": "int64"},
                               "time_field": None}
    assert c.schema("connections")["kind"] == "input"
    assert c.send("connections", _rows(5)) == {"rows": 5, "duplicate": False}
    assert c.offsets("all") == ({0: 0}, {0: 5})
    t = c.read("all", 0, 1, 4)
    assert t.column("bytes").to_pylist() == [1, 2, 3] and t.column("__seq").to_pylist() == [1, 2, 3]
    c.commit("all", {0: 2}, consumer="spark")
    assert e.collect("all").column("bytes").to_pylist() == [2, 3, 4]
    with pytest.raises(EngineError) as err:
        c.read("all", 0, 0, 3)
    assert err.value.code == "OFFSET_RELEASED"


def test_keyed_send_is_ingested_once(served):
    e, c = served
    assert c.send("connections", _rows(4), key=["q1", 0, 0])["duplicate"] is False
    assert c.send("connections", _rows(4), key=["q1", 0, 0])["duplicate"] is True
    assert c.send("connections", _rows(2, 4), key=["q1", 0, 1])["rows"] == 2
    c.commit_write("q1", 0)
    assert c.send("connections", _rows(4), key=["q1", 0, 5])["duplicate"] is True  # batch 0 is settled
    assert c.send("connections", _rows(1, 6), key=["q2", 0, 0])["rows"] == 1  # another writer
    assert e.collect("all").column("bytes").to_pylist() == list(range(7))
    assert e.endpoint.counters["duplicate_sends"] == 2


def test_errors_keep_their_class_and_code(served):
    e, c = served
    with pytest.raises(UnknownStreamError) as err:
        c.schema("nope")
    assert err.value.code == "UNKNOWN_STREAM" and "'nope'" in str(err.value)
    with pytest.raises(InputError) as err:
        c.send("connections", pa.table({"ip": ["x"], "bytes": [1]}))
    assert err.value.code == "MISSING_FIELD"
    assert e.collect("all").num_rows == 0  # a rejected send leaves no trace
    with pytest.raises(EngineError) as err:
        c.request("frobnicate")
    assert err.value.code == "UNKNOWN_OP"
    assert c.hello()["pid"] > 0  # the connection survives errors


def test_metrics_and_instance_managers(served):
    e, c = served
    c.send("connections", _rows(3))
    assert c.metrics()["sequence"] == 3
    c.register_im({"id": "x-0", "pid": 123, "cpu": 0})
    assert [i["id"] for i in c.instance_managers()] == ["x-0"]
    c.deregister_im("x-0")
    assert c.instance_managers() == []
    earliest, latest = c.offsets("$metrics")
    samples = c.read("$metrics", 0, 0, latest[0]).to_pydict()
    assert dict(zip(samples["name"], samples["value"]))["sequence"] == 3.0


def test_engine_option_forms(home):
    assert resolve("127.0.0.1:4000") == "127.0.0.1:4000"
    for bad, code in (("nonsense", "ENGINE_OPTION"), ("zk://127.0.0.1:2181/x", "ENGINE_ZK_UNSUPPORTED")):
        with pytest.raises(EngineError) as err:
            resolve(bad)
        assert err.value.code == code
