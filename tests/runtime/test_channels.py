"""What is particular to one channel implementation.

Rings: zero-copy batches, batches cut to fit, rows larger than the ring in
fragments, batches that wait as they are. Network channels: the hello and
its refusals, addresses, ends created before their peers connect. What every
implementation must do (order, back-pressure, wake-ups, close, death, abort,
the control reserve) is in test_channel_conformance.py.
"""

import json
import logging
import os
import random
import socket
import struct
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pytest

import sparkcep as cep
from sparkcep import auth
from sparkcep.core import columns
from sparkcep.errors import EngineError
from sparkcep.query.planner import plan
from sparkcep.runtime.channels import (ChannelClosed, Configure, Data, Doorbell, Gate, LocalChannel, Progress, RingConsumer,
                                       RingProducer, TcpConsumer, TcpProducer, consumer, create_ring, hello, producer,
                                       tcp)
from sparkcep.runtime.handoff import Handoffs
from sparkcep.runtime.layout import ENGINE, Layout
from sparkcep.runtime.metrics import EpochClock
from sparkcep.runtime.wiring import host_runners, source_router


@pytest.fixture
def shm(tmp_path_factory):
    d = "/dev/shm" if os.path.isdir("/dev/shm") else str(tmp_path_factory.mktemp("shm"))
    paths = []

    def make(name, capacity=1 << 16, reader_bell=""):
        path = os.path.join(d, f"sparkcep-test-{os.getpid()}-{name}")
        if os.path.exists(path):
            os.unlink(path)
        create_ring(path, capacity, reader_bell)
        paths.append(path)
        return path
    yield make
    for p in paths:
        if os.path.exists(p):
            os.unlink(p)


def batch(rng: random.Random, n: int) -> pa.RecordBatch:
    words = ["", "a", "bb", "é", "longer string value", None]
    return pa.record_batch({
        "s": pa.array([rng.choice(words) for _ in range(n)], pa.string()),
        "v": pa.array([None if rng.random() < 0.1 else rng.randint(-9, 9) for _ in range(n)], pa.int64()),
        "x": pa.array([rng.random() for _ in range(n)], pa.float64()),
        "b": pa.array([rng.random() < 0.5 for _ in range(n)], pa.bool_()),
        "t": pa.array(np.arange(n) * 1000, pa.timestamp("us")),
    })


def drain(reader):
    """Every message available; batches copied out (a zero-copy batch dies at the next receive)."""
    out = []
    while (m := reader.receive()) is not None:
        if isinstance(m, Data):
            owned = pa.ipc.read_record_batch(m.batch.serialize(), m.batch.schema)
            m = Data(m.port, m.epoch, m.frontier, m.arrival, pa.Table.from_batches([owned]))
        out.append(m)
    return out


def test_a_doorbell_sleeps_after_its_last_ringer_left(tmp_path):
    """A FIFO whose writers have all closed reads as ended: a sleeping owner must not wake at once, forever."""
    bell = Doorbell.create(str(tmp_path / "bell"))
    ringer = Doorbell(bell.path)
    ringer.ring()
    assert bell.wait(1.0) == [bell.fileno()]
    ringer.close()
    t = time.monotonic()
    assert bell.wait(0.2) == []
    assert time.monotonic() - t >= 0.15
    bell.close(unlink=True)


