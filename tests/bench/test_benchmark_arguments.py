"""The benchmark scripts refuse a count they cannot run in argparse's one line, naming the argument:
``--repeat 0`` ended in a StatisticsError traceback, ``--events 0`` in a ZeroDivisionError, ``--sends 0``
in a ValueError, ``migration.py --keys 0`` in numpy's, and ``kernels.py --events 1000000000000`` began making
the tuples up front."""

import importlib.util
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

REFUSED = [
    ("kernels.py", ["--repeat", "0"], "argument --repeat: must be from 1 to 100, got 0"),
    ("kernels.py", ["--events", "1000000000000"], "argument --events: must be from 1 to 50,000,000, got 1000000000000"),
    ("kernels.py", ["--span", "0"], "argument --span: must be 0.001 or more, got 0"),
    ("kernels.py", ["--batch", "0"], "argument --batch: must be from 256 to 16,777,216, got 0"),
    ("exchange.py", ["--sends", "100,0"], "argument --sends: must be from 1 to 1,048,576, got 0"),
    ("exchange.py", ["--sends", "100,,5"], "argument --sends: expected comma-separated numbers, got '100,,5'"),
    ("exchange.py", ["--records", "0"], "argument --records: must be from 1,000,000 to 40,000,000, got 0"),
    ("exchange.py", ["--repeat", "0"], "argument --repeat: must be from 1 to 100, got 0"),
    ("nexmark.py", ["--events", "0"], "argument --events: must be 1 or more, got 0"),
    ("nexmark.py", ["--workers", "-1"], "argument --workers: must be 0 or more, got -1"),
    ("migration.py", ["--repeat", "0"], "argument --repeat: must be from 1 to 100, got 0"),
    ("migration.py", ["--keys", "0"], "argument --keys: must be from 1 to 10,000,000, got 0"),
    ("migration.py", ["--bins", "16,24"], "argument --bins: bin counts must be powers of two, got 24"),
    ("replication.py", ["--rounds", "0"], "argument --rounds: must be from 1 to 100, got 0"),
    ("replication.py", ["--keys", "1e4,1.5"], "argument --keys: expected an integer, got '1.5'"),
    ("channels.py", ["--runs", "0"], "argument --runs: must be from 1 to 100, got 0"),
    ("bin_moves.py", ["--keys", "0"], "argument --keys: must be from 1 to 10,000,000, got 0"),
    ("runtime.py", ["--rows", "0"], "argument --rows: must be from 1 to 50,000,000, got 0"),
    ("spark_pipeline.py", ["--events", "0"], "argument --events: must be from 1 to 20,000,000, got 0"),
    ("spark_source.py", ["--rows", "0"], "argument --rows: must be from 1 to 100,000,000, got 0"),
    ("ab.py", ["a", "b", "--runs", "0"], "argument --runs: must be from 1 to 100, got 0"),
    ("first_use.py", ["--repeat", "0"], "unrecognized arguments: --repeat 0"),
]


def script(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmark_{name[:-3]}", BENCHMARKS / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name,argv,says", REFUSED, ids=[f"{n} {' '.join(a)}" for n, a, _ in REFUSED])
def test_a_benchmark_refuses_a_count_it_cannot_run_naming_the_argument(name, argv, says, capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", [name])  # argparse names the program after argv[0]
    with pytest.raises(SystemExit) as stop:
        script(name).main(argv)
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"{name}: error: {says}"


@pytest.mark.parametrize("name", ["fixwindow.py", "nexmark.py"])
def test_a_benchmark_refuses_more_workers_than_the_machine_runs_before_starting_any(name, capsys):
    """It ended in the engine's EngineError traceback."""
    assert script(name).main(["--workers", "1000000", "--no-spark"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: 1000000 instance managers on ") and err[-1].endswith("[CAPACITY]"), err


def test_a_count_may_be_written_in_float_notation_when_it_is_whole():
    """``--keys 1e5`` is how the migration benchmark's docs write a key count."""
    parse = script("migration.py").parse_args
    assert parse(["--keys", "1e5,2000", "--tput-keys", ""]).keys == [100_000, 2_000]
    assert parse(["--quick"]).keys == [100_000] and parse([]).keys == [100_000, 1_000_000, 10_000_000]
