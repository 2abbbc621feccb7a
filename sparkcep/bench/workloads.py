"""The four HiBench streaming workloads as sparkcep queries.

Every query reads the stream ``uservisits`` of HiBench records
(``key timestamp, value string``, see :mod:`sparkcep.bench.generator`) and is
written with the engine's public operators only.

* **identity** — a map with the same fields in and out (as in the UPM-CEP
  paper): every record leaves unchanged.
* **repartition** — the same map deployed as N instances; the planner puts a
  round-robin balancer in front of a stateless sub-query, so records are
  spread round-robin over the N instances (HiBench: ``repartition(N)``).
* **wordcount** — the running count of records per source IP:
  ``aggregate(cep.Running(), by="ip", count=cep.count())``, which emits,
  after each batch it consumes, one row per IP of the batch with the IP's
  count so far — Spark Structured Streaming's ``groupBy(ip).count()`` in
  ``update`` output mode; its last row per IP is HiBench's ``mapWithState``
  count.
* **wordcount_tuples** — UPM-CEP §7's wordcount: an aggregate with a
  tuple-count window grouped by the word (the IP): a row per
  :data:`TUPLE_WINDOW` records of an IP, their count. Spark Structured
  Streaming has no count window: no Spark peer.
* **fixwindow** — count and minimum record time per IP over tumbling
  event-time windows (HiBench ``FixWindow``: ``reduceByKey`` of
  ``(min time, count)`` over ``window(10 s, 10 s)``).

The IP is parsed out of the value as HiBench's ``UserVisitParser`` does, by
the expression ``col("value").split_part(",", 1)``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

import sparkcep as cep
from sparkcep.bench.generator import RECORD_DDL, RECORD_SCHEMA, UserVisits
from sparkcep.query.expressions import Expr

STREAM = "uservisits"
WORKLOADS = ("identity", "repartition", "wordcount", "wordcount_tuples", "fixwindow")
NO_SPARK_PEER = ("wordcount_tuples",)
FLUSH_IP = "0.0.0.0"  # the reserved IP of the record that closes Spark's last windows (:meth:`Records.flush`)
WINDOW_US = 10_000_000  # HiBench's fixwindow window (hibench.streambench.fixWindowDuration)
TUPLE_WINDOW = 10  # records of one IP per wordcount_tuples row (2M records of 100K IPs: 20 per IP)


def source_ip() -> Expr:
    """HiBench's ``UserVisitParser``: the source IP, the value's first comma-separated field."""
    return cep.col("value").split_part(",", 1)


def query(workload: str, name: str | None = None, window_us: int = WINDOW_US) -> cep.Query:
    """The sparkcep query of ``workload``; its one output is named like the workload.
    ``window_us``: fixwindow's window (HiBench: 10 s)."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; workloads: {', '.join(WORKLOADS)}")
    q = cep.Query(name or workload)
    s = q.stream(STREAM, RECORD_DDL, time="key")
    if workload in ("identity", "repartition"):
        out = s.map(key="key", value="value", name="copy")
    elif workload in ("wordcount", "wordcount_tuples"):
        window = cep.Running() if workload == "wordcount" else cep.TupleWindow(TUPLE_WINDOW)
        out = s.map(ip=source_ip(), name="parse").aggregate(window, by="ip", name="count", count=cep.count())
    else:
        ips = s.map(ip=source_ip(), key="key", name="parse")
        out = ips.aggregate(cep.TimeWindow(f"{window_us}us"), by="ip", name="window",
                            count=cep.count(), first=cep.min("key"))
    q.output(workload, out)
    return q


class Records:
    """HiBench records of a generator as the driver's input (:class:`sparkcep.bench.driver.Source`):
    the one stream ``uservisits``, keyed by the send time when sent as fast as possible."""

    streams = (STREAM,)
    ddl = {STREAM: RECORD_DDL}
    nominal_rate = None

    def __init__(self, gen: UserVisits):
        self.gen = gen

    def prepare(self, events: int) -> None:
        self.gen.values(0, min(events, self.gen.cycle))  # render the cached cycle

    def batches(self, start: int, n: int, times_us: np.ndarray) -> list[tuple[str, pa.RecordBatch]]:
        keys = pa.array(np.asarray(times_us, np.int64), pa.timestamp("us"))
        return [(STREAM, pa.RecordBatch.from_arrays([keys, self.gen.values(start, n)], schema=RECORD_SCHEMA))]

    def flush(self, at_us: int) -> list[tuple[str, pa.RecordBatch]]:
        """One record of :data:`FLUSH_IP` at ``at_us``: what closes the open windows of an engine
        without end of input (Spark)."""
        value = FLUSH_IP + self.gen.values(0, 1)[0].as_py()[len(self.gen.source_ips(0, 1)[0].as_py()):]
        return [(STREAM, pa.RecordBatch.from_arrays([pa.array([at_us], pa.timestamp("us")), pa.array([value])],
                                                    schema=RECORD_SCHEMA))]


def parallelism(workload: str, instances: int) -> int:
    """``Engine.deploy`` parallelism: N instances of every sub-query of the workload.

    Spark runs every stage of the job on all its cores; so do we (parsing
    the IP included: on one instance it is the bottleneck of fixwindow).
    """
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; workloads: {', '.join(WORKLOADS)}")
    return max(1, instances)


WARM_UP_BATCHES, WARM_UP_ROWS = 4, 20_000  # the untimed run before a measured one, the same for Spark


def warm_up_input(ips: int) -> UserVisits:
    """The records both engines run a workload on, untimed, before it is measured: drawn from the
    measured run's ``ips`` IPs, so a first window close is as large there as in the run."""
    return UserVisits(seed=1, distinct_ips=ips, cycle=1 << 16)
