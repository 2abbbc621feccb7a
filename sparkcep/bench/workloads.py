"""The four HiBench streaming workloads as sparkcep queries.

Every query reads the stream ``uservisits`` of HiBench records
(``key timestamp, value string``, see :mod:`sparkcep.bench.generator`).

* **identity** — a map with the same fields in and out (as in the UPM-CEP
  paper): every record leaves unchanged.
* **repartition** — the same map deployed as N instances; the planner puts a
  round-robin balancer in front of a stateless sub-query, so records are
  spread round-robin over the N instances (HiBench: ``repartition(N)``).
* **wordcount** — the running count of records per source IP. A running
  count never expires, so it is *not* a windowed aggregate: ``TupleWindow(1)``
  per IP would emit 1 for every record, a sliding ``TupleWindow(n, 1)`` counts
  only the last n records, and one huge ``TimeWindow`` would emit only at the
  end of input. It is the engine's keyed stateful operator
  (:class:`RunningCount`, state per bin, so it routes, migrates and
  replicates like any stateful operator) and it emits, for every IP present
  in a consumed batch, one row with the IP's count so far — Spark Structured
  Streaming's ``groupBy(ip).count()`` in ``update`` output mode, with the
  engine's input batch in place of Spark's micro-batch. Its final counts
  equal HiBench's ``mapWithState`` counts.
* **fixwindow** — count and minimum record time per IP over 10 s tumbling
  event-time windows (HiBench ``FixWindow``: ``reduceByKey`` of
  ``(min time, count)`` over ``window(10 s, 10 s)``).

Parsing the IP out of the value (HiBench's ``UserVisitParser``) is a user
``apply`` over whole batches (:func:`sparkcep.bench.kernels.parse_ip`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

import sparkcep as cep
from sparkcep.bench.generator import RECORD_DDL
from sparkcep.bench.kernels import count_table, parse_ip, running_count
from sparkcep.core import columns
from sparkcep.core.hashing import hash_words

STREAM = "uservisits"
WORKLOADS = ("identity", "repartition", "wordcount", "fixwindow")
WINDOW = "10s"
HIDDEN_PREFIX = "__"


def _ip_and_key(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Map ``(key, value)`` to ``(ip, key)``, keeping the engine's hidden columns."""
    names = ["ip", "key"] + [n for n in batch.schema.names if n.startswith(HIDDEN_PREFIX)]
    cols = [parse_ip(batch.column("value")), batch.column("key")]
    cols += [batch.column(n) for n in names[2:]]
    return pa.RecordBatch.from_arrays(cols, names=names)


class RunningCount(cep.StatefulOperator):
    """The running count of tuples per ``ip``; one row per IP in each consumed batch.

    State: one :func:`~sparkcep.bench.kernels.count_table` over all bins of
    the instance (exact: keys are compared byte by byte, not only by hash);
    :meth:`extract` / :meth:`install` move one bin of it.
    """

    schema = "ip string, count int64, key timestamp"

    def new_state(self, bins):
        return count_table(bins)

    def process(self, batch, bins, state):
        koff, kdata = columns.encode_keys(batch, ["ip"])
        h, w0, w1 = hash_words(koff, kdata)
        last, count = running_count(state, (h, w0, w1, koff, kdata, np.asarray(bins, np.int64)))
        if not len(last):
            return None
        return pa.RecordBatch.from_arrays([columns.take(batch.column("ip"), last), pa.array(count, pa.int64()),
                                           columns.take(batch.column("key"), last)], names=["ip", "count", "key"])

    def extract(self, state, bin):
        return state.extract(bin)

    def install(self, state, bin, value):
        state.install(bin, value)


def query(workload: str, name: str | None = None) -> cep.Query:
    """The sparkcep query of ``workload``; its one output is named like the workload."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; workloads: {', '.join(WORKLOADS)}")
    q = cep.Query(name or workload)
    s = q.stream(STREAM, RECORD_DDL, time="key")
    if workload in ("identity", "repartition"):
        out = s.map(key="key", value="value", name="copy")
    else:
        ips = s.apply(_ip_and_key, schema="ip string, key timestamp", name="parse")
        if workload == "wordcount":
            out = ips.stateful(RunningCount(), by="ip", name="count")
        else:
            out = ips.aggregate(cep.TimeWindow(WINDOW), by="ip", name="window",
                                count=cep.count(), first=cep.min("key"))
    q.output(workload, out)
    return q


def parallelism(workload: str, instances: int) -> int:
    """``Engine.deploy`` parallelism: N instances of every sub-query of the workload.

    Spark runs every stage of the job on all its cores; so do we (parsing
    the IP included: on one instance it is the bottleneck of fixwindow).
    """
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; workloads: {', '.join(WORKLOADS)}")
    return max(1, instances)


WARM_UP_BATCHES, WARM_UP_ROWS = 4, 20_000  # the untimed run before a measured one, the same for Spark


def warm_up_input(ips: int):
    """The records both engines run a workload on, untimed, before it is measured: drawn from the
    measured run's ``ips`` IPs, so a first window close is as large there as in the run."""
    from sparkcep.bench.generator import UserVisits
    return UserVisits(seed=1, distinct_ips=ips, cycle=1 << 16)


def warm_up(engine: cep.Engine, workload: str, instances: int, ips: int) -> None:
    """Run ``workload`` briefly on ``engine`` over :func:`warm_up_input`, untimed, then undeploy it:
    every instance manager compiles (or loads from numba's cache) the kernels the measured run will
    call, for the array types it will call them with, growing its tables included, and every process
    has touched memory of the sizes a window close of the measured run allocates."""
    gen = warm_up_input(ips)
    engine.deploy(query(workload), parallelism=parallelism(workload, instances))
    try:
        for i in range(WARM_UP_BATCHES):
            engine.send(STREAM, gen.records(i * WARM_UP_ROWS, WARM_UP_ROWS, start_us=0, rate=10_000))
        engine.end(STREAM)
    finally:
        engine.undeploy(workload)
