"""Moving bins between instances of a stateful operator: ``take_bins`` / ``copy_bins`` / ``put_bins``.

Works at the operator level (no runtime): physical instances of one stateful
operator, rows stamped as a source stamps them, every instance advanced to
the same (frontier, watermark) after each batch. The independent reference
is one instance that never moves: the union of the instances' output must
equal its output row for row, output ids (``__seq``, ``__id``) included.
"""

import pickle
import random
from collections import Counter

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

import reference as ref
import sparkcep as cep
from cases import EVENTS, LEFT, RIGHT, T0, cep_funcs, cep_window, events, sides
from harness import plain, table
from reference import S, SEQ, TS, WM, assert_same_rows
from sparkcep.core import columns
from sparkcep.core.aggregate import WindowAggregate
from sparkcep.core.binstate import BinState
from sparkcep.core.hashing import key_bins
from sparkcep.core.operators import WM_END, WM_NONE, physical

BINS = 8
NEW = "new"  # a move's destination: a brand-new instance
EV = {"k": "string", "ts": "timestamp", "v": "int64", "s": "string"}
KEYS = ["a", "b", "c", "10.0.0.1", "10.0.0.2", "a key longer than sixteen bytes", "", None]
WORDS = ["x", "yy", "a string value longer than sixteen bytes", None]


def stamp_batches(sends, time_fields, schemas):
    """([(stream, stamped Arrow batch)], the stamped rows) as the engine's sources stamp them."""
    st_ = ref.stamp(sends, time_fields)
    out, i = [], {name: 0 for name in schemas}
    for stream, rows in sends:
        rows = st_[stream][i[stream]:i[stream] + len(rows)]
        i[stream] += len(rows)
        t = table(rows, schemas[stream])
        hidden = [pa.array([r[SEQ] for r in rows], pa.int64()), pa.array([0] * len(rows), pa.int64()),
                  pa.array([r[TS] for r in rows], pa.int64()),
                  pa.array([WM_NONE if r[WM] is None else r[WM] for r in rows], pa.int64())]
        for name, arr in zip(columns.HIDDEN, hidden):
            t = t.append_column(name, arr)
        out.append((stream, t.combine_chunks().to_batches()[0]))
    return out, st_


def bins_of(batch, keys):
    return key_bins(*columns.encode_keys(batch, keys), BINS)


class Positions(cep.StatefulOperator):
    """Per key, each row with the key's count and sum so far (order-sensitive); at each watermark,
    each key's count; at the end, the totals."""

    schema = "k string, n int64, sv int64"

    def process(self, batch, bins, state):
        out = []
        for k, b, v in zip(batch.column("k").to_pylist(), bins, batch.column("v").to_pylist()):
            n, sv = state.setdefault(int(b), {}).get(k, (0, 0))
            state[int(b)][k] = (n + 1, sv + (v or 0))
            out.append((k, n + 1, sv + (v or 0)))
        return _rows(out)

    def on_watermark(self, watermark_us, state):
        return _rows([(k, 0, n) for per_key in state.values() for k, (n, _) in per_key.items()])

    def on_end(self, state):
        return _rows([(k, -n, sv) for per_key in state.values() for k, (n, sv) in per_key.items()])


def _rows(rows):
    k, n, sv = zip(*rows) if rows else ([], [], [])
    return pa.RecordBatch.from_pydict({"k": pa.array(k, pa.string()), "n": pa.array(n, pa.int64()),
                                       "sv": pa.array(sv, pa.int64())})


FUNCS = dict(n=cep.count(), sv=cep.sum("v"), fv=cep.first("v"), lv=cep.last("v"), ms=cep.max("s"),
             ls=cep.last("s"))
