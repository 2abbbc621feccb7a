"""What every channel implementation must do, whatever carries its bytes.

Each test runs once per implementation in ``KINDS``: the shared-memory
ring and the TCP channel. A third implementation is one more entry there:
a description of one channel (forked processes inherit it) whose ``producer()`` and
``consumer()`` open its ends in whichever process calls them (both may block
until the other end arrives), ``pair()`` opens both here, ``capacity`` is
the bytes it holds at most.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import select
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkcep import auth
from sparkcep.runtime.channels import (Abort, ChannelClosed, Configure, Data, Doorbell, Gate, Progress, RingConsumer,
                                       RingProducer, TcpConsumer, create_ring, ring, tcp)

END = 1 << 40  # the epoch of a progress record that says "that was all"


class RingChannel:
    """A shared-memory ring, its consumer's doorbell and its producer's."""

    def __init__(self, d, n: int, capacity: int):
        self.capacity = capacity
        self.path = os.path.join(d, f"ring-{n}")
        self.bells = [Doorbell.create(os.path.join(d, f"ring-{n}-{who}.bell")).path for who in ("c", "p")]
        create_ring(self.path, capacity, self.bells[0])

    def producer(self):
        return RingProducer(self.path, Doorbell(self.bells[1]))

    def consumer(self):
        return RingConsumer(self.path, Doorbell(self.bells[0]))

    def pair(self):
        return self.producer(), self.consumer()

    def close(self):
        for path in (self.path, *self.bells):
            ring.unlink_quietly(path)


class TcpChannel:
    """A TCP channel whose consumer listens, as an instance manager's service does."""

    def __init__(self, d, n: int, capacity: int):
        self.capacity = min(capacity, tcp.kernel_capacity() or capacity)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(10)
        self.address = f"tcp:127.0.0.1:{self.listener.getsockname()[1]}/ch{n}"
        self.token = auth.generate()

    def producer(self):
        return tcp.connect(self.address, "producer", self.token, capacity=self.capacity)

    def consumer(self):
        sock, _ = self.listener.accept()
        end = TcpConsumer(self.address.rpartition("/")[2])
        end.attach(Gate(self.token).accept(sock))
        return end

    def pair(self):
        with ThreadPoolExecutor(1) as connecting:
            producer = connecting.submit(self.producer)
            consumer = self.consumer()
            return producer.result(10), consumer

    def close(self):
        self.listener.close()


KINDS = {"ring": RingChannel, "tcp": TcpChannel}


@pytest.fixture(params=sorted(KINDS))
def channel(request, tmp_path):
    """``channel(capacity)``: a new channel of the implementation under test."""
    made = []

    def make(capacity: int = 1 << 14):
        made.append(KINDS[request.param](str(tmp_path), len(made), capacity))
        return made[-1]
    yield make
    for ch in made:
        ch.close()


@contextmanager
def running(target, *args):
    """A forked process running ``target(*args)``, killed and reaped on the way out."""
    p = mp.get_context("fork").Process(target=target, args=args, daemon=True)
    p.start()
    try:
        yield p
    finally:
        if p.is_alive():
            p.kill()
        p.join(5)


def ints(n: int, start: int = 0) -> pa.RecordBatch:
    v = np.arange(start, start + n, dtype=np.int64)
    return pa.record_batch({"v": v, "w": v * 3})


def pump(w, r, until, seconds: float = 10.0) -> list:
    """Flush ``w`` and receive from ``r`` until ``until(messages)``; the messages."""
    got, deadline = [], time.monotonic() + seconds
    while not until(got):
        assert time.monotonic() < deadline, f"only {len(got)} messages after {seconds} s"
        w.flush()
        while (m := r.receive()) is not None:
            got.append(m)
    return got


def ends_with(epoch):
    return lambda got: bool(got) and isinstance(got[-1], Progress) and got[-1].epoch == epoch


