"""The NEXMark generator (shape, proportions, determinism) and Q5, Q7, Q8 on sparkcep against the
pandas reference, in one instance, in parallel and on instance managers."""

import numpy as np
import pyarrow as pa
import pytest

import nexmark_reference as ref
import sparkcep as cep
from sparkcep.bench import nexmark_queries as nq
from sparkcep.bench.nexmark import DDL, KINDS, Nexmark, NexmarkSource, kinds_before

T0 = 1_700_000_000_300_000  # not window-aligned


def test_events_have_nexmark_proportions_shapes_and_ids():
    g = Nexmark(seed=3)
    n = 50_000
    parts = g.events(0, n, g.event_times(0, n, T0, 10_000))
    assert [parts[k].num_rows for k in KINDS] == [1_000, 3_000, 46_000]
    for k in KINDS:
        assert parts[k].schema == cep.Schema(DDL[k]).to_arrow()
    p, a, b = (ref.as_frame(parts[k]) for k in KINDS)
    assert p.id.tolist() == list(range(1000, 2000)) and a.id.tolist() == list(range(1000, 4000))
    # sellers and bidders are people already registered, bids go to auctions already opened
    for ids, when, of in ((a.seller, a.date_time, p), (b.bidder, b.date_time, p), (b.auction, b.date_time, a)):
        registered = of.set_index("id").date_time.reindex(ids).to_numpy()
        assert (registered <= when.to_numpy()).all()
    hot = b.auction.value_counts()
    assert hot.iloc[0] > 20 * hot.median()  # hot auctions
    assert p.credit_card.str.fullmatch(r"\d{4} \d{4} \d{4} \d{4}").all()
    assert p.email_address.str.endswith("@example.com").all()
    assert (a.reserve > a.initial_bid).all() and (a.expires > a.date_time).all()
    assert 100 <= b.price.min() and b.price.max() <= 100_000_000
    sizes = {k: parts[k].nbytes / parts[k].num_rows for k in KINDS}
    assert 150 < sizes["person"] < 260 and 400 < sizes["auction"] < 650 and 80 < sizes["bid"] < 150


def test_any_slice_equals_the_same_slice_of_the_whole():
    g, other = Nexmark(seed=7), Nexmark(seed=7)
    t = g.event_times(0, 5000, T0, 1000)
    whole = g.events(0, 5000, t)
    for start, n in ((0, 1), (1, 49), (50, 2000), (2050, 2950)):
        part = other.events(start, n, t[start:start + n])
        for i, k in enumerate(KINDS):
            lo, hi = kinds_before(start)[i], kinds_before(start + n)[i]
            assert part[k].equals(whole[k].slice(lo, hi - lo)), (k, start)
    assert not Nexmark(seed=8).events(0, 100, t[:100])["bid"].equals(whole["bid"].slice(0, 92))


def test_the_driver_source_retimes_rendered_events():
    g = Nexmark(seed=2)
    src = NexmarkSource(g, ("person", "auction"))
    src.prepare(3000)
    t = np.arange(1000, 2500) * 7 + T0
    got = dict(src.batches(1000, 1500, t))
    assert set(got) == {"person", "auction"}
    want = g.events(1000, 1500, t, ("person", "auction"))
    assert all(got[k].equals(want[k]) for k in want)
    flush = dict(src.flush(T0))
    assert flush["person"].column("id").to_pylist() == [-1] and flush["auction"].column("seller").to_pylist() == [-1]


def run_query(name, parallelism=1, workers=0, scale=10, events=30_000, chunk=1_000):
    g = Nexmark(seed=3)
    sent = {k: [] for k in nq.STREAMS[name]}
    with cep.Engine.local(workers=workers) as e:
        e.deploy(nq.query(name, scale), parallelism=parallelism)
        for s in range(0, events, chunk):
            for k, b in g.events(s, chunk, g.event_times(s, chunk, T0, 1000), nq.STREAMS[name]).items():
                if b.num_rows:
                    e.send(k, b)
                    sent[k].append(b)
        for k in nq.STREAMS[name]:
            e.end(k)
        got = e.collect(name)
    assert got.schema == cep.Schema(nq.OUTPUT_DDL[name]).to_arrow()
    f = {k: ref.as_frame(pa.Table.from_batches(v)) for k, v in sent.items()}
    size, adv = nq.windows_us(name, scale)
    want = {"q5": lambda: ref.q5(f["bid"], size, adv), "q7": lambda: ref.q7(f["bid"], size),
            "q8": lambda: ref.q8(f["person"], f["auction"], size)}[name]()
    return ref.tidy(ref.as_frame(got)), want


@pytest.mark.parametrize("name", nq.QUERIES)
@pytest.mark.parametrize("parallelism", [1, 3])
def test_queries_equal_the_reference(name, parallelism):
    got, want = run_query(name, parallelism)
    assert len(want) > 5
    assert got.equals(want), f"{name}: {len(got)} rows, want {len(want)}\n{got.head()}\n{want.head()}"


def test_queries_on_instance_managers_equal_the_reference():
    for name in nq.QUERIES:
        got, want = run_query(name, parallelism=2, workers=2, events=20_000)
        assert got.equals(want), name


def test_unknown_query():
    with pytest.raises(ValueError, match="unknown NEXMark query"):
        nq.query("q99")
