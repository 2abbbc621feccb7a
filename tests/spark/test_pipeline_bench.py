"""The Spark-routed pipeline benchmark compares like with like: both paths warmed over the measured
files, every routed run's windows equal to a batch Spark computation, every native run as many."""

import sparkcep as cep
from sparkcep.bench import pipeline


def test_compare_runs_both_paths_complete(spark, tmp_path):
    data = pipeline.write_input(tmp_path / "input", events=20_000, files=3, span_s=60.0, ips=500)
    want = pipeline.reference(spark, data)
    seen = []
    runs = pipeline.compare(spark, data, tmp_path, runs=1, on_run=lambda k, run, complete: seen.append(run.path),
                            warm_ups=1)
    assert seen == ["native", "routed"]
    (native, native_ok), = runs["native"]
    (routed, routed_ok), = runs["routed"]
    assert native_ok and routed_ok
    assert routed.totals == want and native.totals.rows == want.rows > 500
    assert routed.events == native.events == 20_000
    assert set(routed.stages) == {"sink", "source"} and routed.seconds > 0
    assert routed.reader_start > 0 and native.reader_start == 0  # the reader is up before the clock starts


def test_routed_clock_starts_with_the_reader_up(spark, tmp_path, monkeypatch):
    """When the clock starts, the reading query runs and has reported its first trigger."""
    data = pipeline.write_input(tmp_path / "input", events=2_000, files=1, span_s=20.0, ips=50)
    at_clock, real = [], pipeline.cpu_seconds

    def cpu_seconds():
        at_clock.append([q.lastProgress is not None for q in spark.streams.active])
        return real()

    monkeypatch.setattr(pipeline, "cpu_seconds", cpu_seconds)
    with cep.Engine.local() as engine:
        run = pipeline.routed(spark, data, tmp_path, engine)
        assert "fixwindow" not in engine.deployments  # undeployed after the run
    assert at_clock[0] == [True] and run.totals.rows > 0
