"""The data source's integer options take what Spark hands over (strings of digits) and what Python users
pass (ints, numpy integers), and refuse floats, bools and negative positions with UPMCEP_OPTION: a
``startingOffsets`` position of 1.5 or ``true`` was read as 1."""

import json

import numpy as np
import pytest

from sparkcep.spark.options import SourceOptions, SparkSourceError


@pytest.mark.parametrize("given", ["10", " 10 ", 10, np.int64(10)])
def test_integer_options_take_strings_of_digits_and_integers(given):
    options = SourceOptions.parse({"stream": "s", "maxRecordsPerTrigger": given, "rowsPerPartition": given})
    assert options.max_records == options.rows_per_partition == 10 and type(options.max_records) is int


@pytest.mark.parametrize("given", ["1.5", 1.5, "true", True, "-3", 0, "ten"])
def test_integer_options_refuse_anything_else(given):
    with pytest.raises(SparkSourceError) as e:
        SourceOptions.parse({"stream": "s", "maxRecordsPerTrigger": given})
    assert e.value.code == "OPTION" and "option maxRecordsPerTrigger=" in str(e.value)


def test_starting_positions_are_integers_from_zero():
    assert SourceOptions.parse({"stream": "s", "startingOffsets": '{"0": 5, "1": 0}'}).starting == {0: 5, 1: 0}
    for positions in ({"0": 1.5}, {"0": True}, {"0": -1}, {"x": 1}, {"0": None}):
        with pytest.raises(SparkSourceError) as e:
            SourceOptions.parse({"stream": "s", "startingOffsets": json.dumps(positions)})
        assert e.value.code == "OPTION" and "option startingOffsets=" in str(e.value), e.value
