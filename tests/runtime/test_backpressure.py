"""Back-pressure: a slow consumer slows the producer; what is in flight stays bounded; nothing is lost."""

import threading
import time

import numpy as np
import pyarrow as pa
import pytest

import sparkcep as cep

RING = 1 << 16
BATCH = 256
BATCHES = 60


class SlowCount(cep.StatefulOperator):
    """Counts rows per key, slowly: 5 ms per consumed batch."""

    schema = "k string, n int64"

    def process(self, batch, bins, state):
        time.sleep(0.005)
        ks = batch.column("k").to_pylist()
        for k in ks:
            state[k] = state.get(k, 0) + 1
        keys = sorted(set(ks))
        return pa.RecordBatch.from_pydict({"k": pa.array(keys, pa.string()),
                                           "n": pa.array([state[k] for k in keys], pa.int64())})


def slow_copy(batch):
    time.sleep(0.005)
    return batch


def make(kind: str) -> cep.Query:
    q = cep.Query(f"bp_{kind}")
    s = q.stream("bp_in", "k string, ts timestamp, v int64")
    if kind == "stateless":  # engine -> slow instance
        q.output("bp_out", s.apply(slow_copy, name="slow"))
    else:  # engine -> 2 map instances -> one slow stateful instance
        q.output("bp_out", s.map(k="k", v="v", name="m").stateful(SlowCount(), by="k", name="slow"))
    return q


@pytest.mark.parametrize("kind", ["stateless", "stateful"])
def test_a_slow_consumer_slows_the_producer_and_nothing_is_lost(kind):
    with cep.Engine.local(workers=2, ring_bytes=RING) as engine:
        q = make(kind)
        engine.deploy(q, parallelism={"m": 2} if kind == "stateful" else 1)
        out_rows = [0]
        lock = threading.Lock()

        def count(batch):
            with lock:
                out_rows[0] += batch.num_rows
        engine.subscribe("bp_out", count)
        dep = engine.deployments[q.name]
        rng = np.random.default_rng(0)
        in_flight, t0 = [], time.monotonic()
        for i in range(BATCHES):
            n = i * BATCH
            engine.send("bp_in", {"k": rng.choice(list("abcdefgh"), BATCH).tolist(),
                                  "ts": pa.array(np.arange(n, n + BATCH) * 1000, pa.timestamp("us")),
                                  "v": np.arange(n, n + BATCH)})
            # the engine keeps nothing back: what send() could not hand to a ring, it waited for
            assert all(w.backlog_bytes == 0 for w in dep.gen.source_channels.values())
            with lock:
                if kind == "stateless":
                    in_flight.append(n + BATCH - out_rows[0])
        elapsed = time.monotonic() - t0
        engine.end("bp_in")
        got = engine.collect("bp_out", timeout=60)
        m = engine.metrics()
    # the producer was held back: 60 batches at >= 5 ms each, at most a ring's worth ahead
    assert elapsed >= 0.5 * BATCHES * 0.005, elapsed
    queues = m["queries"][q.name]["subqueries"]
    assert all(s["queue"]["input_bytes"] <= 2 * RING * s["instances"] for s in queues.values())
    if kind == "stateless":
        # at most the input ring and the output ring full, and a few batches on their way: a row takes
        # k's offset and byte, ts, v and the hidden columns (four in, two out)
        bound = RING // (4 + 1 + 8 + 8 + 4 * 8) + RING // (4 + 1 + 8 + 8 + 2 * 8) + 4 * BATCH
        assert max(in_flight) <= bound, (max(in_flight), bound)
        assert got.num_rows == BATCHES * BATCH
        assert got.column("v").to_pylist() == list(range(BATCHES * BATCH))  # in order, once each
    else:
        final = {}
        for k, n in zip(got.column("k").to_pylist(), got.column("n").to_pylist()):
            final[k] = max(final.get(k, 0), n)
        assert sum(final.values()) == BATCHES * BATCH  # every tuple counted once
