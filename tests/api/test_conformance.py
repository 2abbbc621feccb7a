"""The public API, case by case, on every kind of engine (``api``: ``tests/api/conftest.py``).

Each case is written once and runs on ``Engine.local(workers=0)``, ``Engine.local(workers=2)``,
instance managers reached by address, and a ZooKeeper cluster through ``Engine.connect``: the same
calls, with what Python users pass (pandas slices with a permuted index, numpy columns and integers,
Arrow), must give the same results and the same error codes. Results are checked per key against a
pandas computation of the same input.
"""

from __future__ import annotations

import inspect
import os
import threading
import time
from collections import Counter

import numpy as np
import pandas as pd
import psutil
import pyarrow as pa
import pytest

import sparkcep as cep
from sparkcep.control.connect import ConnectedEngine
from sparkcep.deployed import Deployed, LocalDeployed
from sparkcep.gateway.deployed import ClientDeployed

BINS = 64
WINDOW_US = 1_000_000
SEND_ROWS = 300  # a send covers its own half second of event time: no row of a later send is late
MB = 1 << 20


def query(name: str) -> cep.Query:
    """Per key ``k``, over 1 s windows: rows with ``v >= 0`` counted and summed."""
    q = cep.Query(name)
    s = q.stream(f"{name}_in", "k string, ts timestamp, v int64")
    q.output(f"{name}_out", s.filter(cep.col("v") >= 0, name="keep")
             .aggregate(cep.TimeWindow("1s"), by="k", name="agg", n=cep.count(), total=cep.sum("v")))
    return q


def frame(i: int, seed: int = 0) -> pd.DataFrame:
    """Send ``i``: ``SEND_ROWS`` rows of 23 keys in event time [i/2 s, (i+1)/2 s), index 1000 * i + row."""
    rng = np.random.default_rng(seed * 1000 + i)
    ts = i * WINDOW_US // 2 + np.sort(rng.integers(0, WINDOW_US // 2, SEND_ROWS))
    return pd.DataFrame({"k": [f"key-{x}" for x in rng.integers(0, 23, SEND_ROWS)],
                         "ts": ts.astype("datetime64[us]"), "v": rng.integers(-5, 100, SEND_ROWS)},
                        index=1000 * i + np.arange(SEND_ROWS))


def as_sent(df: pd.DataFrame, how: str):
    """``df`` as a Python user hands it over: a pandas slice with a permuted index, numpy columns, Arrow."""
    if how == "pandas":
        return df.iloc[np.random.default_rng(len(df)).permutation(len(df))]
    if how == "numpy":
        return {"k": df["k"].to_numpy(), "ts": df["ts"].to_numpy(), "v": df["v"].to_numpy()}
    table = pa.Table.from_pandas(df, preserve_index=False)
    return table if how == "arrow" else table.to_batches()[0]


def reference(frames: list[pd.DataFrame]) -> dict:
    """(window start in us, k) -> (n, total), computed by pandas."""
    df = pd.concat(frames)
    df = df[df["v"] >= 0]
    start = df["ts"].astype("int64") // WINDOW_US * WINDOW_US
    g = df.groupby([start, df["k"]])["v"].agg(["count", "sum"])
    return {(int(w), k): (int(n), int(t)) for (w, k), (n, t) in g.iterrows()}


