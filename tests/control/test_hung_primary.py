"""A primary engine host that hangs (SIGSTOP) while a client sends through ``Engine.connect``: its
connections stay open, so nothing breaks on the client's side; the standby takes over once the hung
host's registry session expires, and the client's send under way goes there within seconds, long
before the hung host resumes. A migration under way on the hung host ends as soon with
MIGRATION_INTERRUPTED, and reads of the deployed query go to the new primary; the migration called
again finishes. After the hung host resumes (fenced), every row is out once, equal per window and IP
to the run in one process.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pandas as pd
from chaos_harness import Cluster
from sender import Sender

import sparkcep as cep
from harness import InThread, wait

HANG_S = 10.0  # the primary stays stopped this long: its registry session (2 s) ends well before
MOVED_S = 8.0  # sends are taken again within this (session timeout 2 s, take-over, retry)
T0 = 1_700_000_000_000_000
BINS = 64


def events(i: int, n: int = 300) -> pd.DataFrame:
    r = np.random.default_rng(i)
    return pd.DataFrame({"ip": [f"10.0.0.{k}" for k in r.integers(0, 40, n)],
                         "ts": pd.to_datetime(T0 + i * 100_000 + np.sort(r.integers(0, 100_000, n)), unit="us"),
                         "bytes": r.integers(1, 1000, n)})


def query() -> cep.Query:
    q = cep.Query("hung")
    s = q.stream("ev", "ip string, ts timestamp, bytes int64")
    q.output("per_ip", s.aggregate(cep.TimeWindow("1s"), by="ip", name="agg", n=cep.count(), total=cep.sum("bytes")))
    return q


def test_sends_leave_a_hung_primary_for_the_new_one(tmp_path):
    cluster = Cluster(tmp_path)
    stopped = None
    try:
        wait(cluster.settled, "the cluster to settle", timeout=60)
        with cep.Engine.connect(cluster.zk, token_file=str(cluster.token_file), retry_s=60) as engine:
            dep = engine.deploy(query(), parallelism=2, bins=BINS)
            done_at: list[float] = []

            def send(i):
                engine.send("ev", events(i))
                done_at.append(time.monotonic())
            sender = Sender(send, range(400), pace_s=0.02).start()
            sender.wait_done(20, 60)
            target = {b: 1 - o for b, o in enumerate(dep.bin_owners("agg"))}
            migration = InThread(lambda: dep.migrate("agg", target, strategy="batched", batch=1, gap_ms=200))
            time.sleep(1.0)  # a few of its 64 steps done
            primary = cluster.primary()
            assert sender.during_send(lambda: os.kill(primary["pid"], signal.SIGSTOP))
            stopped, t_stop = primary["pid"], time.monotonic()
            n = sender.done
            wait(lambda: sender.done > n + 5 or time.monotonic() - t_stop > MOVED_S, "sends to go on")
            took = done_at[n] - t_stop if len(done_at) > n else None
            assert took is not None and took < MOVED_S, f"no send taken in {MOVED_S} s of the primary's hang"
            assert cluster.primary()["pid"] != stopped
            migration.join(MOVED_S - (time.monotonic() - t_stop))
            assert getattr(migration.error, "code", migration.error) == "MIGRATION_INTERRUPTED"
            # it said the hung engine "closed the connection"
            assert "stopped answering during 'deployment'; another engine host serves at" in str(migration.error)
            assert dep.migrate("agg", target)["kind"] == "migrate"  # the new primary's layout, finished
            assert dep.bin_owners("agg") == [target[b] for b in range(BINS)]
            time.sleep(max(0.0, HANG_S - (time.monotonic() - t_stop)))
            os.kill(stopped, signal.SIGCONT)
            stopped = None
            sender.stop()
            assert not sender.errors, sender.errors
            sent = sender.done
            engine.end("ev")
            got = engine.collect("per_ip").to_pandas()
        with cep.Engine.local() as ref:
            ref.deploy(query(), parallelism=2, bins=BINS)
            for i in range(sent):
                ref.send("ev", events(i))
            ref.end("ev")
            want = ref.collect("per_ip").to_pandas()
        key = ["window_start", "ip"]
        pd.testing.assert_frame_equal(got.sort_values(key).reset_index(drop=True),
                                      want.sort_values(key).reset_index(drop=True))
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        left = cluster.stop()
    assert left == {"processes": [], "shm": []}, left
