"""``sparkcep zookeeper`` removes its temporary data directory however it is told to stop: on SIGHUP (its
terminal closed) it left the directory behind, while SIGTERM and Ctrl-C removed it."""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]))


def ctrl_c_delivered() -> None:
    """In the child, before exec: SIGINT as in a terminal's foreground process (a test run in the background
    has it ignored, and an ignored SIGINT is inherited)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_the_development_server_removes_its_temporary_data_when_stopped(sig):
    server = subprocess.Popen([sys.executable, "-m", "sparkcep", "zookeeper"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=ENV,
                              preexec_fn=ctrl_c_delivered)
    try:
        serving = server.stdout.readline()
        data = re.search(r"data (/\S+),", serving)
        assert data and Path(data.group(1)).is_dir(), (serving, server.stderr.read() if not serving else "")
        server.send_signal(sig)
        assert server.wait(30) == 0, server.stderr.read()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert not Path(data.group(1)).exists()
