"""Window specifications and durations."""

import datetime as dt

import numpy as np
import pandas as pd
import pytest

import sparkcep as cep
from sparkcep.query.windows import MAX_TUPLES, duration_us


@pytest.mark.parametrize("value,us", [
    ("10s", 10_000_000), ("500ms", 500_000), ("5m", 300_000_000), ("5min", 300_000_000), ("2h", 7_200_000_000),
    ("1d", 86_400_000_000), ("250us", 250), ("1.5s", 1_500_000), (" 3 s ", 3_000_000),
    (dt.timedelta(seconds=2, microseconds=7), 2_000_007), (2, 2_000_000), (0.25, 250_000),
    (np.int64(2), 2_000_000), (np.float32(0.25), 250_000), (np.timedelta64(1500, "ms"), 1_500_000),
])
def test_durations(value, us):
    assert duration_us(value) == us


@pytest.mark.parametrize("bad", ["10", "ten s", "10 sec", "-5s", True, None, [1], np.bool_(True),
                                 np.datetime64("2024-01-01"), np.array([1, 2]), float("inf"), float("nan"),
                                 np.float64("-inf")])
def test_bad_durations(bad):
    with pytest.raises(cep.QueryError, match="cannot read"):
        duration_us(bad)


@pytest.mark.parametrize("make", [lambda: cep.TimeWindow(10**13), lambda: cep.TimeWindow("365001d"),
                                  lambda: cep.TimeWindow("1d", lateness=dt.timedelta(days=365_001)),
                                  lambda: cep.TimeWindow(10**30, advance=10**29),
                                  lambda: cep.TimeWindow(1e303), lambda: cep.TimeWindow("9" * 400 + "s"),
                                  lambda: cep.TimeWindow("1s", lateness=1e303),
                                  lambda: cep.Query("q").stream("s", "ts timestamp", max_ahead=np.int64(10**13))])
def test_a_duration_past_1000_years_is_refused_where_the_query_is_written(make):
    """A 10^13 s window was taken and its query failed at its first row (OverflowError in the operator); one
    whose microseconds overflow a float (1e303 s, 400 digits) raised a bare OverflowError."""
    with pytest.raises(cep.QueryError, match=r"is longer than 365000d \(1,000 years\)"):
        make()
    assert cep.TimeWindow("365000d").size_us == 365_000 * 86_400_000_000


@pytest.mark.parametrize("make", [lambda: cep.TimeWindow(pd.Timedelta(1500, "ns")),
                                  lambda: cep.TimeWindow("1s", advance=np.timedelta64(1500, "ns")),
                                  lambda: cep.TimeWindow("1s", lateness=pd.Timedelta(1, "ns")),
                                  lambda: cep.Query("q").stream("s", "ts timestamp",
                                                                max_ahead=np.timedelta64(1, "ns"))])
def test_a_duration_finer_than_a_microsecond_is_refused(make):
    """TimeWindow(pd.Timedelta(1500, "ns")) was a window of 1 us: the nanoseconds were truncated."""
    with pytest.raises(cep.QueryError, match=r"is finer than the microseconds the engine keeps; round it first"):
        make()
    whole = (pd.Timedelta(1500, "us"), np.timedelta64(1500, "us"), np.timedelta64(1_500_000, "ns"))
    assert [cep.TimeWindow(d).size_us for d in whole] == [1500, 1500, 1500]


@pytest.mark.parametrize("size", ["1.5us", "0.0015ms", 1.5e-6, 1 / 3])
def test_a_duration_written_finer_than_a_microsecond_is_refused(size):
    """'1.5us' was a window of 2 us and 1/3 s one of 333,333 us: rounded without a word."""
    with pytest.raises(cep.QueryError, match=r"is finer than the microseconds the engine keeps"):
        cep.TimeWindow(size)
    assert [cep.TimeWindow(d).size_us for d in ("2.5ms", 0.1, 0.3, "0.7s", 1e-6)] == [2500, 100_000, 300_000,
                                                                                    700_000, 1]


def test_time_window_defaults_to_tumbling():
    w = cep.TimeWindow("10s")
    assert (w.size_us, w.advance_us, w.lateness_us) == (10_000_000, 10_000_000, 0)
    w = cep.TimeWindow("30s", advance="10s", lateness="5s")
    assert (w.size_us, w.advance_us, w.lateness_us) == (30_000_000, 10_000_000, 5_000_000)


@pytest.mark.parametrize("args,words", [(("0s",), "window size must be positive, got '0s'$"),
                                        ((0,), "window size must be positive, got 0$"),
                                        (("10s", "20s"), "larger than its size"),
                                        (("10s", "0s"), "window advance must be positive, got '0s'$")])
def test_bad_time_windows(args, words):
    with pytest.raises(cep.QueryError, match=words):
        cep.TimeWindow(*args)


def test_tuple_window():
    w = cep.TupleWindow(5)
    assert (w.size, w.advance) == (5, 5)
    assert (cep.TupleWindow(5, 2).size, cep.TupleWindow(5, 2).advance) == (5, 2)
    for bad in [(0,), (3, 4), (2.0,), (True,), (3, 0), ("3",)]:
        with pytest.raises(cep.QueryError):
            cep.TupleWindow(*bad)


@pytest.mark.parametrize("args,name", [((2**70,), "size"), ((MAX_TUPLES + 1,), "size"), ((10, 2**64), "advance"),
                                       ((np.uint64(2**63),), "size")])
def test_a_tuple_window_past_2_61_tuples_is_refused_where_the_query_is_written(args, name):
    """TupleWindow(2**70) was taken and its query failed at its first send (a numba TypingError)."""
    with pytest.raises(cep.QueryError, match=rf"TupleWindow {name} must be <= {2**61}, got"):
        cep.TupleWindow(*args)


@pytest.mark.parametrize("args", [(MAX_TUPLES,), (MAX_TUPLES, 1 + MAX_TUPLES // 10_000), (10**12,)], ids=str)
def test_the_largest_tuple_windows_run(args):
    """The bound leaves the kernels room: windows at it, overlapping as much as allowed, run without overflow."""
    q = cep.Query("q")
    s = q.stream("ev", "k string, ts timestamp, v int64")
    q.output("o", s.aggregate(cep.TupleWindow(*args), by="k", n=cep.count()))
    with cep.Engine.local(workers=0) as e:
        e.deploy(q)
        e.send("ev", {"k": ["a", "b", "a"], "ts": [dt.datetime(2024, 1, 1)] * 3, "v": [1, 2, 3]})
        e.end("ev")
        assert e.collect("o").num_rows == 0  # no window is full


@pytest.mark.parametrize("window", [lambda: cep.TimeWindow("1000s", advance="1us"),
                                    lambda: cep.TimeWindow("1d", advance="1s"),
                                    lambda: cep.TupleWindow(10**12, advance=1)])
def test_a_window_that_puts_a_row_in_too_many_windows_is_refused(window):
    """Every window a row falls in costs it an update (and the kernels scratch room): a 1000 s window
    sliding by 1 us was taken, and its first send failed for memory, leaving the query failed."""
    with pytest.raises(cep.QueryError, match=r"puts every row in [\d,]+ windows; at most 10,000"):
        window()
    assert cep.TimeWindow("1h", advance="1s").advance_us == 1_000_000  # 3,600 a row: taken
    assert cep.TupleWindow(10_000, advance=1).size == 10_000
