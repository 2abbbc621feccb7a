"""Latency attribution: which send a result answers, per row and per window close, and the percentiles."""

import numpy as np
import pyarrow as pa

from sparkcep.bench.driver import Run, plan_batches
from sparkcep.bench.metrics import (Occurrences, latencies, latency_summary, per_close, percentiles_ms, series,
                                    summarize)

S = 1_000_000  # 1 s in us


def make_run():
    run = Run(events=30, t_start=1_000, t_end=90_000, t_done=95_000)
    # three chunks: keys [0, 9 s], [10 s, 19 s], [20 s, 29 s]; sent at 10_000, 20_000, 30_000 ns
    for j in range(3):
        run.send_t.append((j + 1) * 10_000)
        run.send_done.append((j + 1) * 10_000 + 500)
        run.send_first.append(j * 10 * S)
        run.send_last.append(j * 10 * S + 9 * S)
        run.send_rows.append(10)
    return run


def test_stateless_rows_answer_the_send_that_carried_them():
    run = make_run()
    run.out_t, run.out = [25_000], [pa.RecordBatch.from_arrays(
        [pa.array([0, 9 * S, 10 * S, 19 * S], pa.timestamp("us"))], names=["key"])]
    lat = latencies("identity", run)
    assert lat.rows.tolist() == [15_000, 15_000, 5_000, 5_000]
    assert lat.when.tolist() == [25_000] * 4
    assert lat.closes is None and "closes" not in latency_summary(lat)


def test_window_rows_answer_the_input_that_closed_them_and_closes_their_last_row():
    run = make_run()

    def ends(*us):
        return pa.RecordBatch.from_arrays([pa.array(list(us), pa.timestamp("us"))], names=["window_end"])

    run.out_t, run.out = [31_000, 33_000, 92_000], [ends(10 * S, 20 * S), ends(20 * S), ends(30 * S)]
    lat = latencies("fixwindow", run)
    # [0,10 s) closes with the chunk whose keys reach 10 s (sent at 20_000); [10,20 s) with the third;
    # [20,30 s): no record reaches 30 s, so engine.end (called at t_end = 90_000) closes it
    assert lat.rows.tolist() == [31_000 - 20_000, 31_000 - 30_000, 33_000 - 30_000, 92_000 - 90_000]
    # per close: the window's last row out; three closes, not four rows
    assert sorted(lat.closes.tolist()) == [2_000, 3_000, 11_000]
    s = latency_summary(lat)
    assert s["closes"] == 3 and s["latency_samples"] == 4 and s["close_latency_ms"]["max"] == 0.011


def test_running_counts_answer_the_record_they_count_last():
    run = make_run()
    pool = pa.array(["a", "b", "c"])
    index = np.array([0, 1, 0, 2, 0] * 6)  # a at positions 0, 2, 4, 5, 7, 9, ...
    occ = Occurrences(pool, index)
    assert occ.positions(pa.array(["a", "a", "c", "b"]), np.array([1, 4, 1, 6])).tolist() == [0, 5, 3, 26]
    run.out_t, run.out = [40_000], [pa.RecordBatch.from_arrays([pa.array(["a", "b", "c"]), pa.array([7, 4, 6])],
                                                               names=["ip", "count"])]
    # the 7th a is record 10 (second chunk), the 4th b record 16 (second), the 6th c record 28 (third)
    assert latencies("wordcount", run, occ).rows.tolist() == [20_000, 20_000, 10_000]


def test_per_close_takes_the_slowest_row_of_each_window():
    assert sorted(per_close(np.array([5, 7, 5, 7, 9]), np.array([1, 8, 3, 2, 4])).tolist()) == [3, 4, 8]


def test_percentiles_and_summary():
    p = percentiles_ms(np.arange(1, 1001) * 1_000_000)
    assert p["p50"] == 500.5 and p["max"] == 1000 and abs(p["p99.9"] - 999.001) < 1e-6
    run = make_run()
    s = summarize(run, latencies("identity", run))
    assert s["events"] == 30 and abs(s["throughput"] - 30 / ((95_000 - 1_000) / 1e9)) < 1e-6
    assert s["latency_samples"] == 0


def test_series_bins_by_second():
    t0 = 10**18
    tl = series(t0, t0 + 2 * 10**9, np.array([t0, t0 + 1.5e9], np.int64), np.array([5, 7]),
                np.array([1e6, 3e6], np.int64), np.array([t0 + 1e8, t0 + 1.2e9], np.int64))
    assert tl["input_rate"] == [5, 7] and tl["output_rate"] == [1, 1]
    assert tl["latency_p50_ms"] == [1.0, 3.0]


def test_plan_batches():
    assert plan_batches(None, None, 10) == (65_536, 0)
    rows, dt = plan_batches(100_000, None, 10)
    assert rows == 1000 and dt == 10_000
