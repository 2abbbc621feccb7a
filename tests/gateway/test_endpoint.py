"""The loopback endpoint and its client, against an in-process engine: no Spark."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pytest

import sparkcep as cep
from sparkcep.gateway import discovery
from sparkcep.gateway.client import EngineClient, resolve
from sparkcep.gateway.discovery import EngineNotFoundError
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
        assert info["token_file"] == str(discovery.token_file(e.endpoint.address))
    assert not (home / "local.json").exists()
    assert not discovery.token_file(e.endpoint.address).exists()
    with pytest.raises(EngineNotFoundError) as err:
        EngineClient.connect()
    assert err.value.code == "ENGINE_NOT_FOUND"


@pytest.mark.parametrize("listen,code", [("127.0.0.1:70000", "OPTION"), ("127.0.0.1", "OPTION"),
                                         ("no-such-host.invalid:0", "LISTEN_FAILED")])
def test_an_address_the_engine_cannot_listen_on_is_refused_naming_it(home, listen, code):
    """A port past 65535 raised Python's OverflowError, a host that does not resolve a socket.gaierror."""
    with pytest.raises(EngineError) as e:
        cep.Engine.local(listen=listen)
    assert e.value.code == code and repr(listen) in str(e.value)
    assert not (home / "local.json").exists()


def test_stale_file_of_a_dead_process_is_reported(home):
    (home / "local.json").write_text(json.dumps({"address": "127.0.0.1:1", "pid": 2**22 + 17}))
    with pytest.raises(EngineNotFoundError, match="no longer running"):
        discovery.local_address()


def test_schema_send_read_commit(served):
    e, c = served
    assert c.schema("all") == {"kind": "output", "fields": {"ip": "string", "ts": "timestamp", "bytes": "int64"},
                               "time_field": None, "retained": True}
    assert c.schema("connections")["kind"] == "input"
    assert c.send("connections", _rows(5)) == 5
    assert c.offsets("all") == {"earliest": {0: 0}, "latest": {0: 5}, "engine": e.run_id, "deployment": "demo#1"}
    t = c.read("all", 0, 1, 4)
    assert t.column("bytes").to_pylist() == [1, 2, 3] and t.column("__seq").to_pylist() == [1, 2, 3]
    c.commit("all", {0: 2}, consumer="spark")
    assert e.collect("all").column("bytes").to_pylist() == [2, 3, 4]
    with pytest.raises(EngineError) as err:
        c.read("all", 0, 0, 3)
    assert err.value.code == "OFFSET_RELEASED"


def test_offsets_name_their_engine_run_and_deployment(served):
    """Positions of another run or deployment, released or never produced, are refused: no clamping."""
    e, c = served
    c.send("connections", _rows(6))
    ours = {"engine": e.run_id, "deployment": "demo#1"}
    assert c.read("all", 0, 0, 6, **ours).num_rows == 6
    with pytest.raises(EngineError) as err:
        c.read("all", 0, 0, 6, engine="0" * 32, deployment="demo#1")
    assert err.value.code == "OFFSET_ENGINE" and "0" * 32 in str(err.value) and e.run_id in str(err.value)
    with pytest.raises(EngineError) as err:
        c.commit("all", {0: 6}, "spark", engine="0" * 32, deployment="demo#1")
    assert err.value.code == "OFFSET_ENGINE"
    assert e.collect("all").num_rows == 6  # nothing released by the refused commit
    with pytest.raises(EngineError) as err:
        c.offsets("all", positions={"0": 7}, **ours)
    assert err.value.code == "OFFSET_RANGE"
    c.commit("all", {0: 2}, "spark", **ours)
    with pytest.raises(EngineError) as err:
        c.offsets("all", positions={"0": 1}, **ours)
    assert err.value.code == "OFFSET_RELEASED"
    q = e.deployments["demo"].query
    e.undeploy("demo")
    e.deploy(q)
    with pytest.raises(EngineError) as err:
        c.offsets("all", **ours)
    assert err.value.code == "OFFSET_DEPLOYMENT" and "'demo#1'" in str(err.value) and "'demo#2'" in str(err.value)


def test_registered_consumer_holds_rows_before_its_first_commit(served):
    e, c = served
    c.send("connections", _rows(5))
    c.register("all", "late-reader")
    c.commit("all", {0: 5}, "early-reader")
    assert e.collect("all").num_rows == 5  # the registered consumer has read nothing yet
    c.commit("all", {0: 3}, "late-reader")
    assert e.collect("all").column("bytes").to_pylist() == [3, 4]


