"""The standby's copy of the data path, and the take-over that turns it into a running engine.

:class:`Backup` applies the primary's journal entries (:mod:`.journal`) as
they come: the input entries are kept in order; published rows, releases
and consumers go into output logs like the primary's (same partitions,
positions, consumers, last epoch); staged chunks into a
:class:`~sparkcep.gateway.staging.Staging`. It answers only the primary of
its era: an entry of an older era, or any entry once it took over, is
refused (``FENCED``), so a deposed primary can acknowledge nothing more.

:func:`replay` is the take-over: an engine deploys every recorded query
under its recorded id (with its last recorded layout) on the cluster's
instance managers, its output logs take the backup's, and the recorded
input is sent again in order, with its sequence numbers, epochs, aborts and
ends. The instances rebuild their state from it (a query's rows depend on
its input alone, DESIGN §4); every epoch the logs already hold is left out
of them (an epoch is taken once), so readers see each row once, at the
position they saw it before.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time

import pyarrow as pa

from sparkcep.control.datapath.journal import deployment_number, forget, query_of
from sparkcep.control.datapath.wire import Assembler
from sparkcep.errors import EngineError
from sparkcep.gateway.deployed import options_from_wire
from sparkcep.gateway.staging import Staging
from sparkcep.runtime.output_log import OutputLog, Retention
from sparkcep.runtime.send_ids import SendIds

log = logging.getLogger("sparkcep")
KEEP_ALL = Retention(rows=None, bytes=None, age_s=None)  # a standby's logs drop only what the primary's did


class Backup:
    """What a standby holds of the primary of era :attr:`era`."""

    def __init__(self):
        self.lock = threading.Lock()
        self.fenced = False  # set once this host takes over: no primary may feed it any more
        self._reset(0, None)

    def _reset(self, era: int, run: str | None) -> None:
        self.era, self.run, self.synced = era, run, False
        self.last_deployment = 0  # the highest deployment number the primary gave, undeployed ones too
        self.entries: list[dict] = []
        self.queries: dict = {}  # deployment id -> its Query
        self.logs: dict[str, dict[str, OutputLog]] = {}  # deployment id -> output -> its copy
        self.staging = Staging()
        self._assembler = Assembler()

    def apply(self, era: int, header: dict, payload) -> None:
        """Take one frame of an entry from the primary of era ``era``."""
        with self.lock:
            if self.fenced or era < self.era or (era > self.era and header.get("kind") != "begin"):
                raise EngineError(f"this engine host follows no primary of era {era} (it follows era {self.era}"
                                  f"{', and took over since' if self.fenced else ''})", "FENCED")
            entry = self._assembler.add(header, payload)
            if entry is not None:
                self._apply(era, entry)

    def _apply(self, era: int, e: dict) -> None:
        kind = e["kind"]
        if kind == "begin":
            self._reset(era, e["run"])
            self.last_deployment = e.get("last_deployment", 0)
        elif kind == "ready":
            self.synced = True
        elif kind in ("send", "end", "layout", "failed"):
            self.entries.append(e)
            key = e.get("key")
            if key and key[0] == "stage":
                self.staging.settle(key[1], int(key[2]))
        elif kind == "abort":
            for entry in reversed(self.entries):
                if entry["kind"] == "send" and entry["seq"] == e["seq"]:
                    entry["aborted"] = e["deployments"]
                    break
        elif kind == "deploy":
            self.entries.append(e)
            self.last_deployment = max(self.last_deployment, deployment_number(e["deployment"]))
            query = self.queries[e["deployment"]] = query_of(e)
            self.logs[e["deployment"]] = {out: OutputLog(op.schema.to_arrow(), out, KEEP_ALL, deployment=e["deployment"])
                                          for out, op in query.outputs.items()}
        elif kind == "undeploy":
            gone = {d for d, q in self.queries.items() if q.name == e["query"]}
            self.entries = forget(self.entries, gone)
            for d in gone:
                self.queries.pop(d)
                self.logs.pop(d, None)
        elif kind == "publish":
            log_ = self.logs[e["deployment"]][e["output"]]
            log_.rebase({int(p): tuple(v) for p, v in e["bases"].items()})
            held = iter(e.get("batches") or [])
            log_.append_stored(e["epoch"], [(p, rows if rows is not None else next(held)) for p, rows in e["parts"]])
        elif kind == "consumer":
            log_ = self.logs[e["deployment"]][e["output"]]
            positions = None if e["positions"] is None else {int(p): v for p, v in e["positions"].items()}
            log_.register(e["consumer"], positions) if e["what"] == "register" else log_.commit(positions, e["consumer"])
        elif kind == "log":
            held = iter(e.get("batches") or [])
            self.logs[e["deployment"]][e["output"]].restore({
                "epoch": e["epoch"], "rows": e["rows"], "dropped": e["dropped"], "consumers": e["consumers"],
                "parts": {int(p): (base, end, dropped, [(s, next(held)) for s in starts])
                          for p, (base, end, dropped, starts) in e["parts"].items()}})
        elif kind == "stage":
            batches = e.get("batches") or []
            table = pa.Table.from_batches(batches, e.get("schema")) if e.get("schema") is not None else pa.table({})
            self.staging.stage(e["writer"], int(e["batch"]), int(e["partition"]), e["attempt"], int(e["chunk"]),
                               e["stream"], table)
        elif kind == "unstage":
            self.staging.abort(e["writer"], int(e["batch"]))
        elif kind == "committed":
            self.staging.settle(e["writer"], int(e["batch"]))
        else:
            raise EngineError(f"unknown journal entry {kind!r}", "PROTOCOL")

    def sent_ids(self) -> SendIds:
        """The send ids the primary took, with their rows: a client retrying one gets its answer."""
        ids = SendIds()
        for e in self.entries:
            key = e.get("key")
            if e["kind"] == "send" and key and key[0] == "id" and not e.get("aborted"):
                ids.add(e["stream"], key[1], e["rows"])
        return ids


def replay(backup: Backup, engine, progress=log.info) -> None:
    """Make ``engine`` (fresh, over the cluster's instance managers) run what ``backup`` recorded."""
    engine.run_id = backup.run
    layouts = {e["deployment"]: e for e in backup.entries if e["kind"] == "layout"}
    deps: dict = {}  # deployment id -> its runtime deployment
    started, rows = time.monotonic(), 0
    with engine._lock:
        for e in backup.entries:
            kind = e["kind"]
            if kind == "deploy":
                deps[e["deployment"]] = _redeploy(engine, backup, e, layouts.get(e["deployment"]))
                progress("replay: %s deployed again", e["deployment"])
            elif kind == "send":
                fed = [deps[d] for d in e["epochs"] if d in deps]
                for d in fed:
                    _set_epoch(d, e["epochs"][d.id])
                if e.get("aborted"):
                    for d in fed:
                        if d.id in e["aborted"] and d.error is None:
                            d.abort()
                    continue
                engine._seq = e["seq"]
                time_field = fed[0].query.sources[e["stream"]].time_field
                try:
                    engine._send(e["stream"], fed, e["batches"], time_field)
                except EngineError as error:  # as on the primary: the deployment failed on it
                    log.warning("replay: send of %d rows to %s: %s [%s]", e["rows"], e["stream"], error, error.code)
                rows += e["rows"]
            elif kind == "failed" and e["deployment"] in deps and deps[e["deployment"]].error is None:
                deps[e["deployment"]].fail(EngineError(e["message"], e["code"]))
            elif kind == "end":
                engine._seq = e["seq"]
                engine._ended.add(e["stream"])
                for d in (deps[d] for d in e["epochs"] if d in deps):
                    _set_epoch(d, e["epochs"][d.id])
                    d.end(e["stream"], e["seq"] - 1)
        engine._deployment_ids = itertools.count(backup.last_deployment + 1)  # no id of the run given twice
    progress("replayed %d deployments and %d rows in %.2f s", len(deps), rows, time.monotonic() - started)


def _redeploy(engine, backup: Backup, e: dict, layout: dict | None):
    """Deploy the query of deploy entry ``e`` again under its id, its output logs taking the backup's."""
    query, options = backup.queries[e["deployment"]], options_from_wire(e["options"])
    parallelism = options["parallelism"]
    if layout is not None:  # by its operators' names: the first operator of each sub-query
        from sparkcep.query.planner import plan
        first = {sq.name: sq.operators[0].name for sq in plan(query).subqueries}
        parallelism = {first[sq]: n for sq, n in layout["parallelism"].items()}
    engine._deploy(e["deployment"], query, parallelism, options["bins"], options["retain"], options["balance"],
                   options["replicas"])
    dep = engine.deployments[query.name]
    for op, owners in (layout or {}).get("owners", {}).items():
        for member in getattr(dep, "members", [dep]):
            member.configure(op, owners)
    engine._deployed[query.name]._migrator.reports.extend(  # the migrations' history, as the primary had it
        x["report"] for x in backup.entries if x["kind"] == "layout" and x["deployment"] == e["deployment"])
    for out, copy in backup.logs[e["deployment"]].items():
        engine.outputs[out].adopt(copy)
    return dep


def _set_epoch(dep, epoch: int) -> None:
    """The epoch the primary gave ``dep`` for this entry (equal unless a replica set differs)."""
    for member in getattr(dep, "members", [dep]):
        member.epoch = epoch
