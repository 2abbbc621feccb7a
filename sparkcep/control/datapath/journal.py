"""The primary data path's journal: what it took, streamed to its standby before anything is acknowledged.

The engine, its output logs and the endpoint's staging call the hooks
(:meth:`Journal.sent`, :meth:`Journal.published`, ...) at the moment a
change happens, under the journal's lock, so entries keep the order of the
changes. Each hook records the change and, while a standby is attached,
sends it there and waits for its answer. The *input* entries (deploy,
send, abort, end, undeploy, layout) are also kept here, in order: a new
standby is synced from them, the output logs and the staging as they are
now (:meth:`Journal.attach`); the rest (published rows, consumers, staged
chunks) lives in those objects already.

Acknowledgement is separate: the endpoint answers a request that changed
something only after :meth:`Journal.confirm` — once a synced standby holds
every entry so far. Without one it answers ``NO_STANDBY`` (clients try
again, under the same send id), so no acknowledged row is held by one
process only, and only once the registry names that standby as this era's
(:meth:`Journal.mark_recorded`): a standby dropped since cannot take over
with less than was acknowledged. Output rows obey the same rule before any
reader sees them: without a recorded standby to take them, a log refuses
them (:class:`~sparkcep.runtime.output_log.NotHeld`) and the sink offers
them again later. A standby that fails or does not answer within
:data:`LINK_TIMEOUT_S` is dropped.
"""

from __future__ import annotations

import logging
import threading
import time

import cloudpickle

from sparkcep.control.datapath.wire import frames
from sparkcep.errors import EngineError, SparkcepError
from sparkcep.gateway.client import EngineClient
from sparkcep.gateway.deployed import options_to_wire
from sparkcep.runtime.output_log import NotHeld

log = logging.getLogger("sparkcep")
LINK_TIMEOUT_S = 5.0  # a standby that makes no progress on a request for this long is dropped
CONFIRM_S = 5.0  # an acknowledgement waits this long for a synced standby, then says NO_STANDBY