KINDS = {  # name: (build the operator on a query, its input streams)
    "tumbling": (lambda q, ev, _: ev.aggregate(cep.TimeWindow("3s"), by="k", **FUNCS), ["ev"]),
    "sliding": (lambda q, ev, _: ev.aggregate(cep.TimeWindow("4s", advance="1s", lateness="2s"), by="k", **FUNCS),
                ["ev"]),
    # consumes rows in any order, leaving those of windows still open for after its results (settle)
    "sliding, order-free": (lambda q, ev, _: ev.aggregate(cep.TimeWindow("4s", advance="1s", lateness="2s"), by="k",
                                                          n=cep.count(), sv=cep.sum("v"), ms=cep.max("s")), ["ev"]),
    "tuples": (lambda q, ev, _: ev.aggregate(cep.TupleWindow(3, 2), by="k", **FUNCS), ["ev"]),
    "running": (lambda q, ev, _: ev.aggregate(cep.Running(), by="k", **FUNCS), ["ev"]),
    "join": (lambda q, ev, ev2: ev.join(ev2, cep.TimeWindow("4s", advance="1s", lateness="1s"), on="k"),
             ["ev", "ev2"]),
    "custom": (lambda q, ev, _: ev.stateful(Positions(), by="k"), ["ev"]),
}


def operator(kind):
    build, streams = KINDS[kind]
    q = cep.Query(kind)
    q.output("out", build(q, q.stream("ev", EV), q.stream("ev2", EV)))
    return q.outputs["out"], streams


@st.composite
def rows_of(draw, n_max=30):
    """Rows of ``EV``: a few keys, event times with ties, gaps and disorder (half-seconds)."""
    out, t = [], 0
    for _ in range(draw(st.integers(1, n_max))):
        t += draw(st.sampled_from([0, 1, 1, 2, 3]))
        back = draw(st.sampled_from([0, 0, 0, 1, 3, 6]))
        out.append({"k": draw(st.sampled_from(KEYS)), "ts": T0 + (t - back) * S // 2,
                    "v": draw(st.one_of(st.none(), st.integers(-3, 9))), "s": draw(st.sampled_from(WORDS))})
    return out


@st.composite
def inputs(draw, streams):
    """[(stream, stamped batch)]: each stream's rows cut into batches of 1-6 rows, interleaved."""
    cuts = {}
    for name in streams:
        rows, cuts[name] = draw(rows_of()), []
        i = 0
        while i < len(rows):
            n = draw(st.integers(1, 6))
            cuts[name].append((name, rows[i:i + n]))
            i += n
    sends = []
    while any(cuts.values()):
        sends.append(cuts[draw(st.sampled_from(sorted(n for n, c in cuts.items() if c)))].pop(0))
    return stamp_batches(sends, {s: "ts" for s in streams}, {s: EV for s in streams})[0]


@st.composite
def moves(draw, n_steps):
    """Per step: (hold: the step's batch stays pending, moves before the batch [(bins or None, src, dst)]).

    ``bins`` None takes every bin of instance ``src``; ``dst`` is an instance index or NEW.
    """
    out, instances = [], 1
    for _ in range(n_steps):
        step = []
        for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
            dst = draw(st.sampled_from([NEW] + list(range(instances))))
            if draw(st.integers(0, 4)) == 0:
                step.append((None, draw(st.integers(0, instances - 1)), dst))
            else:
                step.append((draw(st.sets(st.integers(0, BINS - 1), min_size=1)), None, dst))
            instances += dst == NEW
        out.append((draw(st.booleans()), step))
    return out


