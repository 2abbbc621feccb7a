"""Who serves a cluster's data path: primary, standby or spare, decided and fenced in the registry.

Nodes (:mod:`sparkcep.control.tree`): ``/hosts/<name>`` (ephemeral, each
engine host's role, era and run); ``/engine`` (ephemeral: the primary, its
address and era); ``/datapath`` (persistent: the era, its primary and the
standby synced with it). An *era* counts the primaries of a data path's
run: a take-over starts the next one.

* A host becomes primary only by creating ``/engine`` and writing
  ``/datapath`` in one transaction, checked against the ``/datapath``
  version it read: two hosts cannot both win, nor a late one undo a later
  era.
* The standby named in ``/datapath`` for the current era, holding every
  entry of it, takes over (era + 1) once ``/engine`` is gone — after
  :data:`GRACE_S` after its own session came back when it was cut too (a
  ZooKeeper pause or restart: the primary may be re-registering), and never
  while another host says it is primary of that era or later.
* A primary serves only while its session is connected and ``/engine`` is
  its own. When the session is suspended it stops answering changes; once
  connected again it takes ``/engine`` back (same era) — or, finding a
  later era, knows it was deposed and stops.
* A spare founds a new run (era 1) only when the registry holds no data
  path at all and it never saw one since it started, after
  :data:`FOUND_GRACE_S`: a ZooKeeper restarted empty shows none for a
  while, and a spare must not start the cluster's data path over then.

One thread decides, on every change of those nodes and every
:data:`STEP_S`; the host does what it decides (:class:`~sparkcep.control.host.EngineHost`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid

from sparkcep.control import tree
from sparkcep.control.registry import RegistryError, State

log = logging.getLogger("sparkcep")
STEP_S = 0.25
GRACE_S = 4.0  # after its own session was cut, a standby waits this long for the primary to come back
ABSENT_S = 1.0  # within CUT_MEMORY_S of its own session coming back, a standby sees no primary this long first
CUT_MEMORY_S = 60.0
ORPHAN_S = 60.0  # a host that sees no orchestrator in the registry this long stops: its cluster is gone
NO_REGISTRY_S = 600.0  # and one that reaches no registry this long (as long as ORPHAN_S once its starter is gone)
FOUND_GRACE_S = 5.0  # a spare founds a new data path only after the registry showed none for this long


class Roles:
    """The role of engine host ``name`` (``doc()``: its address, pid, host), acted out by ``host``."""

    def __init__(self, registry, name: str, doc, host):
        self.registry, self.name, self._doc, self.host = registry, name, doc, host
        self.role, self.era, self.run = "spare", 0, None
        self.deposed = threading.Event()
        self._claimed = False  # /engine is ours, in this session
        self._back_at: float | None = None  # when our session came back after it was last cut off
        self._absent_since: float | None = None  # since when a standby has seen no primary
        self._seen = False  # whether it ever saw a data path: then it never founds one (a restarted ZooKeeper)
        self._since = time.monotonic()  # when we joined, for founding
        self._orphan_since: float | None = None
        self._closed = False
        self._wake = threading.Event()
        self.presence = registry.keep(tree.host(name), self._host_doc())
        registry.add_listener(self._on_state)
        self._watches = [registry.watch(tree.ENGINE, lambda _: self._wake.set()),
                         registry.watch_children(tree.HOSTS, lambda _: self._wake.set())]
        self._starter = os.getppid()  # the orchestrator that started this host (this host outlives it)
        for target in (self._loop, self._watch_orphans):
            threading.Thread(target=target, name=f"sparkcep-roles-{name}", daemon=True).start()

    # --- what the host asks ----------------------------------------------------------------
    def serving(self) -> bool:
        """Whether this host may take changes now: the primary, connected, holding ``/engine``."""
        return self.role == "primary" and self._claimed and self.registry.state is State.CONNECTED

    def synced(self, era: int, run: str) -> None:
        """The primary of ``era`` finished syncing this host: it is that era's standby."""
        self._become("standby", era, run)

    def orphaned(self) -> str | None:
        """Why this host's cluster is gone, if it is: no orchestrator in the registry for :data:`ORPHAN_S`;
        no registry for as long while the orchestrator that started this host is gone too; or no registry
        for :data:`NO_REGISTRY_S` (a ZooKeeper outage alone must not end the data path). Kept up to date by
        a thread of its own (registry calls may wait): asking never waits."""
        if self._orphan_since is None:
            return None
        alone, since = self._orphan_since
        if alone == "registry":
            bound = ORPHAN_S if os.getppid() != self._starter else NO_REGISTRY_S
        else:
            bound = ORPHAN_S
        return f"no {alone} for {bound:.0f} s" if time.monotonic() - since > bound else None

    def _watch_orphans(self) -> None:
        while not self._closed:
            try:
                alone = ("registry" if self.registry.state is not State.CONNECTED else
                         None if self.registry.children(tree.ORCHESTRATORS) else "orchestrator")
            except RegistryError:
                alone = "registry"
            if alone is None:
                self._orphan_since = None
            elif self._orphan_since is None or self._orphan_since[0] != alone:
                self._orphan_since = (alone, time.monotonic())
            time.sleep(1.0)

    def _become(self, role: str, era: int, run: str | None) -> None:
        self.role, self.era, self.run = role, era, run
        log.info("engine host %s: %s of era %d (run %s)", self.name, role, era, run)
        try:
            self.presence.update(self._host_doc())
        except RegistryError as e:
            log.debug("engine host %s: /hosts not updated now: %s", self.name, e)

    def _host_doc(self) -> dict:
        return {**self._doc(), "role": self.role, "era": self.era, "run": self.run}

    # --- deciding --------------------------------------------------------------------------
    def _on_state(self, state: State) -> None:
        if state is State.CONNECTED:
            self._back_at = time.monotonic()
        elif state is State.LOST:
            self._claimed = False
        self._wake.set()

    def _loop(self) -> None:
        connected = True
        while not self._closed and not self.deposed.is_set():
            self._wake.wait(STEP_S)
            self._wake.clear()
            if self.registry.state is not State.CONNECTED:
                connected = False
                continue
            if not connected:  # back (the state listener may not have run yet)
                connected, self._back_at = True, time.monotonic()
            try:
                self._step()
            except RegistryError as e:  # the connection dropped meanwhile: the next step looks again
                log.debug("engine host %s: %s [%s]", self.name, e, e.code)
            except Exception:
                log.exception("engine host %s: deciding its role failed", self.name)
                time.sleep(1.0)

    def _step(self) -> None:
        engine = self.registry.get(tree.ENGINE)
        datapath, version = self.registry.versioned(tree.DATAPATH)
        self._seen = self._seen or bool(engine or datapath)
        if self.role == "primary":
            self._as_primary(engine, datapath, version)
        elif engine is None:
            self._without_primary(datapath, version)
        else:
            self._absent_since = None

    def _as_primary(self, engine, datapath, version) -> None:
        journal = self.host.engine.journal
        if engine is None or engine.get("name") != self.name or not self.registry.owned(tree.ENGINE):
            self._claimed = False
            later = [d for d in (engine, datapath) if d and d.get("run") == self.run and d.get("era", 0) > self.era]
            if later or (engine is not None and engine.get("name") != self.name):
                if later or engine.get("run") == self.run:
                    log.warning("engine host %s: era %d has a successor (%s): this host is deposed", self.name,
                                self.era, (later or [engine])[0].get("name"))
                    self.deposed.set()
                return
            former = engine is not None and engine.get("name") == self.name  # our former session's node
            if self._claim(datapath if datapath and datapath.get("run") == self.run else None,
                           version, self.era, self.run, journal.standby, replace=former):
                log.info("engine host %s: primary of era %d again", self.name, self.era)
                if journal.standby is not None:
                    journal.mark_recorded(journal.standby)
            return
        self._claimed = True
        if journal.standby is None:
            self._attach_standby(journal)
        elif not journal.recorded or (datapath or {}).get("standby") != journal.standby:
            with self.registry.transaction() as t:
                t.check(tree.DATAPATH, version)
                t.set(tree.DATAPATH, {**datapath, "standby": journal.standby})
            journal.mark_recorded(journal.standby)

    def _attach_standby(self, journal) -> None:
        hosts = {n: self.registry.get(tree.host(n)) for n in self.registry.children(tree.HOSTS) if n != self.name}
        ranked = sorted((n for n, d in hosts.items() if d), key=lambda n: (hosts[n].get("role") != "spare", n))
        for name in ranked:
            try:
                journal.attach(name, hosts[name]["address"])
                return
            except Exception as e:  # it died meanwhile, or is not ready: the next one, or the next step
                log.warning("engine host %s: cannot sync %s as its standby: %s", self.name, name, e)

    def _without_primary(self, datapath, version) -> None:
        now = time.monotonic()
        recently_cut = self._back_at is not None and now - self._back_at < GRACE_S
        hosts = [self.registry.get(tree.host(n)) for n in self.registry.children(tree.HOSTS) if n != self.name]
        backup = self.host.backup
        if self.role == "standby" and backup.synced:
            if recently_cut or any(h and h.get("role") == "primary" and h.get("run") == backup.run and
                                   h.get("era", 0) >= backup.era for h in hosts):
                self._absent_since = None
                return
            self._absent_since = self._absent_since or now
            if self._back_at is not None and now - self._back_at < CUT_MEMORY_S and now - self._absent_since < ABSENT_S:
                return  # our session was cut lately: the primary's too; its absence must last to count
            if datapath is not None and not (datapath.get("run") == backup.run and datapath.get("era") == backup.era
                                             and datapath.get("standby") == self.name):
                return
            with backup.lock:
                backup.fenced = True  # the old primary's entries stop here
            era = backup.era + 1
            if not self._claim(datapath, version, era, backup.run, None):
                with backup.lock:
                    backup.fenced = False
                return
            log.warning("engine host %s: the primary of era %d is gone: taking over as era %d", self.name,
                        backup.era, era)
            self.role, self.era, self.run = "taking-over", era, backup.run
            try:
                self.host.take_over(era)
            except Exception:  # nothing else holds the data path now: say so loudly, and stop
                log.critical("engine host %s: the take-over failed: the data path of run %s is lost", self.name,
                             backup.run, exc_info=True)
                self.deposed.set()
                return
            self._become("primary", era, backup.run)
        elif (self.role == "spare" and not self._seen and datapath is None and not recently_cut
              and time.monotonic() - self._since > FOUND_GRACE_S):
            run = uuid.uuid4().hex
            if self._claim(None, None, 1, run, None):
                log.info("engine host %s: founding the cluster's data path (run %s)", self.name, run)
                self.host.found(1, run)
                self._become("primary", 1, run)

    def _claim(self, datapath, version, era: int, run: str, standby: str | None, replace: bool = False) -> bool:
        """Create ``/engine`` (``replace``: deleting this host's former session's first) and write
        ``/datapath`` for ``era``, checked against the ``version`` of ``/datapath`` read (None: it must not
        exist); whether this host won."""
        doc = {**self._doc(), "era": era, "run": run}
        try:
            with self.registry.transaction() as t:
                if datapath is not None:
                    t.check(tree.DATAPATH, version)
                if replace:
                    t.delete(tree.ENGINE)
                t.create(tree.ENGINE, doc, ephemeral=True)
                t.set(tree.DATAPATH, {"era": era, "run": run, "primary": self.name, "standby": standby})
        except RegistryError as e:
            if e.code in ("NODE_EXISTS", "BAD_VERSION", "NO_NODE"):
                return False
            raise
        self._claimed = True
        return True

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        for watch in self._watches:
            watch.cancel()
        self.registry.remove_listener(self._on_state)
        self.presence.cancel(delete=False)  # it goes with the session, which the host closes next
