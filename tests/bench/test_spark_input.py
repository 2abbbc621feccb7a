"""The Parquet files the benchmarks write for Spark's file source."""

from sparkcep.bench import spark as sb
from sparkcep.bench import workloads
from sparkcep.bench.generator import UserVisits

T0 = 1_700_000_003_000_000


def test_the_files_modification_times_follow_their_write_order(tmp_path):
    """Spark's file source takes files by modification time, read in ms: each file's is a ms past the
    one written before it, the flush's last."""
    src = workloads.Records(UserVisits(seed=5, distinct_ips=40, cycle=1 << 16))
    dirs = {s: tmp_path / s for s in src.streams}
    sb.write_input(dirs, src, 400, T0, 300.0, workloads.WINDOW_US, rows_per_file=10)
    for d in dirs.values():
        files = sorted(d.glob("part-*.parquet"))
        ms = [f.stat().st_mtime_ns // 1_000_000 for f in files]
        assert len(files) == 41 and all(a < b for a, b in zip(ms, ms[1:])), ms
