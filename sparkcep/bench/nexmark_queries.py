"""NEXMark Q5, Q7 and Q8 as sparkcep queries, on the streams ``person``, ``auction`` and ``bid``
of :mod:`sparkcep.bench.nexmark`.

* **q5** (hot items) — bids per auction over sliding windows (``size``,
  advancing by ``slide``); per window, the auctions with the most bids.
  Written as NEXMark's SQL is: a windowed count per auction, the max of
  those counts per window, and a join of the two on the window where the
  count equals the max (ties all kept).
* **q7** (highest bid) — per tumbling window, the bids whose price is the
  window's highest: a window max, joined back with the bids of the window
  on ``price = max``.
* **q8** (new users) — people who opened an auction in the tumbling window
  they registered in: the sellers of each window (auctions grouped by
  seller), joined with the people of the window on ``id = seller``.

Every result row has ``window_start``/``window_end`` (of Q5's sliding
window; of Q7's and Q8's tumbling one) and the fields NEXMark's queries
select. Windows are NEXMark's (Q5 10 s sliding by 2 s, Q7 and Q8 10 s)
divided by ``scale``: the latency runs use ``scale=100`` so that a 25 s run
closes hundreds of windows.
"""

from __future__ import annotations

import sparkcep as cep
from sparkcep.bench.nexmark import DDL

QUERIES = ("q5", "q7", "q8")
STREAMS = {"q5": ("bid",), "q7": ("bid",), "q8": ("person", "auction")}
WINDOWS_US = {"q5": (10_000_000, 2_000_000), "q7": (10_000_000, 10_000_000), "q8": (10_000_000, 10_000_000)}
OUTPUT_DDL = {"q5": "window_start timestamp, window_end timestamp, auction int64, num int64",
              "q7": "window_start timestamp, window_end timestamp, auction int64, bidder int64, price int64, "
                    "date_time timestamp",
              "q8": "window_start timestamp, window_end timestamp, id int64, name string"}


def windows_us(name: str, scale: int = 1) -> tuple[int, int]:
    """(size, advance) in us of query ``name``'s window at ``scale``."""
    size, advance = WINDOWS_US[name]
    return size // scale, advance // scale


def query(name: str, scale: int = 1) -> cep.Query:
    """The sparkcep query NEXMark ``name``; its one output is named like it."""
    if name not in QUERIES:
        raise ValueError(f"unknown NEXMark query {name!r}; queries: {', '.join(QUERIES)}")
    size, advance = (f"{us}us" for us in windows_us(name, scale))
    q = cep.Query(name)
    streams = {s: q.stream(s, DDL[s], time="date_time") for s in STREAMS[name]}
    q.output(name, {"q5": _q5, "q7": _q7, "q8": _q8}[name](streams, size, advance))
    return q


def _q5(s, size, advance) -> cep.Stream:
    counts = s["bid"].aggregate(cep.TimeWindow(size, advance=advance), by="auction", name="bids_per_auction",
                                num=cep.count())
    counts = counts.map(wstart="window_start", wend="window_end", auction="auction", num="num", name="counts")
    top = counts.aggregate(cep.TimeWindow(advance), by="wend", name="max_per_window", maxn=cep.max("num"))
    top = top.map(wend="wend", maxn="maxn", name="maxes")
    hot = counts.join(top, cep.TimeWindow(advance), on="wend", where=cep.col("num") == cep.col("maxn"), name="hot")
    return hot.map(window_start="wstart", window_end="wend", auction="auction", num="num", name="q5")


def _q7(s, size, advance) -> cep.Stream:
    bids = s["bid"].map(auction="auction", bidder="bidder", price="price", date_time="date_time", name="bids")
    top = bids.aggregate(cep.TimeWindow(size), name="max_price", maxprice=cep.max("price"))
    top = top.map(maxprice="maxprice", name="maxes")
    best = bids.join(top, cep.TimeWindow(size), on=[("price", "maxprice")], name="highest")
    return best.map(window_start="window_start", window_end="window_end", auction="auction", bidder="bidder",
                    price="price", date_time="date_time", name="q7")


def _q8(s, size, advance) -> cep.Stream:
    people = s["person"].map({"id": "id", "name": "name"}, name="people")
    sellers = s["auction"].aggregate(cep.TimeWindow(size), by="seller", name="sellers", auctions=cep.count())
    sellers = sellers.map(seller="seller", name="new_sellers")
    joined = people.join(sellers, cep.TimeWindow(size), on=[("id", "seller")], name="new_users")
    return joined.map({"window_start": "window_start", "window_end": "window_end", "id": "id", "name": "name"},
                      name="q8")