def per_key(rows) -> dict:
    """The engine's output rows (an Arrow table or record batches) as the reference's dict; a key twice fails."""
    tables = [rows] if isinstance(rows, pa.Table) else [pa.Table.from_batches([b]) for b in rows]
    out = {}
    for t in tables:
        for r in t.to_pylist():
            key = (int(pd.Timestamp(r["window_start"]).value // 1000), r["k"])
            assert key not in out, f"{key} came out twice"
            out[key] = (r["n"], r["total"])
    return out


class Deployment:
    """``query(name)`` deployed on ``api``'s engine for one test, undeployed after it."""

    def __init__(self, api, name: str, **options):
        self.api, self.name, self.engine = api, f"{name}_{api.kind}", api.engine
        self.query = query(self.name)
        self.stream, self.output = f"{self.name}_in", f"{self.name}_out"
        self.dep = self.engine.deploy(self.query, **options)
        self.frames: list[pd.DataFrame] = []

    def send(self, how: str = "pandas") -> int:
        df = frame(len(self.frames))
        self.frames.append(df)
        return self.engine.send(self.stream, as_sent(df, how))

    def end_and_check(self) -> pa.Table:
        self.engine.end(self.stream)
        got = self.engine.collect(self.output)
        assert per_key(got) == reference(self.frames)
        return got

    def __enter__(self) -> "Deployment":
        return self

    def __exit__(self, *exc) -> None:
        self.engine.undeploy(self.name)


def targets(engine) -> list[str]:
    """Where an instance may be moved: the instance managers, or the engine's own process."""
    return [im["name"] for im in engine.instance_managers()] or ["engine"]


def code_of(call) -> tuple[str, str, str]:
    """The error class, code and message of ``call()``, which must raise a sparkcep error."""
    with pytest.raises(cep.SparkcepError) as e:
        call()
    return type(e.value).__name__, e.value.code, str(e.value)


# --- the cases -----------------------------------------------------------------------------------------------
def test_deploy_returns_the_deployed_query_and_deployment_finds_it(api):
    with Deployment(api, "dep", parallelism=2, bins=BINS) as d:
        assert isinstance(d.dep, Deployed)
        again = api.engine.deployment(d.name)
        assert isinstance(again, Deployed) and again.id == d.dep.id and again.name == d.name
        assert d.dep.parallelism == {"SQ1": 2, "SQ2": 2}
        owners = d.dep.bin_owners("agg")
        assert len(owners) == BINS and sorted(set(owners)) == [0, 1] and all(type(o) is int for o in owners)
        assert "SQ2 x2" in d.dep.explain()
        assert [r["state"] for r in d.dep.replicas()] == ["running"]
        assert d.dep.migrations() == {"running": [], "finished": []}


def test_two_replicas_give_every_row_once_and_rescale_together(api):
    with Deployment(api, "rep", parallelism=2, bins=BINS, replicas=np.int64(2)) as d:
        replicas = d.dep.replicas()
        assert [(r["replica"], r["state"]) for r in replicas] == [(0, "running"), (1, "running")]
        if api.kind != "workers0":  # on disjoint instance managers
            assert not set(replicas[0]["instance_managers"]) & set(replicas[1]["instance_managers"]), replicas
        d.send()
        report = d.dep.rescale("agg", np.int64(3))
        assert report["bins"] == BINS // 3 and d.dep.parallelism["SQ2"] == 3
        # the new generation, then a batch of bins from each old instance: the replicas switch together
        # (each replica's switch was counted: 4)
        assert report["steps"] == 3, report
        d.send("numpy")
        d.end_and_check()


@pytest.mark.parametrize("how", ["pandas", "numpy", "arrow", "batch"])
def test_sends_of_what_users_hold_give_the_reference_rows(api, how):
    with Deployment(api, f"send_{how}", parallelism=2, bins=BINS) as d:
        assert [d.send(how) for _ in range(4)] == [SEND_ROWS] * 4
        d.end_and_check()


def test_collect_and_subscribe_give_every_row_once(api):
    with Deployment(api, "sub", parallelism=2, bins=BINS) as d:
        got, errors, lock = [], [], threading.Lock()

        def take(batch):
            with lock:
                got.append(batch)
        subscription = api.engine.subscribe(d.output, take, on_error=errors.append)
        for i in range(4):
            d.send(["pandas", "numpy", "arrow", "batch"][i])
        table = d.end_and_check()
        deadline = time.monotonic() + 30
        while sum(b.num_rows for b in list(got)) < table.num_rows and time.monotonic() < deadline:
            time.sleep(0.05)
        with lock:
            assert all(isinstance(b, pa.RecordBatch) for b in got), {type(b) for b in got}
            assert per_key(got) == reference(d.frames)
        assert errors == []
    time.sleep(0.5)  # undeployed: the subscription ends quietly (through Engine.connect its on_error heard
    assert errors == []  # UNKNOWN_STREAM, "did you mean" another query's output)
    subscription.cancel()
    subscription.cancel()  # idempotent


def test_a_subscriber_that_raises_is_told_and_the_others_get_its_rows(api):
    """Its error reaches ``on_error`` as SINK, naming it, and the other subscriber gets every row the
    failing batch carried. On an engine the query then fails (the README's ``subscribe``); a cluster
    client's callback is the client's own: only its subscription ends. With workers=0 the user's error
    came raw out of ``send`` again and again, ``on_error`` was never called and the other subscriber
    never got the rows."""
    with Deployment(api, "badsub", parallelism=2, bins=BINS) as d:
        errors, got, lock = [], [], threading.Lock()

        def broken(batch):
            raise KeyError("broken callback")

        def take(batch):
            with lock:
                got.append(batch)
        api.engine.subscribe(d.output, broken, on_error=errors.append)
        api.engine.subscribe(d.output, take)
        for _ in range(3):  # the third send's watermark closes the first window: its rows come out
            d.send()
        deadline = time.monotonic() + 30
        while not errors and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [(type(e), e.code) for e in errors] == [(cep.EngineError, "SINK")], errors
        assert "KeyError" in str(errors[0]) and "broken callback" in str(errors[0])
        if api.kind == "cluster":
            d.send()
            everything = reference(d.frames) if d.end_and_check() else None
        else:
            assert code_of(d.send)[1] == "SINK"
            everything = {key: v for key, v in reference(d.frames[:3]).items() if key[0] == 0}
        while len(per_key(list(got))) < len(everything) and time.monotonic() < deadline:
            time.sleep(0.05)
        with lock:
            assert per_key(got) == everything


def test_a_callback_calling_the_engine_is_answered_at_once(api):
    """metrics(), send() and migrate() from inside a subscriber's callback: with workers metrics() took
    20 s and a migration failed after 120 s, stalling every output meanwhile; in one process a send ran
    inside the one publishing and broke its sink (KeyError). An engine refuses them at once (IN_CALLBACK,
    the callback may catch it); a cluster client's callback runs in the client, whose calls go on."""
    with Deployment(api, "cbcall", parallelism=2, bins=BINS) as d:
        answers, done = [], threading.Event()
        calls = {"metrics": lambda: api.engine.metrics(), "send": lambda: api.engine.send(d.stream, frame(0)[:0]),
                 "migrate": lambda: d.dep.migrate("agg", {0: 1})}

        def calling(batch):
            if done.is_set():
                return
            for name, call in calls.items():
                t = time.monotonic()
                try:
                    call()
                    answers.append((name, None, time.monotonic() - t))
                except cep.SparkcepError as e:
                    answers.append((name, e.code, time.monotonic() - t))
            done.set()
        api.engine.subscribe(d.output, calling)
        for _ in range(3):  # the third send's watermark closes the first window: its rows come out
            d.send()
        assert done.wait(60), "the callback never ran"
        codes = [(name, code) for name, code, _ in answers]
        if api.kind == "cluster":
            assert codes == [("metrics", None), ("send", None), ("migrate", None)], answers
        else:
            assert codes == [("metrics", "IN_CALLBACK"), ("send", "IN_CALLBACK"), ("migrate", "IN_CALLBACK")], answers
            assert max(took for _, _, took in answers) < 1, answers
        d.send()
        api.engine.end(d.stream)
        got = per_key(api.engine.collect(d.output))
        assert got == reference(d.frames)


def test_collect_of_an_output_that_keeps_no_rows_or_lost_some_says_so(api):
    """Through Engine.connect, collect() of a retain=False output was an empty table and one past its
    retention the rows left, both without a word; an engine raises NOT_RETAINED and OUTPUT_TRUNCATED."""
    with Deployment(api, "nokeep", parallelism=2, bins=BINS, retain=False) as d:
        d.send()
        assert code_of(lambda: api.engine.collect(d.output))[1] == "NOT_RETAINED"
        if api.kind == "cluster":  # a subscription there reads the log, which keeps nothing
            assert code_of(lambda: api.engine.subscribe(d.output, print))[1] == "NOT_RETAINED"
    with Deployment(api, "fewkept", parallelism=2, bins=BINS, retain=cep.Retention(rows=20)) as d:
        for _ in range(4):
            d.send()
        api.engine.end(d.stream)
        assert code_of(lambda: api.engine.collect(d.output))[1] == "OUTPUT_TRUNCATED"


def raising_query(name: str) -> cep.Query:
    """Rows of ``query``'s input through an operator that raises on a row with v == -999."""
    def picky(batch):
        if -999 in batch.column("v").to_pylist():
            raise ValueError("v = -999 is not welcome")
        return batch
    q = cep.Query(name)
    q.output(f"{name}_raw", q.stream(f"{name}_in", "k string, ts timestamp, v int64").apply(picky, name="picky"))
    return q


def test_a_query_that_fails_tells_the_subscribers_on_error(api):
    """An operator raises: a subscriber's on_error hears OPERATOR_FAILED, through Engine.connect too (its
    subscription went quiet: on_error never heard a query's failure there)."""
    name = f"fails_{api.kind}"
    api.engine.deploy(raising_query(name), parallelism=2, bins=BINS)
    try:
        errors = []
        api.engine.subscribe(f"{name}_raw", lambda b: None, on_error=errors.append)
        api.engine.send(f"{name}_in", frame(0))
        try:
            api.engine.send(f"{name}_in", frame(1).assign(v=-999))
        except cep.EngineError as e:  # in one process the send itself fails; with workers, a later call
            assert e.code == "OPERATOR_FAILED"
        deadline = time.monotonic() + 30
        while not errors and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [e.code for e in errors] == ["OPERATOR_FAILED"], errors
        assert "v = -999 is not welcome" in str(errors[0])
        assert code_of(lambda: api.engine.send(f"{name}_in", frame(2)))[1] == "OPERATOR_FAILED"
    finally:
        api.engine.undeploy(name)


def test_migrate_with_numpy_integers_moves_exactly_the_bins_asked(api):
    with Deployment(api, "mig", parallelism=2, bins=BINS) as d:
        d.send()
        before = d.dep.bin_owners("agg")
        rng = np.random.default_rng(7)
        moved = rng.choice(BINS, 12, replace=False)  # numpy int64 bins, numpy int64 instances
        assignment = {b: np.int64(1 - before[b]) for b in moved}
        report = d.dep.migrate("agg", assignment, strategy="batched", batch=np.int64(4))
        want = list(before)
        for b in moved:
            want[b] = 1 - before[b]
        assert d.dep.bin_owners("agg") == want
        assert report["kind"] == "migrate" and report["bins"] == 12 and report["steps"] >= 1
        d.send("numpy")
        assert d.dep.migrate("agg", {int(b): int(before[b]) for b in moved[:5]})["bins"] == 5  # fluid back
        assert [r["bins"] for r in d.dep.migrations()["finished"]] == [12, 5]
        d.send("arrow")
        d.end_and_check()


def test_rescale_and_move_keep_every_row(api):
    with Deployment(api, "resc", parallelism=2, bins=BINS) as d:
        d.send()
        report = d.dep.rescale("agg", np.int64(3))
        assert report["kind"] == "rescale" and report["bins"] > 0
        assert d.dep.parallelism == {"SQ1": 2, "SQ2": 3}
        owners = d.dep.bin_owners("agg")
        held = Counter(owners)
        assert sorted(held) == [0, 1, 2] and max(held.values()) - min(held.values()) <= 1, held  # spread evenly
        d.send("numpy")
        to = targets(api.engine)[-1]
        report = d.dep.move("agg", instance=np.int64(0), to=to)
        assert report["kind"] == "move" and report["strategy"] == "state-transfer"
        assert d.dep.bin_owners("agg") == owners  # a move keeps the bins of the instance
        if api.kind != "workers0":
            assert any(f"{d.name}.SQ2[0]" in im["instances"] for im in api.engine.instance_managers()
                       if im["name"] == to)
        d.send("arrow")
        assert d.dep.rescale("agg", 1)["bins"] > 0 and set(d.dep.bin_owners("agg")) == {0}
        d.send("batch")
        d.end_and_check()


def test_metrics_count_what_was_sent_and_migrated(api):
    with Deployment(api, "met", parallelism=2, bins=BINS) as d:
        for _ in range(3):
            d.send()
        d.dep.migrate("agg", {0: 1 - d.dep.bin_owners("agg")[0]})
        got = d.end_and_check()
        m = api.engine.metrics()
        assert {"sequence", "outputs", "late", "queries", "instance_managers", "migrations"} <= set(m)
        assert m["outputs"][d.output] == got.num_rows
        q = m["queries"][d.name]
        assert q["rows_in"] == 3 * SEND_ROWS and q["rows_out"] == got.num_rows
        assert q["subqueries"]["SQ2"]["instances"] == 2
        assert [r["bins"] for r in m["migrations"][d.name]["finished"]] == [1]
        assert len(m["instance_managers"]) == (0 if api.kind == "workers0" else 2)
        inst = d.dep.instance_metrics()
        assert sorted(inst) == [("SQ1", 0), ("SQ1", 1), ("SQ2", 0), ("SQ2", 1)]
        assert sum(v["rows_in"] for (sq, _), v in inst.items() if sq == "SQ1") == 3 * SEND_ROWS


def test_metrics_number_the_instance_managers_alike(api):
    numbers = list(api.engine.metrics()["instance_managers"])
    assert numbers == ([] if api.kind == "workers0" else [0, 1])


def test_bad_inputs_get_the_same_codes_everywhere(api):
    with Deployment(api, "bad", parallelism=2, bins=BINS) as d:
        d.send()
        owners, e = d.dep.bin_owners("agg"), api.engine
        df = frame(1)
        cases = {
            "unknown field": (lambda: e.send(d.stream, df.assign(extra=1)), "InputError", "UNKNOWN_FIELD"),
            "unknown stream": (lambda: e.send(d.stream + "x", df), "UnknownStreamError", "UNKNOWN_STREAM"),
            "typo'd output, collect": (lambda: e.collect(d.output + "x"), "UnknownStreamError", "UNKNOWN_STREAM"),
            "unknown query": (lambda: e.deployment(d.name + "x"), "QueryError", "UNKNOWN_QUERY"),
            "typo'd operator, migrate": (lambda: d.dep.migrate("aggg", {0: 1}), "QueryError", "UNKNOWN_OPERATOR"),
            "typo'd operator, rescale": (lambda: d.dep.rescale("aggg", 3), "QueryError", "UNKNOWN_OPERATOR"),
            "typo'd operator, move": (lambda: d.dep.move("aggg", 0, targets(e)[0]), "QueryError", "UNKNOWN_OPERATOR"),
            "typo'd operator, bin_owners": (lambda: d.dep.bin_owners("aggg"), "QueryError", "UNKNOWN_OPERATOR"),
            "bool instances": (lambda: d.dep.rescale("agg", True), "QueryError", "BAD_INSTANCE"),
            "float instances": (lambda: d.dep.rescale("agg", 3.0), "QueryError", "BAD_INSTANCE"),
            "bool bin": (lambda: d.dep.migrate("agg", {True: 1}), "QueryError", "BAD_BIN"),
            "float instance of a bin": (lambda: d.dep.migrate("agg", {0: 1.0}), "QueryError", "BAD_INSTANCE"),
            "bin out of range": (lambda: d.dep.migrate("agg", {np.int64(BINS): 1}), "QueryError", "BAD_BIN"),
            "float batch": (lambda: d.dep.migrate("agg", {0: 1}, batch=2.0), "QueryError", "BAD_OPTION"),
            "bool instance to move": (lambda: d.dep.move("agg", False, targets(e)[0]), "QueryError", "BAD_INSTANCE"),
            "unknown instance manager": (lambda: d.dep.move("agg", 0, "nowhere"), "EngineError",
                                         "UNKNOWN_INSTANCE_MANAGER"),
            "float parallelism": (lambda: e.deploy(query(d.name + "_p"), parallelism=2.0), "QueryError",
                                  "BAD_PARALLELISM"),
            "bool bins": (lambda: e.deploy(query(d.name + "_b"), bins=True), "QueryError", "BAD_BINS"),
            "float replicas": (lambda: e.deploy(query(d.name + "_r"), replicas=1.0), "QueryError", "BAD_REPLICAS"),
            "typo'd keyword, deploy": (lambda: e.deploy(query(d.name + "_k"), paralelism=2), "QueryError",
                                       "UNKNOWN_ARGUMENT"),
            # refused before the first step: it raised OverflowError after it, half the bins moved
            "an endless gap": (lambda: d.dep.migrate("agg", {0: 1, 1: 0}, strategy="batched", batch=1,
                                                     gap_ms=float("inf")), "QueryError", "BAD_OPTION"),
            "a gap of a day": (lambda: d.dep.rescale("agg", 3, gap_ms=86_400_000), "QueryError", "BAD_OPTION"),
            "a negative timeout": (lambda: e.collect(d.output, timeout=-1), "QueryError", "BAD_TIMEOUT"),
            "a NaN timeout": (lambda: e.collect(d.output, timeout=float("nan")), "QueryError", "BAD_TIMEOUT"),
            "a send id that is no string": (lambda: e.send(d.stream, df, send_id=7), "InputError", "BAD_SEND_ID"),
            "typo'd keyword, send": (lambda: e.send(d.stream, df, sendid="a"), "QueryError", "UNKNOWN_ARGUMENT"),
            # refused at once: it failed the query at its first output row (SINK)
            "a callback that is no function": (lambda: e.subscribe(d.output, 5), "QueryError", "BAD_CALLBACK"),
            "an on_error that is no function": (lambda: e.subscribe(d.output, print, on_error="log"), "QueryError",
                                                "BAD_CALLBACK"),
        }
        seen = {what: code_of(call)[:2] for what, (call, _, _) in cases.items()}
        assert seen == {what: (cls, code) for what, (_, cls, code) in cases.items()}
        assert "did you mean 'agg'" in code_of(cases["typo'd operator, migrate"][0])[2]
        # through a cluster it was "an output stream named", listing $metrics, which collect() refuses
        said = code_of(cases["typo'd output, collect"][0])[2]
        assert said.startswith(f"no deployed query has an output named {d.output + 'x'!r} (did you mean "
                               f"{d.output!r}?); outputs: [") and "$metrics" not in said, said
        # through a cluster these began "undeploy of 'badx': " and "deploy of 'bad': "
        cls, code, said = code_of(lambda: e.undeploy(d.name + "x"))
        assert (cls, code) == ("QueryError", "UNKNOWN_QUERY") and said.startswith(
            f"no query named {d.name + 'x'!r} is deployed (did you mean {d.name!r}?); queries: ["), said
        assert code_of(lambda: e.deploy(query(d.name))) == (
            "QueryError", "ALREADY_DEPLOYED", f"a query named {d.name!r} is already deployed")
        assert d.dep.bin_owners("agg") == owners and d.dep.migrations()["finished"] == []
        assert not {d.name + s for s in ("_p", "_b", "_r", "_k")} & set(e.metrics()["queries"])  # none deployed
        d.send("numpy")
        d.end_and_check()


def test_a_send_id_is_taken_once_everywhere(api):
    """What a cluster's SEND_UNCONFIRMED asks for: send the same rows again with the same send_id."""
    with Deployment(api, "sid", parallelism=2, bins=BINS) as d:
        df = frame(0)
        d.frames.append(df)
        assert api.engine.send(d.stream, df, send_id="first") == SEND_ROWS
        assert api.engine.send(d.stream, as_sent(df, "numpy"), send_id="first") == SEND_ROWS  # taken before
        cls, code, message = code_of(lambda: api.engine.send(d.stream, frame(1).iloc[:10], send_id="first"))
        assert (cls, code) == ("InputError", "SEND_ID_REUSED") and "300 rows" in message, message  # not dropped
        d.send("arrow")
        d.end_and_check()


def test_a_query_deployed_again_takes_the_send_ids_its_former_deployment_took(api):
    """Undeployed, a query's stream and outputs are gone; deployed again, a replay of its input under the same
    send ids was answered as taken and dropped (a cluster's standby, whose journal forgot them, took them)."""
    for run in range(2):
        with Deployment(api, "again", parallelism=2, bins=BINS) as d:
            for i in range(3):
                df = frame(i)
                d.frames.append(df)
                assert api.engine.send(d.stream, df, send_id=f"part-{i}") == SEND_ROWS
            assert api.engine.send(d.stream, frame(2), send_id="part-2") == SEND_ROWS  # a retry: taken once
            d.end_and_check()


def test_absurd_counts_are_refused_at_once_and_the_engine_goes_on(api):
    with Deployment(api, "absurd", parallelism=2, bins=16384) as d:
        d.send()
        for instances, code in ((100_000, "TOO_MANY_INSTANCES"), (16_000, "CAPACITY")):
            tree, shm, t0 = tree_rss(), shm_used(), time.monotonic()
            cls, got, message = code_of(lambda: d.dep.rescale("agg", instances=np.int64(instances)))
            took = time.monotonic() - t0
            assert (got, took < 1.0) == (code, True), (message, took)
            assert tree_rss() - tree < 100 * MB and shm_used() - shm < 100 * MB
        assert d.dep.parallelism == {"SQ1": 2, "SQ2": 2} and d.dep.migrations()["finished"] == []
        d.send("numpy")
        assert d.dep.rescale("agg", 3, strategy="all-at-once")["bins"] > 0  # one step of 5,461 bins
        d.send("arrow")
        d.end_and_check()


def test_a_misspelled_keyword_of_a_deployed_query_is_named_with_the_closest_one(api):
    with Deployment(api, "kw", parallelism=2, bins=BINS) as d:
        cls, code, message = code_of(lambda: d.dep.rescale("agg", instancs=3))
        assert (cls, code) == ("QueryError", "UNKNOWN_ARGUMENT") and "did you mean 'instances'" in message


def test_deploy_options_as_users_pass_them_mean_the_same_everywhere(api):
    """Through a cluster: parallelism={} raised a bare ValueError, balance=np.bool_(True) could not be sent
    (not JSON), and retain=5 raised QueryError where an engine raises EngineError."""
    name = f"opts_{api.kind}"
    dep = api.engine.deploy(query(name), parallelism={}, bins=BINS, balance=np.bool_(False))
    try:
        assert dep.parallelism == {"SQ1": 1, "SQ2": 1}
    finally:
        api.engine.undeploy(name)
    assert code_of(lambda: api.engine.deploy(query(name), retain=5))[:2] == ("EngineError", "BAD_RETENTION")


def test_a_misspelled_keyword_of_connect_is_named_with_the_closest_one():
    """Engine.connect(tokenfile=...) raised a bare TypeError."""
    cls, code, message = code_of(lambda: cep.Engine.connect("zk://127.0.0.1:1/x", tokenfile="t"))
    assert (cls, code) == ("EngineError", "UNKNOWN_ARGUMENT") and "did you mean 'token_file'" in message
    assert code_of(lambda: cep.Engine.connect("zk://127.0.0.1:1/x", token="a", token_file="b"))[1] == "BAD_OPTION"


def tree_rss() -> int:
    """Resident memory of this process and every process it started (workers, orchestrator, engine hosts)."""
    me = psutil.Process()
    total = me.memory_info().rss
    for p in me.children(recursive=True):
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def shm_used() -> int:
    st = os.statvfs("/dev/shm")
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def test_a_call_that_cannot_mean_the_same_in_a_cluster_says_so_with_a_code(api):
    """An instance manager joins a cluster by itself (``sparkcep worker --zk``): the cluster's engine says so;
    a local engine tries the address and says it cannot reach it. Either way an EngineError with a code."""
    cls, code, message = code_of(lambda: api.engine.add_instance_manager("127.0.0.1:1"))
    if api.kind == "cluster":
        assert (cls, code) == ("EngineError", "CLUSTER_MEMBERS_JOIN") and "sparkcep worker --zk" in message
    else:
        assert (cls, code) == ("EngineError", "WORKER_START") and "127.0.0.1:1" in message
    assert len(api.engine.instance_managers()) == (0 if api.kind == "workers0" else 2)


def test_a_handle_kept_from_before_undeploy_answers_for_its_own_deployment(api):
    """Undeployed, a deployed query's handle reads its deployment (state 'undeployed') and refuses changes with
    UNDEPLOYED, also once the name is deployed again. Through Engine.connect every call raised UNKNOWN_QUERY,
    and after the redeploy the old handle rescaled the new deployment and called it running."""
    with Deployment(api, "stale", parallelism=2, bins=BINS) as d:
        d.send()
        old = d.dep
        api.engine.undeploy(d.name)
        assert [r["state"] for r in old.replicas()] == ["undeployed"]
        assert len(old.bin_owners("agg")) == BINS
        assert code_of(lambda: old.rescale("agg", 1))[:2] == ("EngineError", "UNDEPLOYED")
        assert code_of(lambda: old.migrate("agg", {0: 1}))[:2] == ("EngineError", "UNDEPLOYED")
        d.dep = api.engine.deploy(d.query, parallelism=2, bins=BINS)
        assert d.dep.id != old.id
        assert code_of(lambda: old.rescale("agg", 1))[:2] == ("EngineError", "UNDEPLOYED")
        assert [r["state"] for r in old.replicas()] == ["undeployed"]
        assert d.dep.parallelism == {"SQ1": 2, "SQ2": 2} and [r["state"] for r in d.dep.replicas()] == ["running"]


def test_a_subscriber_behind_the_retention_is_told_what_it_missed(api):
    """A cluster client's subscriber reads the output's log: rows its retention released before they were read
    were skipped without a word; now on_error hears OFFSET_RELEASED naming how many were missed. An engine's
    subscriber gets every row as it is made."""
    with Deployment(api, "behind", parallelism=2, bins=BINS, retain=cep.Retention(rows=20)) as d:
        got, errors, lock = [], [], threading.Lock()

        def take(batch):
            with lock:
                got.append(batch)
        api.engine.subscribe(d.output, take, on_error=errors.append)
        d.frames = [frame(i) for i in range(40)]  # one send of 20 s: some 450 rows out, at once
        api.engine.send(d.stream, pd.concat(d.frames))
        api.engine.end(d.stream)
        want = reference(d.frames)
        deadline = time.monotonic() + 30
        while not errors and sum(b.num_rows for b in list(got)) < len(want) and time.monotonic() < deadline:
            time.sleep(0.05)
        if api.kind == "cluster":
            assert [e.code for e in errors] == ["OFFSET_RELEASED"], errors
            assert "rows missed" in str(errors[0])
        else:
            with lock:
                assert errors == [] and per_key(got) == want


def test_a_closed_engine_refuses_every_call(api):
    """Closed, a cluster client went on sending and collecting (it connected again); an engine raises CLOSED
    (a local one's ``undeploy`` returned quietly)."""
    name = f"closed_{api.kind}"
    if api.kind == "cluster":
        engine = cep.Engine.connect(f"zk://{api.zk}", token_file=api.token_file)
    else:
        engine = cep.Engine.local(workers=0)
    engine.deploy(query(name), parallelism=2, bins=BINS)
    try:
        engine.close()
        calls = {"deploy": lambda: engine.deploy(query(name + "_2")), "deployment": lambda: engine.deployment(name),
                 "send": lambda: engine.send(f"{name}_in", frame(0)), "end": lambda: engine.end(f"{name}_in"),
                 "collect": lambda: engine.collect(f"{name}_out"), "undeploy": lambda: engine.undeploy(name),
                 "subscribe": lambda: engine.subscribe(f"{name}_out", print), "metrics": engine.metrics,
                 "instance_managers": engine.instance_managers,
                 "add_instance_manager": lambda: engine.add_instance_manager("127.0.0.1:1")}
        assert {what: code_of(call)[:2] for what, call in calls.items()} == \
            {what: ("EngineError", "CLOSED") for what in calls}
        engine.close()  # idempotent
    finally:
        if api.kind == "cluster":
            api.engine.undeploy(name)


def test_a_stream_deployed_again_with_another_schema_takes_rows_of_the_new_one(api):
    """A cluster client kept the schema it first looked up: after the stream was deployed again with a field
    more, each of its sends was refused with UNKNOWN_FIELD until it connected again."""
    name = f"reschema_{api.kind}"

    def declaring(schema: str) -> cep.Query:
        q = cep.Query(name)
        q.output(f"{name}_out", q.stream(f"{name}_in", schema).filter(cep.col("v") >= 0))
        return q
    e = api.engine
    e.deploy(declaring("k string, ts timestamp, v int64"))
    assert e.send(f"{name}_in", frame(0)) == SEND_ROWS
    e.undeploy(name)
    e.deploy(declaring("k string, ts timestamp, v int64, tag string"))
    try:
        assert [e.send(f"{name}_in", frame(i).assign(tag="t")) for i in (1, 2)] == [SEND_ROWS] * 2
        assert code_of(lambda: e.send(f"{name}_in", frame(3).assign(other="t")))[:2] == \
            ("InputError", "UNKNOWN_FIELD")
    finally:
        e.undeploy(name)


# --- one interface ---------------------------------------------------------------------------------------------
CONSTRUCTORS = {"local", "connect"}  # how an Engine is made; a ConnectedEngine is made by Engine.connect
CLUSTER_ONLY = {"data_path"}  # where a cluster's streams and outputs live, as its registry says


def public(cls) -> dict:
    """Public methods and properties of ``cls``: name -> its parameters (name, kind, default), or "property"."""
    out = {}
    for name, member in inspect.getmembers(cls):
        if name.startswith("_"):
            continue
        if isinstance(inspect.getattr_static(cls, name), property):
            out[name] = "property"
        elif callable(member):
            out[name] = [(p.name, p.kind, p.default) for p in inspect.signature(member).parameters.values()]
    return out


def test_the_engine_and_the_cluster_client_have_the_same_methods_and_arguments():
    engine, cluster = public(cep.Engine), public(ConnectedEngine)
    assert {n: s for n, s in engine.items() if n not in CONSTRUCTORS} == \
        {n: s for n, s in cluster.items() if n not in CLUSTER_ONLY}
    assert issubclass(LocalDeployed, Deployed) and issubclass(ClientDeployed, Deployed)
    assert public(LocalDeployed) == public(ClientDeployed) == public(Deployed)
