"""HiBench streaming workloads for sparkcep, beside Spark Structured Streaming.

* :mod:`~sparkcep.bench.generator` — HiBench's streaming records (key: send
  time, value: a ``uservisits`` row), generated columnar and deterministic;
* :mod:`~sparkcep.bench.workloads` — identity, repartition, wordcount and
  fixwindow as sparkcep queries;
* :mod:`~sparkcep.bench.spark` — the same four as Spark Structured Streaming
  queries;
* :mod:`~sparkcep.bench.driver` / :mod:`~sparkcep.bench.metrics` — open-loop
  input at a rate, throughput and latency percentiles as HiBench reports them;
* :mod:`~sparkcep.bench.cli` — ``sparkcep bench WORKLOAD``.
"""
