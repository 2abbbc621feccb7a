"""The benchmark scripts and examples refuse a count they cannot run in argparse's one line, naming the argument:
``--repeat 0`` ended in a StatisticsError traceback, ``--events 0`` in a ZeroDivisionError, ``--sends 0``
in a ValueError, ``migration.py --keys 0`` in numpy's, and ``kernels.py --events 1000000000000`` began making
the tuples up front."""

import importlib.util
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]

REFUSED = [
    ("benchmarks/kernels.py", ["--repeat", "0"], "argument --repeat: must be from 1 to 100, got 0"),
    ("benchmarks/kernels.py", ["--events", "1000000000000"], "argument --events: must be from 1 to 50,000,000, got 1000000000000"),
    ("benchmarks/kernels.py", ["--span", "0"], "argument --span: must be 0.001 or more, got 0"),
    ("benchmarks/kernels.py", ["--batch", "0"], "argument --batch: must be from 256 to 16,777,216, got 0"),
    ("benchmarks/exchange.py", ["--sends", "100,0"], "argument --sends: must be from 1 to 1,048,576, got 0"),
    ("benchmarks/exchange.py", ["--sends", "100,,5"], "argument --sends: expected comma-separated numbers, got '100,,5'"),
    ("benchmarks/exchange.py", ["--records", "0"], "argument --records: must be from 1,000,000 to 40,000,000, got 0"),
    ("benchmarks/exchange.py", ["--repeat", "0"], "argument --repeat: must be from 1 to 100, got 0"),
    ("benchmarks/nexmark.py", ["--events", "0"], "argument --events: must be 1 or more, got 0"),
    ("benchmarks/nexmark.py", ["--workers", "-1"], "argument --workers: must be 0 or more, got -1"),
    ("benchmarks/migration.py", ["--repeat", "0"], "argument --repeat: must be from 1 to 100, got 0"),
    ("benchmarks/migration.py", ["--keys", "0"], "argument --keys: must be from 1 to 10,000,000, got 0"),
    ("benchmarks/migration.py", ["--bins", "16,24"], "argument --bins: bin counts must be powers of two, got 24"),
    ("benchmarks/replication.py", ["--rounds", "0"], "argument --rounds: must be from 1 to 100, got 0"),
    ("benchmarks/replication.py", ["--keys", "1e4,1.5"], "argument --keys: expected an integer, got '1.5'"),
    ("benchmarks/channels.py", ["--runs", "0"], "argument --runs: must be from 1 to 100, got 0"),
    ("benchmarks/bin_moves.py", ["--keys", "0"], "argument --keys: must be from 1 to 10,000,000, got 0"),
    ("benchmarks/runtime.py", ["--rows", "0"], "argument --rows: must be from 1 to 50,000,000, got 0"),
    ("benchmarks/spark_pipeline.py", ["--events", "0"], "argument --events: must be from 1 to 20,000,000, got 0"),
    ("benchmarks/spark_source.py", ["--rows", "0"], "argument --rows: must be from 1 to 100,000,000, got 0"),
    ("benchmarks/ab.py", ["a", "b", "--runs", "0"], "argument --runs: must be from 1 to 100, got 0"),
    ("benchmarks/first_use.py", ["--repeat", "0"], "unrecognized arguments: --repeat 0"),
    ("examples/spark_submit_job.py", ["--output", "o", "--events", "1e12"],
     "argument --events: must be from 1 to 50,000,000, got 1e12"),
    ("examples/spark_submit_job.py", ["--output", "o", "--rate", "0"], "argument --rate: must be 1 or more, got 0"),
]


def script(path: str):
    spec = importlib.util.spec_from_file_location(f"script_{Path(path).stem}", ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path,argv,says", REFUSED, ids=[f"{n} {' '.join(a)}" for n, a, _ in REFUSED])
def test_a_script_refuses_a_count_it_cannot_run_naming_the_argument(path, argv, says, capsys, monkeypatch):
    name = Path(path).name
    monkeypatch.setattr("sys.argv", [name])  # argparse names the program after argv[0]
    with pytest.raises(SystemExit) as stop:
        script(path).main(argv)
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"{name}: error: {says}"


@pytest.mark.parametrize("path", ["benchmarks/fixwindow.py", "benchmarks/nexmark.py"])
def test_a_benchmark_refuses_more_workers_than_the_machine_runs_before_starting_any(path, capsys):
    """It ended in the engine's EngineError traceback."""
    assert script(path).main(["--workers", "1000000", "--no-spark"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: 1000000 instance managers on ") and err[-1].endswith("[CAPACITY]"), err


@pytest.mark.parametrize("path", ["benchmarks/fixwindow.py", "benchmarks/nexmark.py"])
def test_a_benchmark_refuses_more_events_than_the_disk_holds_for_spark_before_starting_any(path, capsys,
                                                                                          monkeypatch):
    """A mistyped ``--events`` ran the sparkcep side first, then wrote Spark's Parquet input until the
    disk was full."""
    module, name = script(path), Path(path).name
    monkeypatch.setattr(module.cli, "run_sparkcep", lambda *a, **k: pytest.fail("a run started"))
    monkeypatch.setattr("sys.argv", [name])
    with pytest.raises(SystemExit) as stop:
        module.main(["--events", str(10 ** 13)])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.fullmatch(rf"{name}: error: argument --events: 10,000,000,000,000 events would take about "
                        r"[\d,.]+ GB of Parquet for Spark in \S+, which has [\d,.]+ GB free: use fewer events, "
                        r"or --no-spark", err), err
    args = SimpleNamespace(seed=0, ips=1_000)
    assert module.cli.room_refused(["fixwindow"], 4_000_000, args) is None  # the acceptance run's 0.4 GB fit


def test_a_count_may_be_written_in_float_notation_when_it_is_whole():
    """``--keys 1e5`` is how the migration benchmark's docs write a key count."""
    parse = script("benchmarks/migration.py").parse_args
    assert parse(["--keys", "1e5,2000", "--tput-keys", ""]).keys == [100_000, 2_000]
    assert parse(["--quick"]).keys == [100_000] and parse([]).keys == [100_000, 1_000_000, 10_000_000]


def test_the_bin_moves_benchmark_moves_table_entries():
    """Its loaded instance left every row pending (an aggregate consumes the rows no firing window reads
    when it settles): it timed moving empty tables, and its "entries" column printed 0."""
    bench = script("benchmarks/bin_moves.py")
    run = bench.one_run(bench.aggregate_op(), 5_000, 64, 16, fresh=True)
    assert 5_000 * 16 // 64 * 0.7 < run["entries"] < 5_000 * 16 // 64 * 1.3, run
