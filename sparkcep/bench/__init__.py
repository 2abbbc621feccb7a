"""Benchmarks: HiBench's streaming workloads and NEXMark, on sparkcep beside Spark Structured Streaming.

Generators, drivers and reports only; every query is written with the
engine's public operators.

* :mod:`~sparkcep.bench.generator` / :mod:`~sparkcep.bench.nexmark` — HiBench's
  records and NEXMark's person / auction / bid events, generated columnar and
  deterministic;
* :mod:`~sparkcep.bench.workloads` / :mod:`~sparkcep.bench.nexmark_queries` —
  the workloads as sparkcep queries; :mod:`~sparkcep.bench.spark_queries` —
  the same as Spark Structured Streaming queries;
* :mod:`~sparkcep.bench.suite` — every workload as the CLI runs it;
* :mod:`~sparkcep.bench.driver` / :mod:`~sparkcep.bench.spark` — open-loop input
  into sparkcep and into Spark; :mod:`~sparkcep.bench.metrics` — throughput,
  latency per result row and per window close;
* :mod:`~sparkcep.bench.cli` — ``sparkcep bench WORKLOAD``;
  :mod:`~sparkcep.bench.report` — ``docs/benchmarks.md``.
"""