# --- order -------------------------------------------------------------------------------------------

def _batch(i: int, rows: int, wide: bool) -> pa.RecordBatch:
    """Send number ``i``: ``rows`` rows; ``wide`` ones carry strings larger than half a 16 KiB channel."""
    text = [("x" if wide else "y") * ((9000 if wide else 5) + k) for k in range(rows)]
    return pa.record_batch({"i": pa.array([i] * rows, pa.int64()), "v": np.arange(rows, dtype=np.int64),
                            "s": pa.array(text, pa.string())})


OPS = st.one_of(
    st.tuples(st.just("data"), st.integers(0, 2), st.integers(1, 400), st.just(False)),
    st.tuples(st.just("wide"), st.integers(0, 2), st.integers(1, 3), st.just(True)),
    st.tuples(st.just("progress")), st.tuples(st.just("abort")), st.tuples(st.just("control")),
    st.tuples(st.just("flush")), st.tuples(st.just("drain"), st.integers(1, 20)),
)


def test_an_abort_in_the_middle_of_a_fragmented_record_drops_its_fragments(channel):
    """A record cut into fragments, only some of them taken when its epoch aborts: the consumer drops
    those it has, and the next fragmented record arrives whole and alone."""
    ch = channel(1 << 14)
    w, r = ch.pair()
    try:
        huge = pa.record_batch({"i": [0], "v": [0], "s": ["z" * 40_000]})  # one row larger than the channel
        w.send_data(0, (0, 0, 0), huge)
        assert r.receive() is None  # the fragments that fitted: nothing whole yet
        w.abort(0)  # the other fragments never go
        second = _batch(1, 1, True)
        w.send_data(0, (1, 10, 1), second)
        w.send_progress(1, 10, -1, 7)
        got = pump(w, r, ends_with(1))
    finally:
        r.close()
        w.close()
    assert [type(m).__name__ for m in got] == ["Abort", "Data", "Progress"]
    assert got[1].batch.equals(second)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(OPS, min_size=1, max_size=40))
def test_any_sequence_arrives_in_order_and_equal(channel, ops):
    """Data, progress, aborts and control records in any interleaving with partial draining, through
    wraps and fragments: non-data records all arrive, in order; data arrives whole and in order, except
    what an abort dropped of its epoch (a prefix of the epoch's sends, all before the Abort)."""
    ch = channel(1 << 14)
    w, r = ch.pair()
    try:
        epoch, sent, got, aborted = 0, [], [], set()
        for op in ops:
            if op[0] in ("data", "wide"):
                b = _batch(len(sent), op[2], op[3])
                w.send_data(op[1], (epoch, 10 * epoch, len(sent)), b)
                sent.append(("data", len(sent), op[1], epoch, b))
            elif op[0] == "progress":
                w.send_progress(epoch, 10 * epoch, -epoch, 7)
                sent.append(("progress", epoch))
                epoch += 1
            elif op[0] == "abort":
                w.abort(epoch)
                sent.append(("abort", epoch))
                aborted.add(epoch)
                epoch += 1
            elif op[0] == "control":
                w.send_control(Configure(epoch, len(sent), "agg", [0, 1], [len(sent) % 3, 1]))
                sent.append(("control", len(sent)))
            elif op[0] == "flush":
                w.flush()
            else:
                for _ in range(op[1]):
                    if (m := r.receive()) is None:
                        break
                    got.append(m)
        w.send_progress(END, 0, 0, 0)
        got += pump(w, r, ends_with(END))
    finally:
        r.close()
        w.close()

    events, pieces = [], {}
    for m in got[:-1]:
        if isinstance(m, Data):
            i = m.batch.column("i")[0].as_py()
            assert m.batch.column("i").to_pylist() == [i] * m.batch.num_rows
            if not events or events[-1][:2] != ("data", i):
                events.append(("data", i, m.port, m.epoch))
                assert (m.frontier, m.arrival) == (10 * m.epoch, i)
            pieces.setdefault(i, []).append(m.batch)
        elif isinstance(m, Progress):
            assert (m.frontier, m.watermark, m.arrival) == (10 * m.epoch, -m.epoch, 7)
            events.append(("progress", m.epoch))
        elif isinstance(m, Abort):
            events.append(("abort", m.epoch))
        else:
            assert isinstance(m, Configure) and m.bins == [0, 1] and m.owners == [m.number % 3, 1] and m.operator == "agg"
            events.append(("control", m.number))
    expected = [s[:4] for s in sent]
    assert [e for e in events if e[0] != "data"] == [e for e in expected if e[0] != "data"]
    it = iter(expected)  # every event in the order sent, none twice
    assert all(e in it for e in events), (events, expected)
    for kind, i, port, ep, b in (s for s in sent if s[0] == "data"):
        whole = pa.Table.from_batches([b])
        if ep not in aborted:
            assert ("data", i, port, ep) in events
        if i in pieces:
            received = pa.Table.from_batches(pieces[i])
            assert received.equals(whole if ep not in aborted else whole.slice(0, received.num_rows))


