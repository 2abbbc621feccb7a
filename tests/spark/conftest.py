"""One local Spark session for the whole run, engines with their loopback endpoint, shared data.

The session never calls ``spark.dataSource.register``: every test that uses
``format("upmcep")`` also checks that the source registers itself.
"""

from __future__ import annotations

import os
import time

import pytest

pyspark = pytest.importorskip("pyspark")

import sparkcep as cep  # noqa: E402


@pytest.fixture(scope="session")
def sparkcep_home(tmp_path_factory):
    """``$SPARKCEP_HOME`` for this run, set before the JVM starts so Spark's Python workers inherit it."""
    home = tmp_path_factory.mktemp("sparkcep-home")
    old = os.environ.get("SPARKCEP_HOME")
    os.environ["SPARKCEP_HOME"] = str(home)
    yield home
    if old is None:
        os.environ.pop("SPARKCEP_HOME", None)
    else:
        os.environ["SPARKCEP_HOME"] = old


@pytest.fixture(scope="session")
def spark(sparkcep_home):
    from pyspark.sql import SparkSession

    t = time.monotonic()
    session = (SparkSession.builder.master("local[2]").appName("sparkcep-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.streaming.stateStore.providerClass",
                       "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider")
               .config("spark.driver.memory", "1g")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    print(f"\nSpark session up in {time.monotonic() - t:.1f} s")
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def no_query_left(request):
    """A test's streaming queries stop with it, even when it failed: one left running disturbs the next."""
    yield
    if "spark" in request.fixturenames:
        for q in request.getfixturevalue("spark").streams.active:
            q.stop()


@pytest.fixture
def engine(sparkcep_home):
    """A fresh engine with its loopback endpoint, closed after the test."""
    with cep.Engine.local() as e:
        yield e