class Run:
    """Instances of one operator fed a run of batches, bins routed to their owners."""

    def __init__(self, op, streams):
        self.op, self.streams = op, streams
        self.ports = {s: p for p, s in enumerate(streams)}
        self.keys = [[a for a, _ in op.on] if p == 0 else [b for _, b in op.on] for p in range(len(streams))] \
            if len(streams) == 2 else [list(op.by)]
        self.instances = [physical(op, BINS)]
        self.owner = np.zeros(BINS, np.int64)
        self.out: list[list] = [[]]  # per instance, its output batches
        self.sent: list[tuple] = []  # (stream, batch) so far
        self.copies: list[tuple] = []  # (instance, bins or None: all): it gets their rows besides their owner

    def move(self, bins, src, dst, copy=False) -> None:
        """Bins ``bins`` (None: all of instance ``src``) go to instance ``dst`` (NEW: a new one),
        through pickle as between processes; ``copy``: ``src`` keeps them too."""
        if dst == NEW:
            self.instances.append(physical(self.op, BINS))
            self.out.append([])
            dst = len(self.instances) - 1
        if bins is None:
            groups = [(src, None)] if src != dst else []
        else:
            groups = [(s, np.array(sorted(b for b in bins if self.owner[b] == s))) for s in range(len(self.instances))
                      if s != dst and any(self.owner[b] == s for b in bins)]
        for s, b in groups:
            inst = self.instances[s]
            moved = inst.copy_bins(b) if copy else inst.take_bins(b)
            assert isinstance(moved, BinState)
            self.instances[dst].put_bins(pickle.loads(pickle.dumps(moved, protocol=5)))
            if not copy:
                self.owner[self.owner == s if b is None else b] = dst
        if copy:
            self.copies.append((dst, bins))

    def feed(self, stream, batch) -> None:
        """Route ``batch`` to the owners of its rows' bins, and to the copies of them."""
        port = self.ports[stream]
        bins = bins_of(batch, self.keys[port])
        for i, inst in enumerate(self.instances):
            mine = self.owner[bins] == i
            for to, copied in self.copies:
                if to == i:
                    mine |= np.ones(len(bins), bool) if copied is None else np.isin(bins, sorted(copied))
            if mine.any():
                assert inst.process(port, batch.filter(pa.array(mine))) == []
        self.sent.append((stream, batch))

    def advance(self, hold: bool) -> None:
        """Every instance consumes up to the last batch sent (``hold``: the one before it), firing at the
        smallest of the streams' largest event times consumed."""
        done = self.sent[:-1] if hold else self.sent
        frontier = max((int(b.column(columns.SEQ).to_numpy().max()) for _, b in done), default=-1)
        seen = {s: WM_NONE for s in self.streams}
        for s, b in done:
            seen[s] = max(seen[s], int(b.column(columns.TS).to_numpy().max()))
        self._advance(frontier, min(seen.values()))

    def end(self) -> None:
        """The end of input: the last frontier again, at the end watermark."""
        self._advance(max((int(b.column(columns.SEQ).to_numpy().max()) for _, b in self.sent), default=-1), WM_END)

    def _advance(self, frontier, watermark) -> None:
        for i, inst in enumerate(self.instances):
            self.out[i] += list(inst.advance(frontier, watermark))

    def settle(self) -> None:
        """Every instance consumes the rows its advance left for after its results were out."""
        for inst in self.instances:
            inst.settle()

    def rows(self, i=None) -> Counter:
        """Output rows (visible fields, __seq, __id) of instance ``i`` (None: all)."""
        names = self.op.schema.names + [columns.SEQ, columns.ID]
        return Counter(tuple(r.values()) for k, out in enumerate(self.out) if i is None or k == i
                       for b in out for r in b.select(names).to_pylist())


def unmoved(op, streams, batches, holds) -> Counter:
    run = Run(op, streams)
    for (stream, batch), hold in zip(batches, holds):
        run.feed(stream, batch)
        run.advance(hold)
    run.end()
    return run.rows()


@pytest.mark.parametrize("kind", list(KINDS))
@given(data=st.data())
def test_moved_bins_give_the_output_of_an_instance_that_never_moves(kind, data):
    """Bins move at random points (pending tuples with them), to other instances, to brand-new ones
    and back; their later rows follow them. The union of the outputs is the unmoved run's."""
    op, streams = operator(kind)
    batches = data.draw(inputs(streams))
    plan = data.draw(moves(len(batches)))
    settles = data.draw(st.lists(st.booleans(), min_size=len(batches), max_size=len(batches)))
    run = Run(op, streams)
    for (stream, batch), (hold, step), settle in zip(batches, plan, settles):
        for bins, src, dst in step:  # before a settle, rows an advance left pending move with their bins
            run.move(bins, src, dst)
        run.feed(stream, batch)
        run.advance(hold)
        if settle:
            run.settle()
    run.end()
    want = unmoved(op, streams, batches, [hold for hold, _ in plan])
    assert run.rows() == want, f"owners {run.owner.tolist()}"