class Journal:
    """The primary's record and standby link, for era ``era`` of cluster run ``run``."""

    def __init__(self, era: int, run: str, token: str, entries: list[dict] | None = None,
                 last_deployment: int = 0):
        self.era, self.run, self.token = era, run, token
        self.entries: list[dict] = list(entries or [])  # input entries, in order
        self.last_deployment = last_deployment  # the highest deployment number given, undeployed ones too
        self.lock = threading.RLock()
        self.standby: str | None = None  # the name of the synced standby
        self.recorded = False  # the registry names it as this era's standby: acknowledgements may go
        self.outputs = {}  # output name -> its OutputLog (the engine's dict): what a standby is synced from
        self.staging = None  # the endpoint's Staging
        self._link: EngineClient | None = None
        self._attached = threading.Condition(self.lock)
        self.closed = False

    # --- hooks: the engine, its output logs and the endpoint call them ----------------------
    def sent(self, stream: str, batches, seq: int, epochs: dict, key) -> None:
        self._input({"kind": "send", "stream": stream, "seq": seq, "epochs": epochs,
                     "key": list(key) if key else None, "rows": sum(b.num_rows for b in batches),
                     "batches": batches})

    def aborted(self, seq: int, deployments: list[str]) -> None:
        with self.lock:
            for entry in reversed(self.entries):
                if entry["kind"] == "send" and entry["seq"] == seq:
                    entry["aborted"] = deployments
                    break
            self._replicate({"kind": "abort", "seq": seq, "deployments": deployments})

    def ended(self, stream: str, seq: int, epochs: dict) -> None:
        self._input({"kind": "end", "stream": stream, "seq": seq, "epochs": epochs})

    def deployed(self, dep_id: str, query, options: dict) -> None:
        self.last_deployment = max(self.last_deployment, deployment_number(dep_id))
        self._input({"kind": "deploy", "deployment": dep_id, "query": query.name,
                     "options": options_to_wire(options), "blob": cloudpickle.dumps(query)})

    def failed(self, dep_id: str, error: EngineError) -> None:
        """Deployment ``dep_id`` failed: a take-over fails it again, whatever made it fail (a worker that
        died is not there to die again)."""
        self._input({"kind": "failed", "deployment": dep_id, "code": getattr(error, "code", "INTERNAL"),
                     "message": str(error)})

    def undeployed(self, name: str) -> None:
        with self.lock:
            gone = {e["deployment"] for e in self.entries if e["kind"] == "deploy" and e["query"] == name}
            self.entries = forget(self.entries, gone)
            self._replicate({"kind": "undeploy", "query": name})

    def reconfigured(self, dep, report: dict) -> None:
        """A migration changed ``dep``'s layout: a replay deploys the last one, and keeps every report."""
        self._input({"kind": "layout", "deployment": dep.id, "parallelism": dict(dep.parallelism),
                     "owners": {op: t.owners.tolist() for op, t in dep.tables.items()}, "report": report})

    def published(self, log_, epoch, parts) -> None:
        """Rows an output log takes (``(partition, stored batch or rows)``), before any reader sees them:
        :class:`NotHeld` unless the recorded standby took them (the log takes them later)."""
        batches = [kept for _, kept in parts if not isinstance(kept, int)]
        with self.lock:
            if self.recorded:
                self._replicate({"kind": "publish", "deployment": log_.deployment, "output": log_.name,
                                 "epoch": epoch, "bases": {str(p): v for p, v in log_.bases().items()},
                                 "parts": [[p, kept if isinstance(kept, int) else None] for p, kept in parts],
                                 "batches": batches or None})
            if not self.recorded:
                raise NotHeld(f"output {log_.name!r}: no standby holds the data path now (one is being started, "
                              "synced or recorded): its rows wait for it", "NOT_HELD")

    def consumed(self, log_, kind: str, consumer: str, positions) -> None:
        positions = None if positions is None else {str(p): int(v) for p, v in positions.items()}
        self._replicate({"kind": "consumer", "deployment": log_.deployment, "output": log_.name, "what": kind,
                         "consumer": consumer, "positions": positions})

    def staged(self, writer: str, batch: int, partition: int, attempt: str, chunk: int, stream: str, table) -> None:
        self._replicate({"kind": "stage", "writer": writer, "batch": batch, "partition": partition,
                         "attempt": attempt, "chunk": chunk, "stream": stream,
                         "batches": table.to_batches() or None, "schema": table.schema})

    def unstaged(self, writer: str, batch: int) -> None:
        self._replicate({"kind": "unstage", "writer": writer, "batch": batch})

    def _input(self, entry: dict) -> None:
        with self.lock:
            self.entries.append(entry)
            self._replicate(entry)

    # --- the standby ------------------------------------------------------------------------
    def _replicate(self, entry: dict) -> None:
        """Send ``entry`` to the standby (holding the lock); a standby that fails is dropped."""
        with self.lock:
            if self._link is None:
                return
            try:
                _send(self._link, self.era, entry)
            except SparkcepError as e:
                self._drop(f"{e} [{e.code}]")

    def _drop(self, why: str) -> None:
        log.warning("data path: standby %s dropped: %s", self.standby, why)
        self._link.close()
        self._link, self.standby, self.recorded = None, None, False

    def attach(self, name: str, address: str) -> None:
        """Sync the engine host ``name`` at ``address`` and make it the standby: everything taken so far,
        then every entry as it comes. Holds every hook back meanwhile."""
        with self.lock:
            if self._link is not None:
                self._drop(f"replaced by {name}")
            link = EngineClient(address, timeout=LINK_TIMEOUT_S, token=self.token)
            started = time.monotonic()
            try:
                _send(link, self.era, {"kind": "begin", "run": self.run, "last_deployment": self.last_deployment})
                for entry in self.entries:
                    _send(link, self.era, entry)
                for log_ in list(self.outputs.values()):
                    _send(link, self.era, _log_entry(log_))
                for entry in self.staging.entries() if self.staging is not None else ():
                    _send(link, self.era, entry)
                _send(link, self.era, {"kind": "ready"})
            except BaseException:
                link.close()
                raise
            self._link, self.standby, self.recorded = link, name, False
            log.info("data path: standby %s synced in %.2f s (%d entries)", name, time.monotonic() - started,
                     len(self.entries))

    def mark_recorded(self, name: str) -> None:
        """The registry names ``name`` as this era's standby now: acknowledge again (if it is still ours)."""
        with self._attached:
            if self.standby == name:
                self.recorded = True
                self._attached.notify_all()

    def confirm(self, timeout: float = CONFIRM_S) -> None:
        """Return once a synced standby holds every entry so far; EngineError ``NO_STANDBY`` after
        ``timeout`` seconds without one (the change stays; asked again, the same send id is taken once)."""
        deadline = time.monotonic() + timeout
        with self._attached:
            while self._link is None or not self.recorded:
                left = deadline - time.monotonic()
                if left <= 0 or self.closed:
                    raise EngineError("the data path has no standby to hold this change yet (one is being "
                                      "started or synced): try again", "NO_STANDBY")
                self._attached.wait(min(left, 0.1))

    def close(self) -> None:
        with self.lock:
            self.closed = True
            if self._link is not None:
                self._link.close()
                self._link = None
            self._attached.notify_all()


def _send(link: EngineClient, era: int, entry: dict) -> None:
    for header, payload in frames(entry):
        link.request("journal", payload, era=era, **header)


def _log_entry(log_) -> dict:
    """An output log as it is now, as one entry (its retained batches in order)."""
    snap = log_.snapshot()
    parts, batches = {}, []
    for p, (base, end, dropped, held) in snap["parts"].items():
        parts[str(p)] = [base, end, dropped, [start for start, _ in held]]
        batches.extend(b for _, b in held)
    return {"kind": "log", "deployment": log_.deployment, "output": log_.name, "epoch": snap["epoch"], "rows": snap["rows"],
            "dropped": snap["dropped"], "consumers": snap["consumers"], "parts": parts,
            "batches": batches or None, "schema": log_.stored_schema}


def deployment_number(dep_id: str) -> int:
    """The number of deployment ``dep_id`` (``query#3``: 3): a new deployment's id takes a higher one, so
    a reader's positions of an earlier deployment of the query are refused (OFFSET_DEPLOYMENT)."""
    return int(dep_id.rpartition("#")[2])


def forget(entries: list[dict], deployments: set[str]) -> list[dict]:
    """``entries`` without what only ``deployments`` (undeployed) needed."""
    out = []
    for e in entries:
        if e.get("deployment") in deployments:
            continue
        if "epochs" in e:
            epochs = {d: n for d, n in e["epochs"].items() if d not in deployments}
            if not epochs:
                continue
            e = {**e, "epochs": epochs}
        out.append(e)
    return out


def query_of(entry: dict):
    """The query a deploy entry carries (pickled by the primary, which proved the token)."""
    return cloudpickle.loads(entry["blob"])

