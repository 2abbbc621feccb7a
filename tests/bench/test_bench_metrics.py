"""Latency attribution: which send a result answers, and the percentiles."""

import numpy as np
import pyarrow as pa

from sparkcep.bench.driver import Run, plan_batches
from sparkcep.bench.metrics import latencies, percentiles_ms, series, summarize

S = 1_000_000  # 1 s in us


def make_run():
    run = Run(events=30, t_start=1_000, t_end=90_000, t_done=95_000)
    # three batches: keys [0, 9 s], [10 s, 19 s], [20 s, 29 s]; sent at 10_000, 20_000, 30_000 ns
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
    lat, when = latencies("identity", run)
    assert lat.tolist() == [15_000, 15_000, 5_000, 5_000]
    assert when.tolist() == [25_000] * 4


def test_window_answers_the_tuple_that_closed_it_or_the_end_of_input():
    run = make_run()
    def ends(*us):
        return pa.RecordBatch.from_arrays([pa.array(list(us), pa.timestamp("us"))], names=["window_end"])

    run.out_t, run.out = [31_000, 92_000], [ends(10 * S, 20 * S), ends(30 * S)]
    lat, _ = latencies("fixwindow", run)
    # [0,10 s) closes with the batch whose keys reach 10 s (sent at 20_000); [10,20 s) with the third;
    # [20,30 s): no record reaches 30 s, so engine.end (called at t_end = 90_000) closes it
    assert lat.tolist() == [31_000 - 20_000, 31_000 - 30_000, 92_000 - 90_000]


def test_percentiles_and_summary():
    p = percentiles_ms(np.arange(1, 1001) * 1_000_000)
    assert p["p50"] == 500.5 and p["max"] == 1000 and abs(p["p99.9"] - 999.001) < 1e-6
    run = make_run()
    s = summarize(run, (np.zeros(0, np.int64), np.zeros(0, np.int64)))
    assert s["events"] == 30 and abs(s["throughput"] - 30 / ((95_000 - 1_000) / 1e9)) < 1e-6


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