@pytest.mark.parametrize("copy", [True, False])
def test_messages_arrive_in_order_and_equal_through_wraps(shm, copy):
    path = shm("order", 1 << 14)
    w, r = RingProducer(path), RingConsumer(path, copy=copy)
    rng = random.Random(1)
    sent, got = [], []
    for i in range(300):
        b = batch(rng, rng.randint(1, 40))
        if rng.random() < 0.3:  # a slice: offsets into shared buffers must survive
            b = b.slice(rng.randint(0, b.num_rows - 1))
        w.send_data(i % 3, (i, 10 * i, 7), b)
        w.send_progress(i, 10 * i, -i, 7)
        sent.append((i % 3, b))
        w.flush()
        if rng.random() < 0.5:
            got += drain(r)
    while w.backlog:
        got += drain(r)
        w.flush()
    got += drain(r)
    data = [m for m in got if isinstance(m, Data)]
    progress = [m for m in got if isinstance(m, Progress)]
    assert [m.epoch for m in progress] == list(range(300))
    assert [p.watermark for p in progress] == [-i for i in range(300)]
    joined = {}
    for m in data:
        joined.setdefault(m.epoch, []).append(m)
    assert sorted(joined) == list(range(300))
    for i, (port, b) in enumerate(sent):
        parts = joined[i]
        assert {m.port for m in parts} == {port}
        assert pa.concat_tables([m.batch for m in parts]).equals(pa.Table.from_batches([b]))
    # every message came after the previous one: epochs never go back
    epochs = [m.epoch for m in got]
    assert epochs == sorted(epochs)


def test_a_batch_larger_than_the_ring_arrives_in_pieces(shm):
    path = shm("big", 1 << 14)
    w, r = RingProducer(path), RingConsumer(path)
    b = batch(random.Random(2), 5000)
    assert b.nbytes > (1 << 14)
    w.send_data(0, (1, 1, 1), b)
    pieces = []
    while w.backlog or r.ready():
        pieces += [m.batch for m in drain(r) if isinstance(m, Data)]
        w.flush()
    pieces += [m.batch for m in drain(r) if isinstance(m, Data)]
    assert len(pieces) > 1
    assert pa.concat_tables(pieces).equals(pa.Table.from_batches([b]))


@pytest.mark.parametrize("copy", [True, False])
def test_a_single_row_larger_than_the_ring_travels_in_fragments(shm, copy):
    path = shm(f"huge-{copy}", 1 << 12)
    w, r = RingProducer(path), RingConsumer(path, copy=copy)
    rows = pa.record_batch({"s": ["x" * 5000, "y" * 9000], "v": [1, 2]})
    w.send_data(0, (1, 1, 1), rows)
    w.send_progress(1, 1, 0, 0)
    got = []
    while w.backlog or r.ready():
        got += [(m.batch.to_pylist() if isinstance(m, Data) else type(m).__name__) for m in drain(r)]
        w.flush()
    assert got == [[{"s": "x" * 5000, "v": 1}], [{"s": "y" * 9000, "v": 2}], "Progress"]


@pytest.mark.parametrize("batches_stay", [False, True])
def test_a_waiting_batch_is_copied_unless_its_owner_keeps_it(shm, batches_stay):
    """A batch that may point into an input ring is copied when it must wait; the engine's sources,
    whose batches outlive the wait, let it wait as it is. Either way it arrives equal."""
    path = shm(f"stay{batches_stay}", 1 << 16)
    w, r = RingProducer(path, None, batches_stay=batches_stay), RingConsumer(path)
    b = pa.record_batch({"v": np.arange(300)})
    sent = 0
    while not w.backlog:
        w.send_data(0, (sent, sent, 0), b)
        sent += 1
    waiting = w.backlog[-1][2]
    assert (waiting is b) == batches_stay and isinstance(waiting, pa.RecordBatch) == batches_stay
    got = []
    while w.backlog or r.ready():
        got += [m.batch for m in drain(r) if isinstance(m, Data)]
        w.flush()
    assert len(got) == sent and all(t.to_batches()[0].equals(b) for t in got)


def rung(bell: Doorbell) -> int:
    """How many times ``bell`` was rung since it was last read, without waiting."""
    try:
        return len(os.read(bell.fileno(), 4096))
    except BlockingIOError:
        return 0


