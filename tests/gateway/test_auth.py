"""Only the engine's owner can use its endpoint: a token in private files, proved by every connection.

The raw-socket tests speak the handshake and the frame format by hand, as
any other process of the machine could.
"""

from __future__ import annotations

import json
import logging
import socket
import stat
import struct
import time

import pyarrow as pa
import pytest

import sparkcep as cep
from sparkcep import auth
from sparkcep.gateway import discovery, protocol
from sparkcep.gateway.client import EngineClient, find_token
from sparkcep.runtime.channels import hello

T0 = 1_704_067_200_000_000
PREFIX = struct.Struct(">2sBBIQ")


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCEP_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SPARKCEP_TOKEN_FILE", raising=False)
    return tmp_path / "home"


@pytest.fixture
def served(home):
    q = cep.Query("demo")
    s = q.stream("connections", "ip string, ts timestamp, bytes int64")
    q.output("all", s.map(ip="ip", ts="ts", bytes="bytes"))
    with cep.Engine.local() as e:
        e.deploy(q)
        e.send("connections", pa.table({"ip": ["a", "b"], "ts": pa.array([T0, T0 + 1], pa.timestamp("us")),
                                        "bytes": [1, 2]}))
        yield e


def _raw(address: str, header: dict, payload_size: int = 0, token: str | None = None) -> tuple[dict | None, bool]:
    """Send one hand-made frame, after the handshake if ``token`` is given; the reply (the frame's header, or
    the handshake's refusal) and whether the endpoint then hung up."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        if token is not None:
            assert hello.greet(s, {"role": hello.CLIENT}, token, time.monotonic() + 10, address)["ok"]
        head = json.dumps(header).encode()
        s.sendall(PREFIX.pack(b"UC", protocol.VERSION, 0, len(head), payload_size) + head)
        reply = protocol.recv_frame(s)[0] if token is not None else hello.read_frame(s, time.monotonic() + 10)
        try:
            closed = s.recv(1) == b""
        except ConnectionResetError:  # closed with bytes of ours unread
            closed = True
    return reply, closed


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_local_json_and_token_are_private(served, home):
    token_path = discovery.token_file(served.endpoint.address)
    assert _mode(home) == 0o700
    assert _mode(home / "local.json") == 0o600
    assert _mode(token_path) == 0o600
    token = auth.read(token_path)
    assert len(token) == 2 * auth.TOKEN_BYTES and int(token, 16) >= 0
    assert json.loads((home / "local.json").read_text())["token_file"] == str(token_path)
    assert token not in (home / "local.json").read_text()


def test_unauthenticated_commit_and_end_are_refused_counted_and_logged_once(served, caplog):
    """A raw `commit` released every retained row, a raw `end` broke the owner's next send (issue 16):
    now a connection that does not prove the token is refused before any frame of it is read."""
    address = served.endpoint.address
    caplog.set_level(logging.WARNING, logger="sparkcep.runtime.channels.hello")
    requests = [{"op": "commit", "stream": "all", "positions": {"0": 2}, "consumer": "intruder"},
                {"op": "end", "stream": "connections", "token": "0" * 64},
                {"op": "commit", "stream": "all", "positions": {"0": 2}, "token": None}]
    for header in requests:
        reply, closed = _raw(address, header)
        assert reply["ok"] is False and "hello" in reply["error"]
        assert closed
    with pytest.raises(auth.AuthError) as err:  # a handshake with another token: neither side trusts the other
        EngineClient(address, token="0" * 64).hello()
    assert err.value.code == "UNAUTHENTICATED"
    deadline = time.monotonic() + 5  # the endpoint's thread counts it once it saw the connection close
    while served.endpoint.counters["unauthenticated"] < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert served.endpoint.counters["unauthenticated"] == 4
    assert served.collect("all").num_rows == 2  # nothing released
    assert served.send("connections", pa.table({"ip": ["c"], "ts": pa.array([T0 + 2], pa.timestamp("us")),
                                                "bytes": [3]})) == 1  # the stream did not end
    refusals = [r for r in caplog.records if "refused a connection" in r.getMessage()]
    assert len(refusals) == 1 and "127.0.0.1" in refusals[0].getMessage(), [(r.name, r.getMessage()) for r in refusals]


def test_oversized_frames_are_refused_before_allocating(served):
    address = served.endpoint.address
    token = auth.read(discovery.token_file(address))
    reply, closed = _raw(address, {"op": "send", "stream": "connections"}, payload_size=1 << 62, token=token)
    assert reply["error"]["code"] == "FRAME_TOO_LARGE" and f"{protocol.MAX_PAYLOAD:,}" in reply["error"]["message"]
    assert closed
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:  # a header length of 4 GiB - 1
        assert hello.greet(s, {"role": hello.CLIENT}, token, time.monotonic() + 10, address)["ok"]
        s.sendall(PREFIX.pack(b"UC", protocol.VERSION, 0, (1 << 32) - 1, 0))
        assert protocol.recv_frame(s)[0]["error"]["code"] == "FRAME_TOO_LARGE"
    assert served.endpoint.counters["bad_frames"] == 2
    with EngineClient(address) as c:  # the client refuses to send one itself
        with pytest.raises(protocol.ProtocolError) as err:
            c.request("hello", b"x" * (protocol.MAX_PAYLOAD + 1))
        assert err.value.code == "FRAME_TOO_LARGE"
        assert c.hello()["engine"] == served.run_id


def test_client_finds_the_token_or_says_where_it_looked(served, home, tmp_path, monkeypatch):
    address = served.endpoint.address
    token = auth.read(discovery.token_file(address))
    assert find_token(address) == token  # the engine's own file, found by address
    elsewhere = auth.write(tmp_path / "copied.token", token)
    assert find_token("10.0.0.1:7077", str(elsewhere)) == token  # an explicit file (Spark option tokenFile)
    with pytest.raises(auth.AuthError) as err:
        find_token("10.0.0.1:7077")
    assert err.value.code == "TOKEN_NOT_FOUND" and "tokenFile" in str(err.value)
    monkeypatch.setenv("SPARKCEP_TOKEN_FILE", str(elsewhere))
    assert find_token("10.0.0.1:7077") == token
    with pytest.raises(auth.AuthError) as err:
        EngineClient(address, token="f" * 64).hello()
    assert err.value.code == "UNAUTHENTICATED"
    with EngineClient(address, token=token) as c:
        assert c.hello()["engine"] == served.run_id


def test_token_helpers():
    t = auth.generate()
    assert auth.check(t, t) and not auth.check(t, t[:-1] + "x") and not auth.check(t, None)
    assert not auth.check(t, 42) and not auth.check(t, "é" * 64)
    assert auth.generate() != t
