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
