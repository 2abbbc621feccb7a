"""An instance manager's process setup: its memory is faulted in once, not at the first large batch."""

import subprocess
import sys

FAULTS_AFTER_SETUP = """
import resource
import numpy as np
from sparkcep.runtime.process import keep_freed_memory
keep_freed_memory()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
arrays = [np.ones(1 << 20) for _ in range(3)]  # 24 MB: what a window closing over 50K keys allocates
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_the_first_large_batches_do_not_fault_memory_in():
    """Fresh, 24 MB take over a thousand page faults; after the set-up they reuse heap already faulted in."""
    faults = int(subprocess.check_output([sys.executable, "-c", FAULTS_AFTER_SETUP], text=True))
    assert faults < 300


def test_an_engine_gone_before_the_answer_to_its_hello_leaves_the_instance_manager_serving(monkeypatch):
    """An engine stopped between its hello and the instance manager's answer made the answer raise
    ConnectionResetError out of the instance manager's loop: it died with a traceback (seen when
    ``sparkcep bench`` was stopped while connecting)."""
    import socket
    import time

    from sparkcep.runtime import instance_manager as im_mod
    from sparkcep.runtime.channels import hello

    server = socket.create_server(("127.0.0.1", 0))
    im = im_mod.InstanceManager("im-test", server, "token")
    ours, theirs = socket.socketpair()
    try:
        monkeypatch.setattr(im.gate, "accept", lambda s: hello.Hello("", hello.COMMAND, s, None, "engine"))

        def reset(*args, **kwargs):
            raise ConnectionResetError(104, "Connection reset by peer")
        monkeypatch.setattr(hello, "send_frame", reset)
        im.greeting[ours] = time.monotonic() + 10
        im._greet(ours)
        assert im.links == {} and im.greeting == {} and ours.fileno() == -1
    finally:
        theirs.close()
        ours.close()
        im.close()