# --- bounded back-pressure ---------------------------------------------------------------------------

def test_a_consumer_that_takes_nothing_holds_its_producer_to_the_capacity(channel):
    """The channel takes at most its capacity; the rest waits in the producer's backlog, nothing is lost."""
    ch = channel(1 << 16)
    w, r = ch.pair()
    try:
        sends, rows = 200, 256  # 400 KiB of int64
        for i in range(sends):
            w.send_data(0, (i, i, 0), ints(rows))
            w.flush()
        assert w.backlog_bytes > 0
        taken, deadline = 0, time.monotonic() + 0.3  # what the channel holds, the producer not flushing again
        while time.monotonic() < deadline:
            if (m := r.receive()) is not None:
                taken += m.batch.num_rows
        assert 0 < taken * 16 <= ch.capacity, (taken, ch.capacity)
        w.send_progress(END, 0, 0, 0)
        got = pump(w, r, ends_with(END))
        assert taken + sum(m.batch.num_rows for m in got if isinstance(m, Data)) == sends * rows
    finally:
        r.close()
        w.close()


def _slow_consumer(ch, delay, out):
    r = ch.consumer()
    rows, epochs = 0, []
    while True:
        m = r.receive()
        if m is None:
            time.sleep(0.001)
        elif isinstance(m, Progress):
            if m.epoch == END:
                break
            epochs.append(m.epoch)
        else:
            rows += m.batch.num_rows
            time.sleep(delay)
    out.put((rows, epochs))
    r.close()


def test_a_slow_consumer_process_slows_its_producer_and_nothing_is_lost(channel):
    """A consumer taking 10 ms per batch: the producer waits in flush_blocking, its backlog empty after
    each; an unbounded channel would let it finish at once."""
    ch = channel(1 << 14)
    out = mp.get_context("fork").Queue()
    with running(_slow_consumer, ch, 0.01, out):
        w = ch.producer()
        b = ints(256)  # ~2 KiB: the channel holds about 7
        t0 = time.monotonic()
        for i in range(60):
            w.send_data(0, (i, i, 0), b)
            w.send_progress(i, i, i, 0)
            w.flush_blocking(20)
            assert w.backlog_bytes == 0
        w.send_progress(END, 0, 0, 0)
        w.flush_blocking(20)
        elapsed = time.monotonic() - t0
        rows, epochs = out.get(timeout=30)
        w.close()
    assert rows == 60 * 256 and epochs == list(range(60))
    assert elapsed >= 0.4, elapsed  # >= 52 batches beyond the ~8 the channel holds, 10 ms each


# --- wake-ups -----------------------------------------------------------------------------------------

