"""Options and schemas the data source refuses before Spark runs anything, each naming what to do: they
were taken and then ignored, or ran on with a wrong result."""

import pytest
from pyspark.sql import types as T

from sparkcep.spark.connection import Target
from sparkcep.spark.options import SourceOptions, SparkSourceError
from sparkcep.spark.types import check_writable
from sparkcep.spark.writer import Staged, commit_batch


def refused(code: str, fn, *args) -> str:
    with pytest.raises(SparkSourceError) as e:
        fn(*args)
    assert e.value.code == code, e.value
    return str(e.value)


def test_the_stream_option_and_another_name_given_to_load_are_refused():
    """``option("stream", "small").load("all_rows")`` read ``small`` without a word."""
    message = refused("OPTION", SourceOptions.parse, {"stream": "small", "path": "all_rows"})
    assert "stream='small' and the name 'all_rows'" in message
    assert SourceOptions.parse({"stream": "same", "path": "same"}).stream == "same"


@pytest.mark.parametrize("option", [("startingOffsets", "latest"), ("maxRecordsPerTrigger", "5"),
                                    ("consumer", "c")])
def test_a_batch_read_refuses_the_options_of_streaming_reads(option):
    """A batch read took them and read every row all the same."""
    opts = SourceOptions.parse({"stream": "o", option[0]: option[1]})
    assert f"option {option[0]} applies to streaming reads" in refused("OPTION", opts.check_batch_readable)
    SourceOptions.parse({"stream": "o", "includeMetadata": "true", "rowsPerPartition": "3"}).check_batch_readable()


@pytest.mark.parametrize("interval", ["0", "0.0", "0.05"])
def test_a_metrics_interval_below_a_tenth_of_a_second_is_refused(interval):
    """0 made every micro-batch take a new sample: processAllAvailable() never returned."""
    assert "expected a number of seconds >= 0.1" in refused(
        "OPTION", SourceOptions.parse, {"stream": "$metrics", "metricsInterval": interval})
    assert SourceOptions.parse({"stream": "$metrics", "metricsInterval": "0.1"}).metrics_interval == 0.1


@pytest.mark.parametrize("option, says", [
    (("metricsInterval", "5"), "option metricsInterval applies to stream $metrics only, not 'o'"),
    (("form", "wide"), "option form applies to stream $metrics only, not 'o'"),
    (("consumer", ""), "option consumer is empty"), (("engine", " "), "option engine is empty"),
    (("tokenFile", ""), "option tokenFile is empty")])
def test_an_option_that_would_do_nothing_is_refused(option, says):
    """metricsInterval on an output was taken and did nothing (form was refused); an empty consumer, engine or
    tokenFile (an unset shell variable) was taken as the default."""
    assert says in refused("OPTION", SourceOptions.parse, {"stream": "o", option[0]: option[1]})


def test_a_digit_of_another_script_is_no_number():
    """An Arabic-Indic three was taken as 3 where '+5' is refused."""
    assert "option rowsPerPartition=" in refused("OPTION", SourceOptions.parse,
                                                 {"stream": "o", "rowsPerPartition": "\u0663"})


def test_a_wall_clock_time_is_refused_where_the_stream_holds_instants():
    """A timestamp_ntz column was taken as UTC whatever the session's time zone (5 h off in New York)."""
    schema = T.StructType([T.StructField("t", T.TimestampNTZType()), T.StructField("v", T.LongType())])
    message = refused("SCHEMA", check_writable, "s", {"t": "timestamp", "v": "int64"}, schema)
    assert "column 't' is timestamp_ntz" in message and "cast it to timestamp" in message
    instants = T.StructType([T.StructField("t", T.TimestampType()), T.StructField("v", T.LongType())])
    assert check_writable("s", {"t": "timestamp", "v": "int64"}, instants) == ["t", "v"]


@pytest.mark.parametrize("second", [T.LongType(), T.StringType()])
def test_a_column_that_appears_twice_is_refused_naming_it(second):
    """After a join: of one type, the check passed and every task failed with Spark's Arrow error; of two, it
    said the column was of the wrong type while one of the right type was there."""
    schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("ts", T.TimestampType()),
                           T.StructField("id", second)])
    message = refused("SCHEMA", check_writable, "ev", {"id": "int64", "ts": "timestamp"}, schema)
    assert "column 'id' appears 2 times" in message


def test_a_commit_refuses_rows_its_tasks_staged_in_another_engine():
    """With ``engine`` unset, a second engine started on the machine took a micro-batch's tasks while the commit
    went to the first: the query failed saying the engine had restarted, which none had."""
    here, there = Target("127.0.0.1:1111"), "127.0.0.1:2222"
    staged = [Staged("w", 3, 0, "a0", 10, "run-b", there), Staged("w", 3, 1, "a0", 5, "run-a", here.address)]
    message = refused("ENGINE_CHANGED", commit_batch, here, "s", staged, 3)
    assert "tasks wrote to the engine at 127.0.0.1:2222, its commit goes to the engine at 127.0.0.1:1111" in message