def test_held_wake_ups_reach_a_sleeping_consumer_once_on_release(shm, tmp_path):
    """What is written while wake-ups are held does not wake the sleeping consumer; releasing them wakes
    it once, and it finds every record."""
    bell = Doorbell.create(str(tmp_path / "bell"))
    path = shm("held", 1 << 16, bell.path)
    w, r = RingProducer(path), RingConsumer(path)
    r.sleep_flag(True)
    w.send_progress(0, 0, 0, 0)
    assert rung(bell) == 1  # not held: the first record wakes it
    r.sleep_flag(True)
    w.hold_wakes()
    w.send_data(0, (1, 3, 0), pa.record_batch({"v": np.arange(4)}))
    w.send_progress(1, 3, 0, 0)
    assert rung(bell) == 0
    w.release_wakes()
    assert rung(bell) == 1
    w.hold_wakes()
    w.release_wakes()  # nothing written meanwhile
    assert rung(bell) == 0
    assert [type(m) for m in drain(r)] == [Progress, Data, Progress]
    bell.close(unlink=True)


def test_a_fired_window_and_its_epoch_end_wake_the_sink_once(tmp_path):
    """An instance wakes a sleeping consumer once per epoch, after the epoch's end: a window's results
    and the progress that lets the engine publish them arrive together. Woken at the results, the
    engine's collector thread ran (on a busy machine, on the instance manager's core) before the
    instance wrote the progress, found the epoch still open and slept again."""
    q = cep.Query("wake")
    s = q.stream("s", "k string, t timestamp", time="t")
    q.output("out", s.aggregate(cep.TimeWindow("1s"), by="k", n=cep.count()))
    layout = Layout(plan(q), {sq.name: 1 for sq in plan(q).subqueries})
    [ep] = layout.instances()
    bell = Doorbell.create(str(tmp_path / "bell"))
    path = str(tmp_path / "ring")
    create_ring(path, 1 << 16, bell.path)
    into, sink = LocalChannel(), RingProducer(path)
    [runner] = host_runners(layout, 8, None, [ep], {(ENGINE, ep): into}, {(ep, ENGINE): sink}, EpochClock(),
                            Handoffs("test"))
    reader = RingConsumer(path)
    woken_before_end = []
    send_progress = sink.send_progress

    def recording(*args):
        woken_before_end.append(rung(bell))
        send_progress(*args)
    sink.send_progress = recording

    batch = pa.record_batch({"k": ["a", "b", "a"], "t": pa.array([0, 1_000, 2_000], pa.timestamp("us"))})
    router = source_router(layout, 8, None, {(ENGINE, ep): into})
    router.send("s", columns.stamp(batch, 0, columns.as_int64(batch.column("t")), -1), (1, 2, 0))
    router.progress(1, 2, 5_000_000, 0)  # the watermark closes the window [0 s, 1 s)
    reader.sleep_flag(True)
    while runner.poll():
        pass
    assert woken_before_end == [0]  # the results did not wake it
    assert rung(bell) == 1  # the end did, once
    got = drain(reader)
    assert [type(m) for m in got] == [Data, Progress]
    counts = got[0].batch.to_pandas().set_index("k")["n"].to_dict()
    assert counts == {"a": 2, "b": 1}
    bell.close(unlink=True)


def test_local_channel_same_interface():
    ch = LocalChannel()
    b = pa.record_batch({"v": [1, 2]})
    ch.send_data(3, (1, 2, 3), b)
    ch.send_progress(1, 2, 4, 3)
    m = ch.receive()
    assert (m.port, m.epoch, m.frontier, m.batch) == (3, 1, 2, b)
    p = ch.receive()
    assert (p.epoch, p.watermark) == (1, 4)
    assert ch.receive() is None


# --- network channels: hello, addresses, pending ends ----------------------------------------------------