def test_sends_and_reads_larger_than_a_frame_are_split(served, monkeypatch):
    """A send over the payload limit is staged in pieces and taken as one engine send; reads come in pieces."""
    from sparkcep.gateway import protocol

    e, c = served
    monkeypatch.setattr(protocol, "MAX_PAYLOAD", 64 << 10)
    sends = []
    real = e._take  # what the endpoint's sends and staged commits call
    monkeypatch.setattr(e, "_take", lambda stream, data, key=None: sends.append(data.num_rows) or real(stream, data, key))
    before = e.endpoint.counters["requests"]
    assert c.send("connections", _rows(20_000)) == 20_000
    assert sends == [20_000]  # one engine send
    assert e.endpoint.counters["requests"] - before > 4  # in several requests
    before = e.endpoint.counters["requests"]
    t = c.read("all", 0, 0, 20_000)
    assert t.column("bytes").to_pylist() == list(range(20_000))
    assert e.endpoint.counters["requests"] - before > 4


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
    assert c.hello()["engine"] == e.run_id  # the connection survives errors


def test_metrics_and_instance_managers(served):
    e, c = served
    c.send("connections", _rows(3))
    assert c.metrics()["sequence"] == 3
    latest = c.offsets("$metrics")["latest"]
    samples = c.read("$metrics", 0, 0, latest[0]).to_pydict()
    assert dict(zip(samples["name"], samples["value"]))["sequence"] == 3.0
    with pytest.raises(InputError) as err:
        c.register_im({"id": "x-0", "pid": 123, "cpu": 0})  # an address, not a description
    assert err.value.code == "IM_INFO"
    with pytest.raises(EngineError) as err:
        c.register_im("127.0.0.1:1")  # nothing serves there
    assert err.value.code == "WORKER_START"
    assert c.instance_managers() == []
    q = cep.Query("after")  # deployed in this process still: a failed registration leaves no trace
    q.output("copy", q.stream("connections", "ip string, ts timestamp, bytes int64").map(ip="ip"))
    e.deploy(q)
    c.send("connections", _rows(2, start=3))
    assert e.collect("copy").num_rows == 2


def test_metrics_in_wide_form(served):
    """A row per sample (``time, names, values``); the schema: ``time`` and a float64 field per metric reported now."""
    e, c = served
    c.send("connections", _rows(3))
    fields = c.schema("$metrics", form="wide")["fields"]
    assert list(fields)[:2] == ["time", "endpoint.bad_frames"] and set(fields.values()) == {"timestamp", "float64"}
    assert c.offsets("$metrics", form="wide", interval=0)["latest"] == {0: 1}
    assert c.offsets("$metrics", form="wide", interval=0)["latest"] == {0: 2}  # one row per sample
    assert c.offsets("$metrics", form="long")["latest"][0] == len(fields) - 1  # the long form: one row per metric
    wide = c.read("$metrics", 0, 0, 2, form="wide").to_pylist()
    assert [r["names"] for r in wide] == [list(fields)[1:]] * 2
    assert dict(zip(wide[1]["names"], wide[1]["values"]))["outputs.all"] == 3.0
    assert wide[0]["time"] <= wide[1]["time"]
    with pytest.raises(InputError) as err:
        c.offsets("$metrics", form="tall")
    assert err.value.code == "OPTION" and "'long' or 'wide'" in str(err.value)