def _send_when_told(ch, go, done):
    w = ch.producer()
    go.wait(10)
    time.sleep(0.2)
    w.send_data(0, (1, 1, 0), ints(10))
    w.flush_blocking(5)
    done.wait(10)  # stay: a producer leaving would wake the consumer too


def test_a_sleeping_consumer_is_woken_by_a_send(channel):
    ch = channel()
    ctx = mp.get_context("fork")
    go, done = ctx.Event(), ctx.Event()
    with running(_send_when_told, ch, go, done):
        r = ch.consumer()
        r.sleep_flag(True)
        assert not r.ready()
        go.set()
        t0 = time.monotonic()
        woken, _, _ = select.select([r.fileno()], [], [], 5)
        slept = time.monotonic() - t0
        r.sleep_flag(False)
        deadline = time.monotonic() + 2
        while (m := r.receive()) is None and time.monotonic() < deadline:
            pass
        done.set()
        r.close()
    assert woken and 0.15 < slept < 2, slept
    assert isinstance(m, Data) and m.batch.equals(ints(10))


def _consume_when_told(ch, go, done):
    r = ch.consumer()
    go.wait(10)
    time.sleep(0.3)
    while not done.is_set():
        if r.receive() is None:
            time.sleep(0.001)


def test_a_producer_waiting_for_room_is_woken_by_consumption(channel):
    ch = channel()
    ctx = mp.get_context("fork")
    go, done = ctx.Event(), ctx.Event()
    with running(_consume_when_told, ch, go, done):
        w = ch.producer()
        for i in range(100):
            w.send_data(0, (i, i, 0), ints(256))
            w.flush()
        assert w.backlog_bytes > 0
        go.set()
        t0 = time.monotonic()
        w.wait_writable(5)  # sleeps until the consumer makes room
        woken = time.monotonic() - t0
        w.flush_blocking(5)
        w.close()
        done.set()
    assert 0.2 < woken < 2, woken


# --- close and death ----------------------------------------------------------------------------------

def _send_and_close(ch, n):
    w = ch.producer()
    for i in range(n):
        w.send_data(i % 2, (i, i, 0), ints(100, i))
        w.send_progress(i, i, i, 0)
    w.flush_blocking(10)
    w.close()


def test_everything_sent_before_close_is_received_then_the_channel_is_closed(channel):
    ch = channel()
    with running(_send_and_close, ch, 50) as p:
        r = ch.consumer()
        got, deadline = [], time.monotonic() + 10
        while not r.closed:
            assert time.monotonic() < deadline
            if (m := r.receive()) is not None:
                got.append(m)
        p.join(5)
        assert r.receive() is None and not r.ready()
        r.close()
    assert [m.epoch for m in got if isinstance(m, Progress)] == list(range(50))
    epochs = [m.epoch for m in got]
    assert epochs == sorted(epochs)
    for i in range(50):
        data = [m for m in got if isinstance(m, Data) and m.epoch == i]
        assert {m.port for m in data} == {i % 2}
        assert pa.Table.from_batches([m.batch for m in data]).equals(pa.Table.from_batches([ints(100, i)]))


def _send_forever(ch):
    w = ch.producer()
    b = ints(40_000)  # ~640 KB: several records of a 256 KiB channel
    i = 0
    while True:
        w.send_data(0, (i, i, 0), b)
        w.flush_blocking(30)
        i += 1


