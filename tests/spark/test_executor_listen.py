"""Where the executor launcher's workers listen (``spark.sparkcep.listen``): each worker on PORT + its index."""

import pytest

from sparkcep.errors import EngineError
from sparkcep.spark.executor import listen_address


def test_workers_listen_on_consecutive_ports_or_any_free_one():
    assert [listen_address("10.0.0.5:7000", i) for i in range(3)] == ["10.0.0.5:7000", "10.0.0.5:7001", "10.0.0.5:7002"]
    assert listen_address("10.0.0.5", 2) == "10.0.0.5:0" and listen_address(None, 1) == "127.0.0.1:0"


@pytest.mark.parametrize("listen,index", [("10.0.0.5:65535", 1), ("10.0.0.5:99999", 0), ("10.0.0.5:7x", 0), (":7000", 0)])
def test_a_port_no_worker_can_listen_on_is_refused_naming_the_option(listen, index):
    """A port past 65535 reached the worker, which died of Python's OverflowError."""
    with pytest.raises(EngineError) as e:
        listen_address(listen, index)
    assert e.value.code == "LISTEN" and repr(listen) in str(e.value)
