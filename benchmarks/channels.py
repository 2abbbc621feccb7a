"""Moving Arrow batches between two pinned processes: every transport on the same batches, in one run.

    python benchmarks/channels.py [--runs 5] [--mb 256] [--rtt 2000] [--tcp-capacity BYTES]

Transports (the producer pinned to one core, the consumer process to another):

* ``ring``: sparkcep's shared-memory ring (:mod:`sparkcep.runtime.channels.ring`), 16 MiB;
* ``tcp channel``: sparkcep's network channel (:mod:`sparkcep.runtime.channels.tcp`) on
  loopback, the capacity printed (its default, at most what the kernel's send buffer holds);
* ``IPC/socket``: Arrow IPC messages over a plain TCP socket, length-prefixed, blocking
  sockets, received straight into Arrow buffers: the floor under any TCP channel;
* ``Flight DoPut`` / ``Flight DoExchange``: ``pyarrow.flight`` on loopback (gRPC);
* ``memcpy``: numpy copying the same bytes inside one process (the ceiling).

Batches: 64K rows x 3 int64 columns, and 16K HiBench-like rows (a ~12-byte
IP key, a ~190-byte string value, an int64 time). Throughput is rows/s and
GB/s of Arrow buffer bytes, from the first send to the consumer's count of
the last row; each figure is the median of ``--runs`` runs of ~``--mb`` MB,
with the minimum and maximum beside it (the runs of all transports are
interleaved, so a noisy neighbour hits them alike). The round trip is a
1-row batch there and back (percentiles over ``--rtt`` trips; Flight DoPut
answers with metadata, having no batch stream back).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import select
import socket
import statistics
import struct
import sys
import tempfile
import time
from abc import ABC, abstractmethod
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

try:
    from sparkcep import auth
except ModuleNotFoundError:  # run from a source checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from sparkcep import auth

from sparkcep.arguments import bounded
from sparkcep.runtime.channels import (ChannelClosed, Data, Doorbell, Progress, RingConsumer, RingProducer,
                                       create_ring, tcp)

END = -1  # epoch of the Progress that ends a throughput run
COUNT, ECHO = 0, 1  # ports: count the rows / send the batch back
MSG = struct.Struct("<qi")  # IPC/socket framing: message length (-1: end of run), port (-1: a schema)
MAX_RUNS = 100
MAX_MB = 1 << 16  # per throughput run (the same batch sent again and again): 64 GiB, a minute or so a transport
MAX_RTT = 10 ** 6  # round trips per transport


def pin(core: int) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[core % len(cpus)]})


def int_batch(rows: int = 65_536) -> pa.RecordBatch:
    return pa.record_batch({c: np.arange(rows, dtype=np.int64) * (i + 1) for i, c in enumerate("abc")})


def hibench_batch(rows: int = 16_384) -> pa.RecordBatch:
    """Rows like HiBench's uservisits records: an IP key, a comma-separated value of ~190 bytes, a time."""
    rng = np.random.default_rng(0)
    ips = np.char.add(np.char.add("10.0.", rng.integers(0, 256, rows).astype(str)),
                      np.char.add(".", rng.integers(0, 256, rows).astype(str)))
    offsets = np.zeros(rows + 1, np.int32)
    np.cumsum(rng.integers(170, 210, rows), out=offsets[1:])
    text = rng.integers(97, 123, int(offsets[-1]), dtype=np.uint8)
    text[rng.integers(0, len(text), len(text) // 12)] = ord(",")
    value = pa.StringArray.from_buffers(rows, pa.py_buffer(offsets), pa.py_buffer(text))
    return pa.record_batch({"key": pa.array(ips, pa.string()), "value": value,
                            "ts": pa.array(np.arange(rows, dtype=np.int64) * 1000)})


def sleep_on(end, timeout: float) -> None:
    """Sleep until the consumer ``end`` may have a message: on a ring's doorbell, or on the socket."""
    end.sleep_flag(True)
    try:
        if not end.ready():
            if isinstance(end, RingConsumer):
                end.bell.wait(timeout)
            else:
                select.select([end], [], [], timeout)
    finally:
        end.sleep_flag(False)


# --- consumers: one pinned process per transport, serving all its runs ------------------------------

def _channel_consumer(open_ends, done) -> None:
    """Count rows until Progress(END), then report them; send port-ECHO batches back."""
    pin(1)
    inbound, back = open_ends()
    rows = 0
    while not inbound.closed:
        m = inbound.receive()
        if m is None:
            sleep_on(inbound, 0.05)
        elif isinstance(m, Data) and m.port == ECHO:
            back.send_data(ECHO, (m.epoch, 0, 0), m.batch)
            back.flush_blocking(30)
        elif isinstance(m, Data):
            rows += m.batch.num_rows
        elif isinstance(m, Progress) and m.epoch == END:
            done.send(rows)
            rows = 0


def _ring_ends(forward: str, backward: str, bell: str):
    """The consumer's ends of the ring pair: it reads ``forward`` and writes ``backward``."""
    return RingConsumer(forward, Doorbell(bell), copy=False), RingProducer(backward, Doorbell(bell))


def _tcp_ends(port: int, token: str, ready):
    """The consumer's ends of the TCP pair, as a service makes them: created first, attached on hello."""
    listener = socket.create_server(("127.0.0.1", port))
    ready.send(True)
    gate = tcp.Gate(token)
    ends = {"forward": tcp.TcpConsumer("forward", copy=False), "back": tcp.TcpProducer("back")}
    for _ in range(2):
        sock, _ = listener.accept()
        hello = gate.accept(sock)
        ends[hello.channel].attach(hello)
    listener.close()
    return ends["forward"], ends["back"]


def _socket_consumer(port: int, ready) -> None:
    """IPC messages over a blocking socket: count them, echo them, or report the count at the end of a run."""
    pin(1)
    listener = socket.create_server(("127.0.0.1", port))
    ready.send(True)
    sock, _ = listener.accept()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    schema, rows, head = None, 0, bytearray(MSG.size)
    while sock.recv_into(head, MSG.size, socket.MSG_WAITALL) == MSG.size:
        size, port = MSG.unpack(head)
        if size < 0:
            sock.sendall(MSG.pack(rows, 0))
            rows = 0
            continue
        body = pa.allocate_buffer(size)
        view, got = memoryview(body), 0
        while got < size:
            got += sock.recv_into(view[got:], size - got)
        if port < 0:
            schema = pa.ipc.read_schema(body)
        elif port == ECHO:
            sock.sendmsg([MSG.pack(size, ECHO), body])
        else:
            rows += pa.ipc.read_record_batch(body, schema).num_rows


class _FlightServer(flight.FlightServerBase):
    """DoPut and DoExchange with the command ``count`` (rows of the stream) or ``echo``."""

    def do_put(self, context, descriptor, reader, writer):
        if descriptor.command == b"echo":
            for _ in reader:
                writer.write(pa.py_buffer(b"ok"))
            return
        rows = sum(chunk.data.num_rows for chunk in reader)
        writer.write(pa.py_buffer(struct.pack("<q", rows)))

    def do_exchange(self, context, descriptor, reader, writer):
        if descriptor.command == b"echo":
            writer.begin(reader.schema)
            for chunk in reader:
                writer.write_batch(chunk.data)
            return
        rows = sum(chunk.data.num_rows for chunk in reader)
        writer.write_metadata(pa.py_buffer(struct.pack("<q", rows)))


def _flight_consumer(ready) -> None:
    pin(1)
    server = _FlightServer("grpc+tcp://127.0.0.1:0")
    ready.send(server.port)
    server.serve()


# --- producers: this process, pinned -----------------------------------------------------------------

class Transport(ABC):
    """One transport's producer side."""

    name = ""

    @abstractmethod
    def throughput(self, batch: pa.RecordBatch, n: int) -> float:
        """Seconds to move ``n`` copies of ``batch`` until the consumer counted them."""

    def round_trips(self, batch: pa.RecordBatch, n: int) -> list[float] | None:
        """Seconds of each of ``n`` trips of ``batch`` there and back (None: no way back)."""
        return None

    def close(self) -> None:
        pass


class ChannelPair(Transport):
    """A sparkcep channel for the data and one back for echoes, with its consumer process."""

    def __init__(self, name, out, back, process, done):
        self.name, self.out, self.back, self.process, self.done = name, out, back, process, done

    def throughput(self, batch, n):
        t0 = time.perf_counter()
        for i in range(n):
            self.out.send_data(COUNT, (i, i, 0), batch)
            self.out.flush_blocking(30)
        self.out.send_progress(END, 0, 0, 0)
        self.out.flush_blocking(30)
        rows = self.done.recv()
        elapsed = time.perf_counter() - t0
        assert rows == n * batch.num_rows, (self.name, rows)
        return elapsed

    def round_trips(self, batch, n):
        out = []
        for i in range(n):
            t0 = time.perf_counter()
            self.out.send_data(ECHO, (i, i, 0), batch)
            self.out.flush_blocking(30)
            while self.back.receive() is None:
                sleep_on(self.back, 0.05)
            out.append(time.perf_counter() - t0)
        return out

    def close(self):
        self.out.close()
        self.process.join(5)
        self.back.close()


def ring_pair(ctx, d: str) -> ChannelPair:
    forward, backward = os.path.join(d, "forward"), os.path.join(d, "backward")
    consumer_bell = Doorbell.create(os.path.join(d, "consumer.bell"))
    producer_bell = Doorbell.create(os.path.join(d, "producer.bell"))
    create_ring(forward, 16 << 20, consumer_bell.path)
    create_ring(backward, 1 << 20, producer_bell.path)
    consumer_bell.close()
    done, done_child = ctx.Pipe(False)
    p = ctx.Process(target=_channel_consumer, args=(partial(_ring_ends, forward, backward, consumer_bell.path),
                                                    done_child), daemon=True)
    p.start()
    out, back = RingProducer(forward, producer_bell), RingConsumer(backward, producer_bell, copy=False)
    return ChannelPair("ring", out, back, p, done)


def tcp_pair(ctx, capacity: int) -> ChannelPair:
    port, token = _free_port(), auth.generate()
    done, done_child = ctx.Pipe(False)
    ready, ready_child = ctx.Pipe(False)
    p = ctx.Process(target=_channel_consumer, args=(partial(_tcp_ends, port, token, ready_child), done_child),
                    daemon=True)
    p.start()
    ready.recv()
    address = f"tcp:127.0.0.1:{port}/"
    out = tcp.connect(address + "forward", "producer", token, capacity=capacity)
    back = tcp.connect(address + "back", "consumer", token, copy=False)
    return ChannelPair(f"tcp channel {out.capacity >> 20} MiB", out, back, p, done)


class SocketIPC(Transport):
    name = "IPC/socket"

    def __init__(self, ctx):
        port = _free_port()
        ready, ready_child = ctx.Pipe(False)
        self.process = ctx.Process(target=_socket_consumer, args=(port, ready_child), daemon=True)
        self.process.start()
        ready.recv()
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.schema = None

    def _send(self, batch, port):
        if self.schema is None or not self.schema.equals(batch.schema):
            self.schema = batch.schema
            body = batch.schema.serialize()
            self.sock.sendmsg([MSG.pack(body.size, -1), body])
        body = batch.serialize()
        self.sock.sendmsg([MSG.pack(body.size, port), body])

    def throughput(self, batch, n):
        t0 = time.perf_counter()
        for _ in range(n):
            self._send(batch, COUNT)
        self.sock.sendall(MSG.pack(-1, 0))
        rows = MSG.unpack(self.sock.recv(MSG.size, socket.MSG_WAITALL))[0]
        elapsed = time.perf_counter() - t0
        assert rows == n * batch.num_rows
        return elapsed

    def round_trips(self, batch, n):
        out, head = [], bytearray(MSG.size)
        for _ in range(n):
            t0 = time.perf_counter()
            self._send(batch, ECHO)
            self.sock.recv_into(head, MSG.size, socket.MSG_WAITALL)
            body = bytearray(MSG.unpack(head)[0])
            self.sock.recv_into(body, len(body), socket.MSG_WAITALL)
            out.append(time.perf_counter() - t0)
        return out

    def close(self):
        self.sock.close()
        self.process.join(5)


class Flight(Transport):
    def __init__(self, client, exchange: bool):
        self.client, self.exchange = client, exchange
        self.name = "Flight DoExchange" if exchange else "Flight DoPut"

    def throughput(self, batch, n):
        count = flight.FlightDescriptor.for_command(b"count")
        t0 = time.perf_counter()
        if self.exchange:
            writer, reader = self.client.do_exchange(count)
            writer.begin(batch.schema)
        else:
            writer, reader = self.client.do_put(count, batch.schema)
        for _ in range(n):
            writer.write_batch(batch)
        writer.done_writing()
        answer = reader.read_chunk().app_metadata if self.exchange else reader.read()
        writer.close()
        elapsed = time.perf_counter() - t0
        assert struct.unpack("<q", answer)[0] == n * batch.num_rows
        return elapsed

    def round_trips(self, batch, n):
        echo = flight.FlightDescriptor.for_command(b"echo")
        if self.exchange:
            writer, reader = self.client.do_exchange(echo)
            writer.begin(batch.schema)
            answer = reader.read_chunk
        else:
            writer, reader = self.client.do_put(echo, batch.schema)
            answer = reader.read
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            writer.write_batch(batch)
            answer()
            out.append(time.perf_counter() - t0)
        writer.done_writing()
        writer.close()
        return out


class Memcpy(Transport):
    name = "memcpy (1 process)"

    def throughput(self, batch, n):
        src = np.frombuffer(batch.serialize(), np.uint8)
        dst = np.empty_like(src)
        t0 = time.perf_counter()
        for _ in range(n):
            np.copyto(dst, src)
        return time.perf_counter() - t0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spread(values: list[float], scale: float, digits: int) -> str:
    values = sorted(values)
    return (f"{statistics.median(values) / scale:{digits + 5}.{digits}f} "
            f"[{values[0] / scale:.{digits}f} - {values[-1] / scale:.{digits}f}]")


def tcp_capacity(text: str) -> int:
    """``--tcp-capacity``: a channel's capacity as the channel takes it, a multiple of 8 from 4096 to 2**30 bytes."""
    n = bounded(int, 4096, 1 << 30)(text)
    if n % 8:
        raise argparse.ArgumentTypeError(f"must be a multiple of 8, got {text}")
    return n


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=bounded(int, 1, MAX_RUNS), default=5, help="throughput runs per transport and batch")
    p.add_argument("--mb", type=bounded(int, 1, MAX_MB), default=256, help="megabytes moved per throughput run")
    p.add_argument("--rtt", type=bounded(int, 1, MAX_RTT), default=2000, help="round trips measured per transport")
    p.add_argument("--tcp-capacity", type=tcp_capacity, default=tcp.DEFAULT_CAPACITY,
                   help="the tcp channel's capacity (bytes, a multiple of 8 from 4096 to 2**30; at most "
                   "net.core.wmem_max is used)")
    a = p.parse_args(argv)
    ctx = mp.get_context("spawn")  # gRPC's threads and forked children do not mix
    batches = {"64K x 3 int64": int_batch(), "16K HiBench-like": hibench_batch()}
    pin(0)  # first: threads started from here on (gRPC's, Arrow's) inherit the core
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as d:
        ready, ready_child = ctx.Pipe(False)
        server = ctx.Process(target=_flight_consumer, args=(ready_child,), daemon=True)
        server.start()
        client = flight.connect(f"grpc+tcp://127.0.0.1:{ready.recv()}")
        transports = [ring_pair(ctx, d), tcp_pair(ctx, a.tcp_capacity), SocketIPC(ctx), Flight(client, False),
                      Flight(client, True), Memcpy()]
        try:
            times = {(t.name, k): [] for t in transports for k in batches}
            for t in transports:  # warm up: connections, schemas, caches
                for b in batches.values():
                    t.throughput(b, 2)
            for _ in range(a.runs):
                for k, b in batches.items():
                    n = max(4, (a.mb << 20) // b.nbytes)
                    for t in transports:
                        times[(t.name, k)].append((n, t.throughput(b, n)))
            one_row = batches["64K x 3 int64"].slice(0, 1)
            trips = {t.name: t.round_trips(one_row, a.rtt) for t in transports}
        finally:
            for t in transports:
                try:
                    t.close()
                except ChannelClosed:
                    pass
            server.kill()
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; producer on one core, consumer "
          f"process on another; {a.runs} runs of ~{a.mb} MB per cell: median [min - max]")
    for k, b in batches.items():
        print(f"\n{k} ({b.nbytes / 1e6:.2f} MB per batch)")
        print(f"  {'transport':20s} {'M rows/s':>22s} {'GB/s':>22s}")
        memcpy = statistics.median(n * b.nbytes / s for n, s in times[(Memcpy.name, k)])
        for t in transports:
            runs = times[(t.name, k)]
            gbs = [n * b.nbytes / s for n, s in runs]
            print(f"  {t.name:20s} {spread([n * b.num_rows / s for n, s in runs], 1e6, 1):>22s} "
                  f"{spread(gbs, 1e9, 2):>22s}   {statistics.median(gbs) / memcpy:4.0%} of memcpy")
    print(f"\nround trip of a 1-row batch, {a.rtt} trips (us)")
    print(f"  {'transport':20s} {'median':>8s} {'p90':>8s} {'p99':>8s}")
    for name, xs in trips.items():
        if xs:
            q = np.percentile(np.array(xs) * 1e6, [50, 90, 99])
            print(f"  {name:20s} {q[0]:8.0f} {q[1]:8.0f} {q[2]:8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
