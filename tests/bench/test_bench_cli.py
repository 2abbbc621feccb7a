"""``sparkcep bench`` on the command line: counts it cannot run refused by argparse, an engine's error and
Ctrl-C in one line, SIGTERM stopping its instance managers with it, results.json strict JSON."""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkcep import cli
from sparkcep.bench import cli as bench
from sparkcep.errors import EngineError

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]))

REFUSED = [
    # q5 rendered 10^12 events up front (a numpy MemoryError traceback); identity ran for days, growing
    (["q5", "--events", "1e12"], "argument --events: must be from 1 to 20,000,000, got 1e12"),
    # 0.25 events: a run of none, reported as a result
    (["fixwindow", "--rate", "0.01"], "argument --rate: must be 0 (as fast as possible) or 1 or more, got 0.01"),
    # an OverflowError traceback
    (["fixwindow", "--rate", "1e-300", "--events", "3"],
     "argument --rate: must be 0 (as fast as possible) or 1 or more, got 1e-300"),
]


@pytest.mark.parametrize("argv,says", REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_bench_refuses_a_run_it_cannot_make_naming_the_argument(argv, says, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["bench", *argv])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"sparkcep bench: error: {says}"


def test_a_rate_without_events_runs_its_seconds_worth_up_to_the_most_events():
    args = cli_args("fixwindow", "--rate", "1e9")
    assert bench.plans(args) == [("fixwindow", 1e9, bench.MAX_EVENTS, True)]
    assert bench.plans(cli_args("fixwindow", "--rate", "1000")) == [("fixwindow", 1000.0, 25_000, True)]


def cli_args(*argv):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.parametrize("error,code,says", [
    (EngineError("instance manager im-0 (cpu 0) said nothing for 60 s while starting: it is stuck (pid 7)",
                 "WORKER_STUCK"), 1,
     "sparkcep bench: instance manager im-0 (cpu 0) said nothing for 60 s while starting: it is stuck (pid 7) "
     "[WORKER_STUCK]"),
    (KeyboardInterrupt(), 130, None),
], ids=["engine-error", "ctrl-c"])
def test_an_engine_error_or_ctrl_c_ends_bench_in_one_line(monkeypatch, capsys, error, code, says):
    """Both ended in a traceback."""
    def fail(*args, **kwargs):
        raise error
    monkeypatch.setattr(bench, "run_sparkcep", fail)
    try:
        got = cli.main(["bench", "identity", "--events", "10"])
    except KeyboardInterrupt as e:  # escaped: a traceback
        got = e
    assert got == code
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ([says] if says else []), err


def test_sigterm_stops_bench_and_the_instance_managers_it_started():
    """The instance managers it started went on running (warming up) after it died, for up to a minute."""
    p = subprocess.Popen([sys.executable, "-m", "sparkcep", "bench", "identity", "--workers", "1", "--events",
                          "20000000", "--rate", "1000"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, env=ENV)
    try:
        deadline = time.monotonic() + 60
        while not (workers := children(p.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert workers, "no instance manager started"
        time.sleep(1)
        p.send_signal(signal.SIGTERM)
        code = p.wait(30)
        left = [pid for pid in workers if Path(f"/proc/{pid}").exists() and not zombie(pid)]
        err = p.stderr.read().decode()
        assert code == 128 + signal.SIGTERM and not left and "Traceback" not in err, (code, left, err)
    finally:
        for pid in children(p.pid):
            os.kill(pid, signal.SIGKILL)
        p.kill()
        p.wait()


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_results_json_writes_null_for_a_figure_of_no_samples(tmp_path):
    """A run without result rows wrote bare NaN percentiles, which JSON readers refuse."""
    nan = float("nan")
    run = {"engine": "sparkcep", "workload": "wordcount_tuples", "offered_rate": None, "events": 1000,
           "output_rows": 0, "throughput": 5e5, "latency_samples": 0,
           "latency_ms": {"p50": nan, "p99": nan, "max": nan},
           "timeline": {"t_s": [0.0], "input_rate": [1000.0], "output_rate": [0.0], "latency_p50_ms": [nan],
                        "latency_p99_ms": [nan]}}
    bench.write_outputs(tmp_path, [run])
    written = json.loads((tmp_path / "results.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    assert written[0]["latency_ms"] == {"p50": None, "p99": None, "max": None}
    assert written[0]["timeline"]["latency_p50_ms"] == [None] and written[0]["throughput"] == 5e5
