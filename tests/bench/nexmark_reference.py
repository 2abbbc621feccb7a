"""NEXMark Q5, Q7 and Q8 in pandas, written from the queries' definitions (not from sparkcep):
the reference the sparkcep queries and the Spark ones are checked against.

Frames have event times as int64 microseconds; results are sorted frames of the columns
:data:`sparkcep.bench.nexmark_queries.OUTPUT_DDL` names.
"""

import numpy as np
import pandas as pd


def tumbling(t: pd.Series, size: int) -> pd.Series:
    return t // size * size


def q5(bids: pd.DataFrame, size: int, slide: int) -> pd.DataFrame:
    """Per sliding window, the auctions with the most bids (all of them on a tie)."""
    last = bids.date_time // slide * slide
    parts = [pd.DataFrame({"window_start": last - k * slide, "auction": bids.auction})
             for k in range((size + slide - 1) // slide)]
    every = pd.concat(parts)
    counts = every.groupby(["window_start", "auction"], as_index=False).size().rename(columns={"size": "num"})
    top = counts.groupby("window_start").num.transform("max")
    out = counts[counts.num == top].assign(window_end=lambda d: d.window_start + size)
    return tidy(out[["window_start", "window_end", "auction", "num"]])


def q7(bids: pd.DataFrame, size: int) -> pd.DataFrame:
    """Per tumbling window, the bids at the window's highest price."""
    b = bids.assign(window_start=tumbling(bids.date_time, size))
    best = b[b.price == b.groupby("window_start").price.transform("max")]
    out = best.assign(window_end=best.window_start + size)
    return tidy(out[["window_start", "window_end", "auction", "bidder", "price", "date_time"]])


def q8(persons: pd.DataFrame, auctions: pd.DataFrame, size: int) -> pd.DataFrame:
    """People who opened an auction in the tumbling window they registered in."""
    p = persons.assign(window_start=tumbling(persons.date_time, size))
    a = auctions.assign(window_start=tumbling(auctions.date_time, size))[["window_start", "seller"]].drop_duplicates()
    out = p.merge(a, left_on=["window_start", "id"], right_on=["window_start", "seller"])
    out = out.assign(window_end=out.window_start + size)
    return tidy(out[["window_start", "window_end", "id", "name"]])


def tidy(df: pd.DataFrame) -> pd.DataFrame:
    """Sorted by every column, index reset, integer columns as int64."""
    df = df.sort_values(list(df.columns)).reset_index(drop=True)
    return df.astype({c: np.int64 for c in df.columns if df[c].dtype.kind in "iu"})


def as_frame(table) -> pd.DataFrame:
    """A pyarrow table (or batch) as a frame with timestamps as int64 microseconds."""
    import pyarrow as pa
    cols = {}
    for f in table.schema:
        c = table.column(f.name)
        cols[f.name] = (c.cast(pa.int64()) if pa.types.is_timestamp(f.type) else c).to_numpy(zero_copy_only=False)
    return pd.DataFrame(cols)