@pytest.mark.parametrize("kind", list(KINDS))
@given(data=st.data())
def test_a_copy_continues_as_its_source_does(kind, data):
    """copy_bins into a new instance at a random point; both then get the rows of the copied bins.
    The copy emits what the source emits for those bins after that point, and the source's own
    output is the unmoved run's."""
    op, streams = operator(kind)
    batches = data.draw(inputs(streams))
    holds = data.draw(st.lists(st.booleans(), min_size=len(batches), max_size=len(batches)))
    at = data.draw(st.integers(0, len(batches)))
    bins = data.draw(st.one_of(st.none(), st.sets(st.integers(0, BINS - 1), min_size=1)))
    run, before = Run(op, streams), None
    for n, ((stream, batch), hold) in enumerate(zip(batches, holds)):
        if n == at:
            run.move(bins, 0, NEW, copy=True)
            before = len(run.out[0])
        run.feed(stream, batch)
        run.advance(hold)
    if before is None:
        run.move(bins, 0, NEW, copy=True)
        before = len(run.out[0])
    run.end()
    assert run.rows(0) == unmoved(op, streams, batches, holds)
    names = op.schema.names + [columns.SEQ, columns.ID]
    after = Counter(tuple(r.values()) for b in run.out[0][before:]
                    for r in b.filter(pa.array(np.ones(b.num_rows, bool) if bins is None else
                                               np.isin(bins_of(b, ["k"]), sorted(bins)))).select(names).to_pylist())
    assert run.rows(1) == after


