"""The report: every workload, ratios of median throughputs, percentiles with what they summarise;
and the CLI's run of one workload end to end (driver, metrics) on a small input."""

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
from rich.console import Console

from sparkcep.bench import cli, report, suite

LEVELS = {"p50": 1.0, "p75": 2.0, "p95": 3.0, "p99": 4.0, "p99.9": 5.0, "max": 6.0, "mean": 1.5}


def result(engine, workload, latency, throughput, closes=None):
    r = {"engine": engine, "workload": workload, "latency_run": latency, "throughput": throughput,
         "events": 2_000_000, "latency_ms": dict(LEVELS), "latency_samples": 1234}
    if closes is not None:
        r.update(closes=closes, close_latency_ms=dict(LEVELS))
    return r


@dataclass
class Totals:
    rows: int


@dataclass
class PipelineRun:
    path: str
    seconds: float
    events: int = 2_000_000
    totals: Totals = field(default_factory=lambda: Totals(10))
    stages: dict = field(default_factory=dict)
    cpu: dict = field(default_factory=lambda: {"spark": 20.0, "engine": 5.5})
    reader_start: float = 0.0

    @property
    def rate(self):
        return self.events / self.seconds


def test_the_report_lists_every_workload_with_ratios_and_sample_counts(tmp_path):
    results = []
    for w in suite.ALL:
        windowed = suite.windows_us(w, True) is not None
        for t in (9.0, 10.0, 30.0):
            results.append(result("sparkcep", w, False, t * 1e6))
        results.append(result("sparkcep", w, True, 5e4, 250 if windowed else None))
        if suite.has_spark_peer(w):
            for t in (1.0, 2.0, 3.0):
                results.append(result("spark", w, False, t * 1e6))
            results.append(result("spark", w, True, 4.9e4, 120 if windowed else None))
    pipeline = {"native": [(PipelineRun("native", 10.0), True)],
                "routed": [(PipelineRun("routed", 4.0, stages={"sink": 2.0, "source": 2.0},
                                       reader_start=1.25), True)]}
    args = SimpleNamespace(workers=2, events=None, repeat=3, latency_rate=50_000.0, ips=100_000, seed=0)
    path = tmp_path / "benchmarks.md"
    report.write(path, results, args, pipeline)
    text = path.read_text()
    assert "sparkcep bench all --compare spark --workers 2 --report" in text
    for w in suite.ALL:
        assert f"| {w} |" in text
    assert "| HiBench | fixwindow | 2,000,000 | 10,000,000 (9,000,000-30,000,000) | 2,000,000 (1,000,000-3,000,000) | 5.00x |" in text
    assert "| HiBench | wordcount_tuples | 2,000,000 | 10,000,000 (9,000,000-30,000,000) | no Spark peer | - |" in text
    assert "| q7 | sparkcep | 50,000 | 1,234 | 1.00 | 2.00 | 3.00 | 4.00 | 5.00 | 6.00 |" in text
    assert "| q5 | spark | 120 | 1.00 |" in text and "| fixwindow | sparkcep | 250 |" in text
    assert "fixwindow 100 ms; q5 100 ms sliding by 20 ms" in text
    assert ("| routed | 2,000,000 | 4.00 | 500,000 | 2.50x | sink 2.00, source 2.00; reader start 1.25 | "
            "spark 20.0, "
            "engine 5.5 | yes |") in text
    report.write(path, results, args, None)
    assert "Not measured in this run (it needs `--compare spark`)" in path.read_text()


def test_a_latency_run_of_a_nexmark_query_end_to_end():
    args = SimpleNamespace(workers=0, instances=2, ips=1000, seed=0)
    r = cli.run_sparkcep("q7", 20_000.0, 20_000, args, Console(quiet=True), latency=True)
    # 1 s of events at 20K/s with 100 ms windows: about ten closes, each one window's highest bids
    assert 9 <= r["closes"] <= 12 and r["latency_samples"] >= r["closes"]
    assert 0 < r["latency_ms"]["p50"] < 1_000 and r["close_latency_ms"]["max"] >= r["close_latency_ms"]["p50"]
    assert abs(r["throughput"] - 20_000) < 5_000


def test_plans_of_a_report():
    args = SimpleNamespace(workload="nexmark", report="x.md", repeat=3, events=None, latency_rate=50_000.0,
                           rate=None)
    got = cli.plans(args)
    assert [p for p in got if p[0] == "q5"] == [("q5", None, 2_000_000, False)] * 3 + [("q5", 50_000.0, 1_250_000, True)]
    assert {p[0] for p in got} == set(suite.NEXMARK)


@pytest.mark.parametrize("argv, says", [
    (["--events", "0"], "argument --events: must be from 1 to 20,000,000, got 0"),  # ran the default 2,000,000
    (["--events", "-5"], "argument --events: must be from 1 to 20,000,000, got -5"),  # ran nothing, printed nan
    (["--ips", "0"], "argument --ips: must be from 1 to 4,194,304, got 0"),  # a traceback
    (["--ips", "10000000000000"], "argument --ips: must be from 1 to 4,194,304"),  # tried to allocate 36 TiB
    (["--rate", "nan"], "argument --rate: must be 0 or more, got nan"),
    (["--repeat", "0"], "argument --repeat: must be 1 or more, got 0"),
    (["--events", "1.5"], "argument --events: expected an integer, got '1.5'"),
])
def test_bench_refuses_counts_it_cannot_run_before_it_starts(argv, says, capsys):
    from sparkcep import cli as sparkcep_cli
    with pytest.raises(SystemExit) as done:
        sparkcep_cli.main(["bench", "fixwindow", *argv])
    assert done.value.code == 2 and says in capsys.readouterr().err