@pytest.fixture
def service():
    """A listening socket, its token and gate: the part of an instance manager's service channels use."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)
    token = auth.generate()
    yield listener, f"tcp:127.0.0.1:{listener.getsockname()[1]}", token, Gate(token, timeout=2)
    listener.close()


def in_background(fn, *args, **kwargs):
    """Run ``fn`` on a thread (a connecting end waits for the service's answer); its future."""
    pool = ThreadPoolExecutor(1)
    future = pool.submit(fn, *args, **kwargs)
    pool.shutdown(wait=False)
    return future


def _raw_hello(address: str, fields: dict | bytes) -> dict:
    host, port, _ = tcp.parse_address(address)
    with socket.create_connection((host, port), 5) as sock:
        body = fields if isinstance(fields, bytes) else json.dumps(fields).encode()
        sock.sendall(struct.pack("<I", len(body)) + body)
        try:
            size = struct.unpack("<I", sock.recv(4, socket.MSG_WAITALL))[0]
            return json.loads(sock.recv(size, socket.MSG_WAITALL))
        except (struct.error, ConnectionError):
            return {}


def _raw_hello_then(address: str, fields: dict, proof) -> dict:
    """Say ``fields`` (with a nonce), then answer the service's challenge with ``proof`` (None: say nothing)."""
    host, port, _ = tcp.parse_address(address)
    with socket.create_connection((host, port), 5) as sock:
        deadline = time.monotonic() + 5
        hello.send_frame(sock, {**fields, "nonce": "0" * 32}, deadline)
        challenge = hello.read_frame(sock, deadline)
        assert set(challenge) == {"nonce", "proof"}  # the service proves itself, it never shows the token
        if proof is None:
            sock.shutdown(socket.SHUT_WR)
        else:
            hello.send_frame(sock, {"proof": proof}, deadline)
        try:
            return hello.read_frame(sock, deadline)
        except (OSError, ValueError):
            return {}


@pytest.mark.parametrize("proof", [None, "0" * 64], ids=["no proof", "a wrong proof"])
def test_a_peer_without_the_token_is_refused_logged_and_counted(service, caplog, proof):
    listener, address, right, gate = service
    reply = in_background(_raw_hello_then, f"{address}/c", {"channel": "c", "role": "producer", "capacity": 1 << 16},
                          proof)
    sock, _ = listener.accept()
    with caplog.at_level(logging.WARNING, logger="sparkcep.runtime.channels.hello"):
        with pytest.raises(auth.AuthError) as e:
            gate.accept(sock)
    assert e.value.code == "UNAUTHENTICATED" and gate.refused == 1
    if proof is not None:
        assert reply.result(10) == {"ok": False, "error": "unauthenticated"}
    assert "refused a connection from 127.0.0.1" in caplog.text
    assert right not in caplog.text
    # through connect() with another token: the service's proof fails first, the connecting side says so
    refused = in_background(tcp.connect, f"{address}/c", "producer", "wrong")
    sock, _ = listener.accept()
    with pytest.raises(auth.AuthError):
        gate.accept(sock)
    with pytest.raises(auth.AuthError) as e:
        refused.result(10)
    assert e.value.code == "UNAUTHENTICATED" and gate.refused == 2


@pytest.mark.parametrize("frame", [b"not json", b"[1, 2]", b"x" * (hello.HELLO_MAX + 1), None],
                         ids=["not JSON", "not an object", "too large", "silent"])
def test_a_malformed_or_late_hello_is_refused(service, frame):
    listener, address, token, gate = service
    host, port, _ = tcp.parse_address(f"{address}/c")
    with socket.create_connection((host, port), 5) as client:
        if frame is not None:
            client.sendall(struct.pack("<I", len(frame)) + frame[:hello.HELLO_MAX])
        sock, _ = listener.accept()
        t0 = time.monotonic()
        with pytest.raises(tcp.ChannelRefused) as e:
            gate.accept(sock)
    assert e.value.code == "CHANNEL_REFUSED" and gate.refused == 1
    assert time.monotonic() - t0 < 3  # the gate waits for a hello at most its timeout (2 s)


def test_a_hello_with_a_bad_field_is_refused(service):
    listener, address, token, gate = service
    reply = in_background(_raw_hello, f"{address}/c", {"nonce": "0" * 32, "channel": "c", "role": "reader"})
    sock, _ = listener.accept()
    with pytest.raises(tcp.ChannelRefused):
        gate.accept(sock)
    assert reply.result(10)["ok"] is False and gate.refused == 1


def test_a_service_creates_its_ends_before_the_peers_connect(service):
    """Either end may listen: here a producer and a consumer wait for their peers, data queued meanwhile."""
    listener, address, token, gate = service
    ends = {"out": TcpProducer("out", capacity=1 << 16), "in": TcpConsumer("in")}
    b = pa.record_batch({"v": np.arange(50_000)})  # more than the capacity: it waits for the peer
    ends["out"].send_data(0, (1, 1, 0), b)
    ends["out"].send_control(Configure(2, 1, "agg", [0, 1], [1, 0]))
    assert not ends["out"].flush() and ends["out"].backlog_bytes > 0
    assert ends["in"].receive() is None and not ends["in"].ready()
    assert ends["in"].fileno() is None  # nothing to wait on before the peer connects
    # the peers connect (through the factory), the service attaches each to its end
    remote_in = in_background(consumer, f"{address}/out", token=token)
    remote_out = in_background(producer, f"{address}/in", token=token, capacity=1 << 16)
    for _ in range(2):
        sock, _ = listener.accept()
        verified = gate.accept(sock)
        ends[verified.channel].attach(verified)
    remote_in, remote_out = remote_in.result(10), remote_out.result(10)
    assert remote_in.capacity == 1 << 16 and ends["in"].capacity == 1 << 16  # the producer's, told in the hello
    remote_out.send_progress(5, 5, 5, 0)
    got = []
    deadline = time.monotonic() + 10
    while {type(m).__name__ for m in got} != {"Data", "Configure", "Progress"}:
        assert time.monotonic() < deadline
        ends["out"].flush()
        remote_out.flush()
        for end in (remote_in, ends["in"]):
            if (m := end.receive()) is not None:
                got.append(m)
    data = pa.Table.from_batches([m.batch for m in got if isinstance(m, Data)])
    assert data.equals(pa.Table.from_batches([b]))
    for end in (remote_in, ends["in"], ends["out"], remote_out):
        end.close()


def test_a_hello_for_a_channel_the_service_does_not_have_is_refused(service):
    listener, address, token, gate = service
    connecting = in_background(tcp.connect, f"{address}/nope", "producer", token)
    sock, _ = listener.accept()
    gate.refuse(gate.accept(sock), "no such channel here")
    with pytest.raises(tcp.ChannelRefused, match="no such channel"):
        connecting.result(10)
    assert gate.refused == 1


def test_an_end_takes_only_a_peer_of_the_other_role_on_its_channel(service):
    listener, address, token, gate = service
    connecting = in_background(tcp.connect, f"{address}/c", "consumer", token)
    sock, _ = listener.accept()
    with pytest.raises(tcp.ChannelRefused):
        TcpConsumer("c").attach(gate.accept(sock))  # two consumers
    with pytest.raises(tcp.ChannelRefused):
        connecting.result(10)


@pytest.mark.parametrize("address,expected", [("tcp:127.0.0.1:7077/a#b", ("127.0.0.1", 7077, "a#b")),
                                              ("tcp:[::1]:80/x/y", ("::1", 80, "x/y")),
                                              ("tcp:host.example:1/c", ("host.example", 1, "c"))])
def test_addresses(address, expected):
    assert tcp.parse_address(address) == expected


@pytest.mark.parametrize("address", ["tcp:127.0.0.1:7077", "tcp:127.0.0.1/c", "tcp::1/c", "tcp:h:0/c",
                                     "tcp:h:99999/c", "tcp:h:x/c", "udp:h:1/c"])
def test_bad_addresses_say_what_is_expected(address):
    with pytest.raises(EngineError, match="tcp:HOST:PORT/CHANNEL_ID") as e:
        tcp.parse_address(address)
    assert e.value.code == "CHANNEL"


def test_the_factory_needs_a_token_for_a_network_channel():
    with pytest.raises(EngineError, match="token") as e:
        producer("tcp:127.0.0.1:1/c")
    assert e.value.code == "CHANNEL"
    with pytest.raises(EngineError, match="expected shm:<path> or tcp:"):
        consumer("ftp:x")


def test_nobody_listening_is_channel_closed_not_a_hang():
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    with pytest.raises(ChannelClosed) as e:
        tcp.connect(f"tcp:127.0.0.1:{port}/c", "producer", "t", timeout=2)
    assert e.value.code == "CHANNEL_UNREACHABLE"
