"""NEXMark input: an online auction's people, auctions and bids, generated columnar.

As NEXMark's generator (the Beam / Flink ``nexmark`` benchmarks) does, event
``i`` of the stream is one of 50 kinds by ``i % 50``: 1 in 50 is a new person,
3 a new auction, 46 a bid. Ids count up from 1000 in event order. A bid goes,
with probability 1/2, to the *hot* auction — the newest auction id rounded
down to a multiple of 100 — and otherwise to one of the 100 newest
auctions; bidders and sellers are hot (the newest person id rounded down to
a multiple of 100) with probability 3/4, and otherwise one of the 1000
newest people. Prices are ``round(10 ** U(0, 6) * 100)`` cents. Strings come
from fixed pools; ``extra`` pads an event to NEXMark's average sizes
(person 200 bytes, auction 500, bid 100).

Every field of event ``i`` is a pure function of ``(seed, i)`` (the
counter-based hash of :func:`sparkcep.bench.generator.mix`), so any slice of
the stream can be made on its own, in any chunking. Event times are given by
the caller (the driver's schedule, or :meth:`Nexmark.event_times`).

>>> g = Nexmark(seed=1)
>>> parts = g.events(0, 100, g.event_times(0, 100, 1_700_000_000_000_000, 1000))
>>> [(k, b.num_rows) for k, b in parts.items()]
[('person', 2), ('auction', 6), ('bid', 92)]
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkcep.bench.generator import mix

PERSON_DDL = ("id int64, name string, email_address string, credit_card string, city string, state string, "
              "date_time timestamp, extra string")
AUCTION_DDL = ("id int64, item_name string, description string, initial_bid int64, reserve int64, "
               "date_time timestamp, expires timestamp, seller int64, category int64, extra string")
BID_DDL = "auction int64, bidder int64, price int64, channel string, url string, date_time timestamp, extra string"
DDL = {"person": PERSON_DDL, "auction": AUCTION_DDL, "bid": BID_DDL}
KINDS = ("person", "auction", "bid")

PROPORTION = 50  # events per cycle: 1 person, 3 auctions, 46 bids
PERSONS, AUCTIONS = 1, 3
FIRST_ID = 1000
HOT_RATIO = 100  # hot ids are multiples of this
IN_FLIGHT_AUCTIONS, ACTIVE_PEOPLE = 100, 1000
CATEGORIES, FIRST_CATEGORY = 5, 10
FLUSH_IDS = ("id", "seller", "auction", "bidder", "price")  # -1 in flush events

_FIRST = ["Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter"]
_LAST = ["Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris"]
_CITIES = ["Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle",
           "Kent", "Cheyenne"]
_STATES = ["AZ", "CA", "ID", "OR", "WA", "WY"]
_CHANNELS = ["Google", "Facebook", "Baidu", "Apple"]
_FIELD = {name: k for k, name in enumerate(
    ["kind", "first", "last", "city", "state", "card", "item", "desc", "initial", "reserve", "expires",
     "category", "seller_hot", "seller", "auction_hot", "auction", "bidder_hot", "bidder", "price", "channel",
     "url", "extra"], start=20)}


def _uniform(seed: int, field: str, idx: np.ndarray) -> np.ndarray:
    """U[0, 1) per event index, independent per field."""
    return (mix(seed, _FIELD[field], idx) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def _pick(seed: int, field: str, idx: np.ndarray, n: int) -> np.ndarray:
    """An int in [0, n) per event index."""
    return (mix(seed, _FIELD[field], idx) % np.uint64(n)).astype(np.int64)


def _words(rng: np.random.Generator, n: int, lo: int, hi: int) -> pa.Array:
    lengths = rng.integers(lo, hi + 1, n)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = rng.integers(ord("a"), ord("z") + 1, int(offsets[-1]), dtype=np.uint8)
    data[rng.random(len(data)) < 0.15] = ord(" ")
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _price(u: np.ndarray) -> np.ndarray:
    return np.round(10.0 ** (u * 6.0) * 100.0).astype(np.int64)


class Nexmark:
    """The NEXMark event stream of one seed; :meth:`events` makes any slice of it."""

    def __init__(self, seed: int = 0):
        self.seed = seed
        rng = np.random.default_rng([seed, 0x4E58])
        self.items = _words(rng, 1000, 6, 20)
        self.descriptions = _words(rng, 1000, 60, 140)
        self.urls = pa.array([f"https://www.nexmark.com/{w}/item.htm?query=1" for w in
                              _words(rng, 1000, 4, 12).to_pylist()])
        # extra: padding to NEXMark's average sizes (bytes of the other fields subtracted)
        self._pad = {k: _words(np.random.default_rng([seed, i]), 256, 0, 2 * v) for i, (k, v) in
                     enumerate({"person": 110, "auction": 320, "bid": 15}.items())}

    # --- event numbers ---------------------------------------------------------------
    @staticmethod
    def kind_of(idx: np.ndarray) -> np.ndarray:
        """0 person, 1 auction, 2 bid, per event index."""
        off = idx % PROPORTION
        return np.where(off < PERSONS, 0, np.where(off < PERSONS + AUCTIONS, 1, 2))

    @staticmethod
    def event_times(start: int, n: int, base_us: int, rate: float) -> np.ndarray:
        """Event times (us) of events ``start .. start+n-1`` at ``rate`` events/s from ``base_us``."""
        return base_us + (np.arange(start, start + n, dtype=np.float64) * (1e6 / rate)).astype(np.int64)

    @staticmethod
    def _last_ids(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(newest person id, newest auction id) from 0, as of each event index (itself included)."""
        cycle, off = idx // PROPORTION, idx % PROPORTION
        persons = cycle * PERSONS + np.minimum(off + 1, PERSONS) - 1
        auctions = cycle * AUCTIONS + np.clip(off - PERSONS + 1, 0, AUCTIONS) - 1
        return persons, auctions

    # --- the three kinds -------------------------------------------------------------
    def events(self, start: int, n: int, times_us: np.ndarray, kinds=KINDS) -> dict[str, pa.RecordBatch]:
        """Events ``start .. start+n-1`` (event times ``times_us``), split by kind: only ``kinds``."""
        idx = np.arange(start, start + n, dtype=np.int64)
        kind = self.kind_of(idx)
        times_us = np.asarray(times_us, np.int64)
        make = {"person": self._persons, "auction": self._auctions, "bid": self._bids}
        return {k: make[k](idx[kind == i], times_us[kind == i]) for i, k in enumerate(KINDS) if k in kinds}

    def _persons(self, idx: np.ndarray, t: np.ndarray) -> pa.RecordBatch:
        s = self.seed
        first = pa.array(_FIRST).take(pa.array(_pick(s, "first", idx, len(_FIRST))))
        last = pa.array(_LAST).take(pa.array(_pick(s, "last", idx, len(_LAST))))
        name = pc.binary_join_element_wise(first, last, " ")
        email = pc.utf8_lower(pc.binary_join_element_wise(pc.binary_join_element_wise(first, last, "."),
                                                          "example.com", "@"))
        return pa.RecordBatch.from_arrays([
            pa.array(self._last_ids(idx)[0] + FIRST_ID), name, email, _card_numbers(_pick(s, "card", idx, 10 ** 16)),
            pa.array(_CITIES).take(pa.array(_pick(s, "city", idx, len(_CITIES)))),
            pa.array(_STATES).take(pa.array(_pick(s, "state", idx, len(_STATES)))),
            pa.array(t, pa.timestamp("us")), self._extra("person", idx)], names=_names(PERSON_DDL))

    def _auctions(self, idx: np.ndarray, t: np.ndarray) -> pa.RecordBatch:
        s = self.seed
        persons, auctions = self._last_ids(idx)
        initial = _price(_uniform(s, "initial", idx))
        reserve = initial + _price(_uniform(s, "reserve", idx))
        expires = t + 1_000_000 + _pick(s, "expires", idx, 20_000_000)
        return pa.RecordBatch.from_arrays([
            pa.array(auctions + FIRST_ID),
            self.items.take(pa.array(_pick(s, "item", idx, len(self.items)))),
            self.descriptions.take(pa.array(_pick(s, "desc", idx, len(self.descriptions)))),
            pa.array(initial), pa.array(reserve), pa.array(t, pa.timestamp("us")),
            pa.array(expires, pa.timestamp("us")), pa.array(self._someone(idx, persons, "seller") + FIRST_ID),
            pa.array(_pick(s, "category", idx, CATEGORIES) + FIRST_CATEGORY), self._extra("auction", idx)],
            names=_names(AUCTION_DDL))

    def _bids(self, idx: np.ndarray, t: np.ndarray) -> pa.RecordBatch:
        s = self.seed
        persons, auctions = self._last_ids(idx)
        hot = _uniform(s, "auction_hot", idx) < 0.5
        recent = np.maximum(auctions - _pick(s, "auction", idx, IN_FLIGHT_AUCTIONS), 0)
        auction = np.where(hot, auctions // HOT_RATIO * HOT_RATIO, recent)
        return pa.RecordBatch.from_arrays([
            pa.array(auction + FIRST_ID), pa.array(self._someone(idx, persons, "bidder") + FIRST_ID),
            pa.array(_price(_uniform(s, "price", idx))),
            pa.array(_CHANNELS).take(pa.array(_pick(s, "channel", idx, len(_CHANNELS)))),
            self.urls.take(pa.array(_pick(s, "url", idx, len(self.urls)))),
            pa.array(t, pa.timestamp("us")), self._extra("bid", idx)], names=_names(BID_DDL))

    def _someone(self, idx: np.ndarray, persons: np.ndarray, role: str) -> np.ndarray:
        """A seller or bidder (from 0): hot with probability 3/4, else one of the newest people."""
        hot = _uniform(self.seed, f"{role}_hot", idx) < 0.75
        recent = np.maximum(persons - _pick(self.seed, role, idx, ACTIVE_PEOPLE), 0)
        return np.where(hot, persons // HOT_RATIO * HOT_RATIO, recent)

    def _extra(self, kind: str, idx: np.ndarray) -> pa.Array:
        pool = self._pad[kind]
        return pool.take(pa.array(_pick(self.seed, "extra", idx, len(pool))))


class NexmarkSource:
    """NEXMark events as the driver's input (:class:`sparkcep.bench.driver.Source`): the streams
    ``kinds`` (those a query reads), events rendered once by :meth:`prepare`, then re-timed per chunk.

    Sent as fast as possible, event times follow the generator's schedule at
    ``nominal_rate`` events/s (NEXMark: event time comes from the generator).
    """

    def __init__(self, gen: Nexmark, kinds=KINDS, nominal_rate: float = 100_000.0):
        self.gen, self.streams, self.nominal_rate = gen, tuple(kinds), nominal_rate
        self.ddl = {k: DDL[k] for k in self.streams}
        self._cache: dict[str, pa.RecordBatch] = {}
        self._events = 0

    def prepare(self, events: int) -> None:
        if events > self._events:
            self._cache = self.gen.events(0, events, np.zeros(events, np.int64), self.streams)
            self._events = events

    def batches(self, start: int, n: int, times_us: np.ndarray) -> list[tuple[str, pa.RecordBatch]]:
        self.prepare(start + n)
        kind = Nexmark.kind_of(np.arange(start, start + n, dtype=np.int64))
        lo, hi = kinds_before(start), kinds_before(start + n)
        out = []
        for i, k in enumerate(KINDS):
            if k in self.streams:
                batch = self._cache[k].slice(lo[i], hi[i] - lo[i])
                out.append((k, retime(batch, np.asarray(times_us, np.int64)[kind == i])))
        return out

    def flush(self, at_us: int) -> list[tuple[str, pa.RecordBatch]]:
        """One event per stream at ``at_us``, its ids -1 (no one's): what closes the open windows of
        an engine without end of input (Spark)."""
        out = []
        for k, b in self.gen.events(0, PROPORTION, np.full(PROPORTION, at_us, np.int64), self.streams).items():
            b = b.slice(0, 1)
            cols = [pa.array([-1], pa.int64()) if f in FLUSH_IDS else c for f, c in zip(b.schema.names, b.columns)]
            out.append((k, pa.RecordBatch.from_arrays(cols, schema=b.schema)))
        return out


def kinds_before(idx: int) -> tuple[int, int, int]:
    """How many persons, auctions and bids events ``0 .. idx-1`` hold."""
    cycles, off = divmod(idx, PROPORTION)
    persons = cycles * PERSONS + min(off, PERSONS)
    auctions = cycles * AUCTIONS + min(max(off - PERSONS, 0), AUCTIONS)
    return persons, auctions, idx - persons - auctions


def retime(batch: pa.RecordBatch, times_us: np.ndarray) -> pa.RecordBatch:
    """``batch`` with event times ``times_us`` (an auction's ``expires`` moves with it)."""
    names = batch.schema.names
    old = batch.column("date_time").cast(pa.int64()).to_numpy()
    cols = list(batch.columns)
    cols[names.index("date_time")] = pa.array(times_us, pa.timestamp("us"))
    if "expires" in names:
        until = batch.column("expires").cast(pa.int64()).to_numpy() - old
        cols[names.index("expires")] = pa.array(times_us + until, pa.timestamp("us"))
    return pa.RecordBatch.from_arrays(cols, schema=batch.schema)


def _card_numbers(numbers: np.ndarray) -> pa.Array:
    """16-digit numbers as ``dddd dddd dddd dddd``."""
    n = len(numbers)
    digits = (numbers[:, None] // 10 ** np.arange(15, -1, -1, dtype=np.int64)) % 10
    out = np.full((n, 19), ord(" "), np.uint8)
    out[:, [c + c // 4 for c in range(16)]] = digits + ord("0")
    offsets = np.arange(0, 19 * n + 1, 19, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(out.ravel())])


def _names(ddl: str) -> list[str]:
    return [f.split()[0] for f in ddl.split(",")]
