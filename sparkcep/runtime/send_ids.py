"""Send ids: a send retried after a lost reply is taken once.

A client puts a fresh id on each send and the same id on its retries; the
engine keeps the rows each of the last ids of a stream took and answers a
repeated id with them, taking nothing. A repeated id whose rows are not as
many as the first time's is no retry: it is refused, not dropped. A
cluster's standby rebuilds the record from the journal, so a retry that
reaches it after a fail-over is taken once too.
"""

from __future__ import annotations

from collections import OrderedDict

from sparkcep.errors import InputError


class SendIds:
    """The rows each of the last ``keep`` (stream, send id) pairs took."""

    def __init__(self, keep: int = 1 << 16):
        self.keep, self._rows = keep, OrderedDict()

    def taken(self, stream: str, send_id: str) -> int | None:
        """The rows send ``send_id`` of ``stream`` took, or None if it is not known."""
        return self._rows.get((stream, send_id))

    def forget(self, stream: str) -> None:
        """Forget the ids of ``stream`` (no deployment reads it any more; a cluster's journal drops its sends)."""
        for key in [k for k in self._rows if k[0] == stream]:
            del self._rows[key]

    def add(self, stream: str, send_id: str, rows: int) -> None:
        self._rows[stream, send_id] = rows
        while len(self._rows) > self.keep:
            self._rows.popitem(last=False)


def send_id_of(value) -> str:
    """A send id as given: a non-empty string (InputError ``BAD_SEND_ID``)."""
    if not isinstance(value, str) or not value:
        raise InputError(f"send_id must be a non-empty string, got {value!r} ({type(value).__name__})",
                         "BAD_SEND_ID")
    return value


def check_retry(stream: str, send_id: str, taken: int, rows: int) -> None:
    """A send of ``rows`` rows repeating ``send_id``, which took ``taken``: a retry only if as many."""
    if rows != taken:
        raise InputError(f"send_id {send_id!r} of stream {stream!r} was taken with {taken} rows and is given again "
                         f"with {rows}: a send id names one send (use a fresh id for new rows)", "SEND_ID_REUSED")