def test_a_producer_killed_mid_batch_leaves_whole_messages_then_channel_closed(channel):
    ch = channel(1 << 18)
    with running(_send_forever, ch) as p:
        r = ch.consumer()
        taken, deadline = 0, time.monotonic() + 10
        while taken < 100_000:  # the producer is mid-stream, waiting for room
            assert time.monotonic() < deadline
            if (m := r.receive()) is not None:
                taken += m.batch.num_rows
        os.kill(p.pid, signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(ChannelClosed) as e:
            while time.monotonic() < killed + 5:
                m = r.receive()
                if m is None:
                    time.sleep(0.001)
                    continue
                v = m.batch.column("v").to_numpy()  # a whole slice of the batch, nothing torn
                assert v[0] >= 0 and v[-1] < 40_000 and np.array_equal(v, np.arange(v[0], v[0] + len(v)))
                assert np.array_equal(m.batch.column("w").to_numpy(), v * 3)
        noticed = time.monotonic() - killed
        r.close()
    assert e.value.code == "PEER_DIED"
    assert noticed < 1.0, noticed


def _consume_slowly(ch, started):
    r = ch.consumer()
    while True:
        if r.receive() is None:
            time.sleep(0.001)
        else:
            started.set()
            time.sleep(0.005)


def test_a_killed_consumer_makes_its_producer_raise_instead_of_waiting(channel):
    ch = channel()
    started = mp.get_context("fork").Event()
    with running(_consume_slowly, ch, started) as p:
        w = ch.producer()
        with pytest.raises(ChannelClosed) as e:
            i, killed, deadline = 0, None, time.monotonic() + 10
            while time.monotonic() < (deadline if killed is None else killed + 5):
                w.send_data(0, (i, i, 0), ints(256))
                w.flush_blocking(10)
                i += 1
                if killed is None and started.is_set():
                    os.kill(p.pid, signal.SIGKILL)
                    killed = time.monotonic()
        noticed = time.monotonic() - killed
        w.close()
    assert e.value.code == "PEER_DIED"
    assert noticed < 2.0, noticed


# --- abort and the control reserve --------------------------------------------------------------------

def test_an_abort_drops_the_epochs_backlog_and_follows_what_was_taken(channel):
    ch = channel(1 << 13)
    w, r = ch.pair()
    try:
        b = ints(200)
        for _ in range(30):
            w.send_data(0, (7, 7, 0), b)
        assert w.backlog_bytes > 0
        w.abort(7)
        assert w.backlog_bytes == 0  # epoch 7 was all that waited; the abort itself fit
        w.send_data(0, (8, 8, 0), b)
        w.send_progress(8, 8, 0, 0)
        got = [(m.epoch, type(m).__name__) for m in pump(w, r, ends_with(8))]
    finally:
        r.close()
        w.close()
    taken = got.index((7, "Abort"))
    assert 0 < taken and got[:taken] == [(7, "Data")] * taken
    after = got[taken + 1:]
    assert after == [(8, "Data")] * (len(after) - 1) + [(8, "Progress")] and len(after) > 1


@pytest.mark.parametrize("capacity", [1 << 13, 16 << 20], ids=["8KiB", "16MiB"])
def test_progress_abort_and_control_fit_when_data_filled_the_channel(channel, capacity):
    """Once data took all the channel gives it, progress, aborts and control records still go through at
    once: an epoch whose data is in can always be closed."""
    ch = channel(capacity)
    w, r = ch.pair()
    try:
        for epoch, b in ((1, ints(max(ch.capacity // 256, 64))), (2, ints(1))):  # large batches, then 1-row ones
            while w.backlog_bytes == 0:  # until the channel refuses data
                w.send_data(0, (epoch, epoch, 0), b)
            w.abort(epoch)  # the refused batch goes, the abort fits
            assert w.backlog_bytes == 0
        for epoch in range(3, 13):  # more than what is left beside the last 1-row batch
            w.send_progress(epoch, epoch, 0, 0)
        w.send_control(Configure(13, 1, "agg", [0], [0]))
        assert w.backlog_bytes == 0 and w.flush()
        got = [type(m).__name__ for m in pump(w, r, lambda got: bool(got) and isinstance(got[-1], Configure))]
    finally:
        r.close()
        w.close()
    first = got.index("Abort")
    second = got.index("Abort", first + 1)
    assert set(got[:first]) == set(got[first + 1:second]) | {"Data"} == {"Data"}
    assert got[second:] == ["Abort"] + ["Progress"] * 10 + ["Configure"]