def test_metric_names_are_the_readmes(served):
    """Every metric the engine reports has a row in the README's table of metric names, and every row of the
    table (but those of instance managers and the balancer: this engine has none) names some metric."""
    e, c = served
    q = cep.Query("windows")
    s = q.stream("connections", "ip string, ts timestamp, bytes int64")
    q.output("per_ip", s.filter(cep.col("bytes") >= 0, name="positive")
             .aggregate(cep.TimeWindow("1s"), by=["ip"], name="window", n=cep.count()))
    e.deploy(q, parallelism=2).migrate("window", {0: 1})
    twin = cep.Query("twin")
    twin.output("twin_out", twin.stream("connections", "ip string, ts timestamp, bytes int64")
                .aggregate(cep.TimeWindow("1s"), by=["ip"], n=cep.count()))
    e.deploy(twin, replicas=2)
    seconds = pa.table({"ip": ["a", "b"] * 5, "ts": pa.array([T0 + i * 10**6 for i in range(10)], pa.timestamp("us")),
                        "bytes": list(range(10))})
    c.send("connections", seconds)
    c.send("connections", seconds.slice(0, 1))  # late: its window closed
    names = c.read("$metrics", 0, 0, c.offsets("$metrics")["latest"][0]).column("name").to_pylist()  # one sample
    assert "late_by_stream.connections.windows.window" in names
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme.split("<!-- metric-names -->\n", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    documented = {m: _pattern(m) for row in table for m in re.findall(r"`([^`]+)`", row.split(" | ")[0])}
    assert [n for n in names if not any(p.fullmatch(n) for p in documented.values())] == []
    assert [m for m, p in documented.items()
            if not m.startswith(("instance_managers.", "balancer.", "migrations.<query>.<operator>.running.",
                                 "replication.<query>.last_"))
            and not any(p.fullmatch(n) for n in names)] == []


def _pattern(documented: str) -> re.Pattern:
    """A README metric name as a regular expression: ``<p>`` a percentile, ``<im>`` a number, ``<name>`` a name."""
    any_of = {"p": r"p[0-9.]+", "im": r"[0-9]+", "r": r"[0-9]+"}
    return re.compile(re.sub(r"<(\w+)>", lambda m: any_of.get(m[1], r"[^.]+"), re.escape(documented)))


def test_engine_option_forms(home):
    assert resolve("127.0.0.1:4000") == "127.0.0.1:4000"
    for bad, code in (("nonsense", "ENGINE_OPTION"), ("zk://127.0.0.1:2181/x", "ENGINE_OPTION")):
        with pytest.raises(EngineError) as err:
            resolve(bad)
        assert err.value.code == code


def test_abort_ends_a_handshake_a_hung_engine_never_answers():
    """A stopped engine's kernel still accepts connections, and the hello then waits for an answer that never
    comes: abort() (what a cluster client does when the registry names another data path) ends it at once."""
    import socket
    import threading
    import time

    with socket.create_server(("127.0.0.1", 0)) as hung:
        client = EngineClient(f"127.0.0.1:{hung.getsockname()[1]}", timeout=30.0, token="t" * 64)
        raised = []

        def say_hello():
            try:
                client.hello()
            except EngineNotFoundError as e:
                raised.append((time.monotonic(), e))
        thread = threading.Thread(target=say_hello)
        thread.start()
        time.sleep(0.5)  # connected, the hello sent, waiting for the answer
        aborted = time.monotonic()
        client.abort("another engine host serves at 127.0.0.1:1 now")
        thread.join(10)
        assert raised and raised[0][0] - aborted < 2.0, raised
        # it said "unreachable (hello): [Errno ...]", and a migration cut short so "closed the connection"
        assert str(raised[0][1]) == (f"engine at {client.address} stopped answering during 'hello'; another engine "
                                     "host serves at 127.0.0.1:1 now")


def test_a_client_gone_before_its_answer_ends_its_connection_quietly(served, capfd):
    """The reply to a peer that reset its connection meanwhile raised BrokenPipeError, which the endpoint took
    for a bug of its own: a traceback on stderr, and a second write to answer it INTERNAL."""
    import socket
    import struct
    import threading
    import time

    e, c = served
    dispatch, answered = e.endpoint._dispatch, threading.Event()

    def slow(header, payload):
        time.sleep(0.3)  # the client resets its connection meanwhile
        try:
            return dispatch(header, payload)
        finally:
            answered.set()
    e.endpoint._dispatch = slow
    asking = threading.Thread(target=lambda: pytest.raises(Exception, c.streams), daemon=True)
    asking.start()
    time.sleep(0.1)
    c._sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
    c.abort()
    assert answered.wait(5)
    time.sleep(0.3)  # the endpoint has written its answer by now
    e.endpoint._dispatch = dispatch
    asking.join(5)
    assert "Traceback" not in capfd.readouterr().err
    with EngineClient.connect() as again:  # and it serves on
        assert "connections" in again.streams()["inputs"]


def test_an_answer_cut_short_by_the_engine_s_death_is_an_unreachable_engine(served, monkeypatch):
    """An engine host killed while it answered a Spark task's read left a frame cut short: the client raised
    PROTOCOL, which no caller retries, and the streaming query failed where a fail-over is ridden through."""
    import socket

    from sparkcep.control.connect import retryable
    from sparkcep.gateway import endpoint, protocol

    def dying(conn, header, payload=b""):  # the head of a frame of 2,920 bytes, then the process is gone
        head = json.dumps(header).encode()
        conn.sendall(protocol._PREFIX.pack(protocol.MAGIC, protocol.VERSION, 0, len(head), 2920) + head)
        conn.shutdown(socket.SHUT_RDWR)
    monkeypatch.setattr(endpoint, "send_frame", dying)
    _, c = served
    with pytest.raises(EngineError) as err:
        c.streams()
    assert err.value.code == "ENGINE_NOT_FOUND" and retryable(err.value), err.value
    assert "connection closed after 0 of 2920 bytes" in str(err.value)
