"""State handed over between sub-query instances at a control record: the runtime's extract/install hook.

Live migration, State Transfer, rescaling and replica catch-up all come
down to this (DESIGN §5): an instance that aligns an
:class:`~sparkcep.runtime.channels.Export` record has consumed everything
before it, so it takes (or copies) the state of some bins, or gives away
the whole instance, and hands it over under a *ticket*; an instance that
aligns an :class:`~sparkcep.runtime.channels.Import` record installs what
arrived under its tickets before it consumes anything after the record.

:class:`Handoffs` is one process's end of that: state for an instance of
the same process stays an object; state for another process is pickled
(protocol 5) and ``forward``-ed — an instance manager sends it to its engine,
which relays it to the importing instance manager. Both are authenticated
command connections: nothing a stranger sent is unpickled. Installs are
``report``-ed to the engine, whose :class:`Board` the callers wait on.
"""

from __future__ import annotations

import pickle
import threading
import time
from dataclasses import dataclass

from sparkcep.errors import EngineError

ENGINE_HOST = "engine"  # the host name of instances running in the engine's process


@dataclass
class Adopted:
    """A whole instance given to its successor in the same process (a new generation of its deployment)."""

    instance: object  # the SubQueryInstance, its operators and their state
    counters: object


class Handoffs:
    """Handed-over state arriving in one process, by ticket.

    ``host``: this process's name in Export items; ``forward(ticket, host,
    blob)`` sends pickled state to another process; ``report(ticket,
    nbytes)`` tells the engine an import is installed.
    """

    def __init__(self, host: str, forward=None, report=None):
        self.host, self.forward, self.report = host, forward, report
        self.arrived: dict[str, object] = {}  # ticket -> state, or its pickle from another process

    def send(self, ticket: str, host: str, state) -> None:
        if host == self.host:
            self.arrived[ticket] = state
            return
        if isinstance(state, Adopted) or self.forward is None:
            raise EngineError(f"handoff {ticket}: cannot hand this state from {self.host} to {host}", "HANDOFF")
        self.forward(ticket, host, pickle.dumps(state, protocol=5))

    def receive(self, ticket: str, blob: bytes) -> None:
        """State for ``ticket`` from another process (already authenticated by the connection)."""
        self.arrived[ticket] = blob

    def take(self, ticket: str):
        """The state handed over under ``ticket``, or None while it has not arrived."""
        state = self.arrived.pop(ticket, None)
        return pickle.loads(state) if isinstance(state, (bytes, bytearray)) else state

    def installed(self, ticket: str, nbytes: int) -> None:
        if self.report is not None:
            self.report(ticket, nbytes)


class Board:
    """The engine's record of installed handoffs: ticket -> bytes; :meth:`wait` blocks on tickets."""

    def __init__(self):
        self.done: dict[str, int] = {}
        self.cond = threading.Condition()

    def installed(self, ticket: str, nbytes: int) -> None:
        with self.cond:
            self.done[ticket] = nbytes
            self.cond.notify_all()

    def wait(self, tickets, timeout: float, check=None) -> int:
        """Block until every ticket is installed; returns their bytes. ``check()`` raises when the
        deployment failed; EngineError ``HANDOFF_TIMEOUT`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        tickets = list(tickets)
        while True:
            with self.cond:
                if all(t in self.done for t in tickets):
                    return sum(self.done.pop(t) for t in tickets)
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [t for t in tickets if t not in self.done]
                    raise EngineError(f"{len(missing)} state handoff(s) not installed after {timeout:.0f} s: "
                                      f"{missing[:3]}", "HANDOFF_TIMEOUT")
                self.cond.wait(min(left, 0.05))
            if check is not None:
                check()
