"""Shared-memory rings: everything sent arrives once, in order, equal; a full ring holds the writer back."""

import multiprocessing as mp
import os
import random
import time

import numpy as np
import pyarrow as pa
import pytest

from sparkcep.errors import EngineError
from sparkcep.runtime.channels import (Data, Doorbell, LocalChannel, Progress, RingConsumer, RingProducer,
                                       create_ring)


@pytest.fixture
def shm(tmp_path_factory):
    d = "/dev/shm" if os.path.isdir("/dev/shm") else str(tmp_path_factory.mktemp("shm"))
    paths = []

    def make(name, capacity=1 << 16):
        path = os.path.join(d, f"sparkcep-test-{os.getpid()}-{name}")
        if os.path.exists(path):
            os.unlink(path)
        create_ring(path, capacity)
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


def test_an_abort_drops_the_epochs_backlog_and_reaches_the_reader_after_what_it_took(shm):
    path = shm("abort", 1 << 13)
    w, r = RingProducer(path), RingConsumer(path)
    b = pa.record_batch({"v": np.arange(200)})
    for i in range(30):
        w.send_data(0, (7, 7, 0), b)
    assert w.backlog_bytes > 0
    w.abort(7)
    assert not any(item[4] == 7 for item in w.backlog)
    w.send_data(0, (8, 8, 0), b)
    w.send_progress(8, 8, 0, 0)
    got = []
    while w.backlog or r.ready():
        got += [(m.epoch, type(m).__name__) for m in drain(r)]
        w.flush()
    kinds = [k for _, k in got]
    assert kinds.index("Abort") == len([g for g in got if g == (7, "Data")])  # every epoch-7 batch before it
    assert got[-2:] == [(8, "Data"), (8, "Progress")]
    assert (7, "Progress") not in got


def test_data_never_takes_the_control_reserve(shm):
    path = shm("reserve", 1 << 13)
    w, r = RingProducer(path), RingConsumer(path)
    b = pa.record_batch({"v": np.arange(100)})
    while not w.backlog:  # the ring is full for data
        w.send_data(0, (1, 1, 0), b)
    w.abort(1)  # the data left in the backlog goes, the abort fits at once
    assert w.backlog_bytes == 0
    w.send_progress(2, 1, 0, 0)
    assert w.backlog_bytes == 0
    kinds = [type(m).__name__ for m in drain(r)]
    assert kinds[-2:] == ["Abort", "Progress"] and set(kinds[:-2]) == {"Data"}


def test_a_full_ring_keeps_the_rest_in_the_backlog_and_loses_nothing(shm):
    path = shm("full", 1 << 13)
    w, r = RingProducer(path), RingConsumer(path)
    b = pa.record_batch({"v": np.arange(200)})
    for i in range(50):
        w.send_data(0, (i, i, 0), b)
    assert w.backlog_bytes > 0
    assert r.queued_bytes <= 1 << 13
    got = 0
    while w.backlog or r.ready():
        got += sum(m.batch.num_rows for m in drain(r) if isinstance(m, Data))
        w.flush()
    assert got == 50 * 200


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


def _slow_reader(path, bell_path, delay, out):
    r = RingConsumer(path)
    rows, epochs = 0, []
    while True:
        m = r.receive()
        if m is None:
            time.sleep(0.001)
            continue
        if isinstance(m, Progress):
            if m.epoch < 0:
                break
            epochs.append(m.epoch)
            continue
        rows += m.batch.num_rows
        time.sleep(delay)
    out.put((rows, epochs))


def test_a_slow_reader_process_slows_the_writer_and_nothing_is_lost(shm, tmp_path):
    """Back-pressure between processes: the writer blocks in flush_blocking, sleeping on its doorbell."""
    path = shm("slow", 1 << 14)
    bell = Doorbell.create(str(tmp_path / "writer-bell"))
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    p = ctx.Process(target=_slow_reader, args=(path, bell.path, 0.01, out), daemon=True)
    p.start()
    try:
        w = RingProducer(path, bell)
        b = pa.record_batch({"v": np.arange(256)})  # ~2 KiB: the ring holds about 7
        t0 = time.monotonic()
        for i in range(60):
            w.send_data(0, (i, i, 0), b)
            w.send_progress(i, i, i, 0)
            w.flush_blocking(20)
            assert w.ring.used() <= w.ring.capacity  # memory stays bounded by the ring
            assert w.backlog_bytes == 0
        w.send_progress(-1, 0, 0, 0)
        w.flush_blocking(20)
        elapsed = time.monotonic() - t0
        rows, epochs = out.get(timeout=30)
    finally:
        p.join(5)
        if p.is_alive():
            p.kill()
        bell.close(unlink=True)
    assert rows == 60 * 256 and epochs == list(range(60))
    # 60 batches at >= 10 ms each, of which at most ~8 fit the ring: the writer waited for the reader
    assert elapsed >= 0.4, elapsed
