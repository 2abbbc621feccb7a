"""The benchmark workloads as Spark Structured Streaming queries, beside the sparkcep ones
(:mod:`sparkcep.bench.workloads`, :mod:`sparkcep.bench.nexmark_queries`).

HiBench, over a stream of ``(key timestamp, value string)``:

* identity — ``select(key, value)``, append mode;
* repartition — ``repartition(N)``, append mode;
* wordcount — ``groupBy(ip).count()``, update mode (HiBench's
  ``StructuredWordCount`` uses complete mode, which re-emits every IP every
  batch; update mode is the running count sparkcep emits);
* fixwindow — ``withWatermark(key, 0 s).groupBy(window(key, 10 s), ip)
  .agg(count, min(key))``, append mode: a window leaves once, when the
  watermark passes its end, as in sparkcep.

NEXMark, over streams ``person``, ``auction``, ``bid`` (watermark 0 s on
``date_time``), append mode, written as NEXMark's SQL is (Flink's
``nexmark`` queries): Q5 a sliding count per auction joined with its max per
window, Q7 a tumbling max joined back with the window's bids, Q8 the people
of a window joined with the sellers of the same window. Joins are on the
``window`` struct Spark's ``window()`` makes, so its join state is evicted
by the watermark.
"""

from __future__ import annotations

from sparkcep.bench import nexmark_queries, workloads


def _window(us: int) -> str:
    return f"{us} microseconds"


def hibench_df(workload: str, source, instances: int = 2, window_us: int = workloads.WINDOW_US):
    """(streaming DataFrame, output mode) of HiBench ``workload`` over ``source`` (key, value)."""
    from pyspark.sql import functions as F
    if workload == "identity":
        return source.select("key", "value"), "append"
    if workload == "repartition":
        return source.repartition(instances), "append"
    ip = F.substring_index(F.col("value"), ",", 1).alias("ip")
    if workload == "wordcount":
        return source.select(ip).groupBy("ip").count(), "update"
    if workload == "fixwindow":
        rows = source.select(ip, F.col("key")).withWatermark("key", "0 seconds")
        agg = rows.groupBy(F.window("key", _window(window_us)), "ip").agg(
            F.count(F.lit(1)).alias("count"), F.min("key").alias("first"))
        return agg.select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"),
                          "ip", "count", "first"), "append"
    raise ValueError(f"no Spark query for workload {workload!r}")


def nexmark_df(name: str, sources: dict, scale: int = 1):
    """(streaming DataFrame, output mode) of NEXMark ``name`` over ``sources`` {stream: DataFrame}."""
    from pyspark.sql import functions as F
    size, advance = (_window(us) for us in nexmark_queries.windows_us(name, scale))
    s = {k: df.withWatermark("date_time", "0 seconds") for k, df in sources.items()}
    if name == "q5":
        counts = s["bid"].groupBy(F.window("date_time", size, advance), "auction").agg(
            F.count(F.lit(1)).alias("num"))
        top = counts.groupBy("window").agg(F.max("num").alias("maxn"))
        hot = counts.join(top, "window").where(F.col("num") == F.col("maxn"))
        out = hot.select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"),
                         "auction", "num")
    elif name == "q7":
        top = s["bid"].groupBy(F.window("date_time", size).alias("w")).agg(F.max("price").alias("maxprice"))
        bids = s["bid"].select("auction", "bidder", "price", F.unix_micros("date_time").alias("t"),
                               F.window("date_time", size).alias("window"))
        best = bids.join(top, (bids.window == top.w) & (bids.price == top.maxprice))
        out = best.select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"),
                          "auction", "bidder", "price", F.timestamp_micros("t").alias("date_time"))
    elif name == "q8":
        people = s["person"].select("id", "name", F.window("date_time", size).alias("window"))
        sellers = s["auction"].groupBy(F.window("date_time", size).alias("w"), "seller").agg(
            F.count(F.lit(1)).alias("auctions"))
        joined = people.join(sellers, (people.id == sellers.seller) & (people.window == sellers.w))
        out = joined.select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"),
                            "id", "name")
    else:
        raise ValueError(f"unknown NEXMark query {name!r}")
    return out, "append"
