"""The data source's integer options take what Spark hands over (strings of digits) and what Python users
pass (ints, numpy integers), and refuse floats, bools, negative positions and counts past 64 bits with
UPMCEP_OPTION: a ``startingOffsets`` position of 1.5 or ``true`` was read as 1, and ``maxRecordsPerTrigger``
of 2**63 was taken (Spark counts rows in a 64-bit long)."""

import json

import numpy as np
import pytest

from sparkcep.spark.options import SourceOptions, SparkSourceError


@pytest.mark.parametrize("given", ["10", " 10 ", 10, np.int64(10)])
def test_integer_options_take_strings_of_digits_and_integers(given):
    options = SourceOptions.parse({"stream": "s", "maxRecordsPerTrigger": given, "rowsPerPartition": given})
    assert options.max_records == options.rows_per_partition == 10 and type(options.max_records) is int


# "²" is a digit to str.isdigit() that int() refuses: a raw ValueError traceback before
@pytest.mark.parametrize("given", ["1.5", 1.5, "true", True, "-3", 0, "ten", str(1 << 63), "²", "1²"])
def test_integer_options_refuse_anything_else(given):
    with pytest.raises(SparkSourceError) as e:
        SourceOptions.parse({"stream": "s", "maxRecordsPerTrigger": given})
    assert e.value.code == "OPTION" and "option maxRecordsPerTrigger=" in str(e.value)


def test_starting_positions_are_integers_from_zero():
    assert SourceOptions.parse({"stream": "s", "startingOffsets": '{"0": 5, "1": 0}'}).starting == {0: 5, 1: 0}
    for positions in ({"0": 1.5}, {"0": True}, {"0": -1}, {"x": 1}, {"0": None}, {"0": 1 << 63}):
        with pytest.raises(SparkSourceError) as e:
            SourceOptions.parse({"stream": "s", "startingOffsets": json.dumps(positions)})
        assert e.value.code == "OPTION" and "option startingOffsets=" in str(e.value), e.value


@pytest.mark.parametrize("given", ["nan", "inf", "-1", "soon"])
def test_metrics_interval_is_a_finite_number_of_seconds(given):
    """``nan`` was taken (and sampled at every trigger, as 0 does)."""
    with pytest.raises(SparkSourceError) as e:
        SourceOptions.parse({"stream": "$metrics", "metricsInterval": given})
    assert e.value.code == "OPTION" and "option metricsInterval=" in str(e.value)
