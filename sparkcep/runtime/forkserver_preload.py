"""Imported by the forkserver of the instance managers: load the runtime and warm its kernels once,
so every worker forked from the server starts with them compiled."""

from sparkcep.runtime import instance_manager  # noqa: F401
from sparkcep.runtime.warmup import warm_up

warm_up()