def test_a_join_moved_to_a_new_instance_never_fires_a_window_again():
    """Sliding windows: the moved rows at 0 and 0.5 s are in window [-3 s, 1 s), which fired before the
    move, and in later ones still open. A row that comes late for that window (0.25 s) must not make
    the new instance fire it again: it takes the sender's ``fired``."""
    op, streams = operator("join")
    half = [T0 + i * S // 2 for i in range(8)]
    times = [half[0:3], half[3:6], [T0 + S // 4, half[6], half[7]]]
    sends = [(s, [{"k": "a", "ts": t, "v": i, "s": None} for t in ts]) for i, ts in enumerate(times) for s in streams]
    batches, _ = stamp_batches(sends, {s: "ts" for s in streams}, {s: EV for s in streams})
    run = Run(op, streams)
    for n, (stream, batch) in enumerate(batches):
        if n == 4:
            assert run.instances[0].join.fired == T0 - 2 * S  # window -3 s fired at watermark 2.5 s
            run.move(None, 0, NEW)
        run.feed(stream, batch)
        run.advance(False)
    run.end()
    assert run.instances[1].join.fired > T0 and run.rows(1)
    assert run.rows() == unmoved(op, streams, batches, [False] * len(batches))


def test_a_join_gathered_from_two_instances_fires_the_windows_neither_fired():
    """Key 'c' (bin 6) stays on instance 0, key 'a' (bin 4) moves to instance 1; both see the same
    watermarks. Then both bins go to one new instance: its window [-3 s, 1 s) holds the pair of 'c'
    and has fired nowhere. (An instance counted the windows before its own earliest rows as fired:
    -2 s on instance 1, so the new instance never fired [-3 s, 1 s).)"""
    op, streams = operator("join")
    row = lambda k, t: {"k": k, "ts": T0 + t, "v": None, "s": "x"}  # noqa: E731
    sends = [("ev", [row("c", 0)]), ("ev", [row("a", S)]), ("ev2", [row("c", 0)]), ("ev2", [row("a", S)])]
    batches, _ = stamp_batches(sends, {s: "ts" for s in streams}, {s: EV for s in streams})
    assert [int(bins_of(b, ["k"])[0]) for _, b in batches] == [6, 4, 6, 4]
    run = Run(op, streams)
    for n, (stream, batch) in enumerate(batches):
        if n == 1:
            run.move({4}, None, NEW)
        run.feed(stream, batch)
        run.advance(False)
    assert run.instances[0].join.fired == run.instances[1].join.fired  # the same watermark, the same windows
    run.move({4, 6}, None, NEW)
    run.end()
    assert run.rows() == unmoved(op, streams, batches, [False] * len(batches))


@pytest.mark.parametrize("kind", ["tuples", "running", "custom"])
def test_taking_every_bin_empties_an_instance_and_a_new_one_continues(kind):
    """take_bins(None): state, pending tuples and progress; the new instance continues tuple positions
    and the step its rows' ids derive from."""
    op, streams = operator(kind)
    rng = random.Random(5)
    rows = [{"k": rng.choice(KEYS), "ts": T0 + i * S, "v": i, "s": rng.choice(WORDS)} for i in range(90)]
    batches, _ = stamp_batches([("ev", rows[:50]), ("ev", rows[50:70]), ("ev", rows[70:])], {"ev": "ts"},
                               {"ev": EV})

    def run(move: bool) -> Run:
        r = Run(op, streams)
        r.feed(*batches[0])
        r.advance(False)
        r.feed(*batches[1])
        r.advance(True)  # the second batch stays pending, the same frontier again
        r.advance(True)  # and again: the step counts the advances at one frontier
        if move:
            moved = r.instances[0].take_bins()
            assert moved.bins is None and moved.pending[0].num_rows == 20 and moved.progress.step == (49, 2)
            r.instances.append(physical(op, BINS))
            r.out.append([])
            r.instances[1].put_bins(moved)
            r.owner[:] = 1
            left = r.instances[0].take_bins()
            assert left.nbytes == 0 and not left.state and left.pending == [None]  # nothing left
            r.before = len(r.out[0])
        r.feed(*batches[2])
        r.advance(True)
        r.end()
        return r

    moved = run(True)
    assert moved.out[0][moved.before:] == []  # nothing after the move
    assert moved.rows() == run(False).rows()


def half_moved(op, streams, sends, schemas, seed) -> pd.DataFrame:
    """``sends`` through instance 0; halfway, half of the bins move to a new instance (pending tuples
    with them); the output's visible fields."""
    rng = random.Random(seed)
    batches, _ = stamp_batches(sends, {s: "ts" for s in streams}, schemas)
    run = Run(op, streams)
    for n, (stream, batch) in enumerate(batches):
        if n == len(batches) // 2:
            run.move(rng.sample(range(BINS), BINS // 2), None, NEW)
        run.feed(stream, batch)
        run.advance(hold=n % 3 == 1)
    run.end()
    names = op.schema.names
    return plain(pa.Table.from_batches([b.select(names) for out in run.out for b in out if b.num_rows],
                                       schema=op.schema.to_arrow()))


@pytest.mark.parametrize("window", [ref.Time(5 * S), ref.Time(6 * S, 2 * S, lateness=2 * S), ref.Tuples(3, 2)],
                         ids=repr)
@pytest.mark.parametrize("by", [["k"], ["k", "g"]])
def test_aggregate_with_moved_bins_gives_the_reference_windows(window, by):
    rows = events(240, random.Random(1), disorder_s=1.5)
    sends = [("ev", rows[i:i + 17]) for i in range(0, 240, 17)]
    funcs = [("n", "count", None), ("sv", "sum", "v"), ("ax", "avg", "x"), ("mins", "min", "s"),
             ("ls", "last", "s"), ("fx", "first", "x")]
    q = cep.Query("agg")
    q.output("out", q.stream("ev", EVENTS).aggregate(cep_window(window), by=by, **cep_funcs(funcs)))
    got = half_moved(q.outputs["out"], ["ev"], sends, {"ev": EVENTS}, seed=2)
    want, _ = ref.aggregate(ref.stamp(sends, {"ev": "ts"})["ev"], window, by, funcs)
    assert_same_rows(got, want)


def test_join_with_moved_bins_gives_the_reference_pairs():
    window = ref.Time(6 * S, 2 * S, lateness=2 * S)
    left, right = sides(120, random.Random(3), disorder_s=2.0)
    sends = [(s, rows[i:i + 11]) for i in range(0, 120, 11) for s, rows in (("l", left), ("r", right))]
    q = cep.Query("join")
    q.output("out", q.stream("l", LEFT).join(q.stream("r", RIGHT), cep_window(window), on=["k"],
                                             where=cep.col("a") <= cep.col("b")))
    got = half_moved(q.outputs["out"], ["l", "r"], sends, {"l": LEFT, "r": RIGHT}, seed=4)
    st_ = ref.stamp(sends, {"l": "ts", "r": "ts"})
    want, _ = ref.join(st_["l"], st_["r"], LEFT, RIGHT, window, ["k"], ref.Bin("<=", ref.Col("a"), ref.Col("b")))
    assert_same_rows(got, want)


def test_a_bin_state_pickles_its_arrays_as_whole_buffers():
    """Half of a 10^6-key window aggregate's bins (~500K entries, 96 MiB) pickle with protocol 5 as a few
    whole buffers and a small header: no per-entry object (what made it slow). It asserted under 100 ms,
    which a slow host missed (0.109 s) with the buffers whole."""
    op, _ = operator("tumbling")
    agg = WindowAggregate(op.window, op.by, {"n": cep.count()}, op.inputs[0].schema, op.schema, 4096, "w")
    n = 1_000_000
    keys = pa.array(np.char.add("10.", np.arange(n).astype(str)))
    batch = pa.RecordBatch.from_arrays(
        [keys, pa.array(np.full(n, T0), pa.timestamp("us")), pa.array(np.zeros(n, np.int64)),
         pa.array([None] * n, pa.string()), pa.array(np.arange(n)), pa.array(np.zeros(n, np.int64)),
         pa.array(np.full(n, T0)), pa.array(np.full(n, WM_NONE))], names=list(EV) + list(columns.HIDDEN))
    agg.add(batch)
    part = agg.take_bins(np.arange(0, 4096, 2))
    assert 480_000 < part.meta[:, 0].sum() < 520_000
    state = BinState(np.arange(0, 4096, 2), part, [None])
    buffers = []
    header = pickle.dumps(state, protocol=5, buffer_callback=buffers.append)
    assert len(header) < 4096 and len(buffers) <= 8, (len(header), len(buffers))
    assert sum(b.raw().nbytes for b in buffers) == state.nbytes
    back = pickle.loads(pickle.dumps(state, protocol=5))
    assert (back.state.ent == part.ent).all() and back.nbytes == state.nbytes


def test_an_advance_adds_the_rows_of_windows_still_open_once_the_results_are_out():
    """A batch reaching past the window that fires is split: the rows of that window are added before
    it fires, the others stay pending until :meth:`settle` (migration moves them as pending rows)."""
    op, _ = operator("sliding, order-free")
    inst = physical(op, BINS)
    sends = [("ev", [{"k": "a", "ts": T0 + s * S, "v": 1, "s": "x"} for s in (0, 1, 2, 9, 10)])]
    (_, batch), = stamp_batches(sends, {"ev": "ts"}, {"ev": EV})[0]
    inst.process(0, batch)
    out = pa.Table.from_batches(list(inst.advance(4, T0 + 8 * S)))  # fires the windows ending by 6 s
    assert set(out.column("n").to_pylist()) == {1, 2, 3}
    assert [int(t) for b in inst.pending[0] for t in b.column(columns.TS).to_numpy()] == [T0 + 9 * S, T0 + 10 * S]
    inst.settle()
    assert inst.pending == [[]]
