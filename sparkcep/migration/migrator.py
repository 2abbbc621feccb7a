"""The migrations of one deployment: Megaphone bin moves, State Transfer, live rescaling.

Each call checks the request first (an unknown operator, a bin out of
range, an instance or instance manager that does not exist or died, a
migration already running on the operator get a :class:`QueryError` /
:class:`EngineError` with a code, and nothing changes), then runs while the
query keeps taking input, and returns once the change is complete with a
report (:mod:`sparkcep.migration.report`). A replicated deployment
migrates every replica at the same epochs; a replica that loses an
instance manager meanwhile takes no further step, and is rebuilt from the
others in the new layout once the migration is over. Migrations of one
deployment run one at a time (a second one on another operator waits for
the first).
"""

from __future__ import annotations

import logging
import threading
from collections import deque

from sparkcep.arguments import did_you_mean, integer
from sparkcep.errors import EngineError, QueryError, SparkcepError
from sparkcep.migration import plan
from sparkcep.migration.megaphone import migrate_bins
from sparkcep.migration.report import Watch
from sparkcep.migration.state_transfer import switch
from sparkcep.runtime import capacity
from sparkcep.runtime.deployment import parallelism_of
from sparkcep.runtime.handoff import ENGINE_HOST
from sparkcep.runtime.placement import extend

log = logging.getLogger("sparkcep")
HISTORY = 256  # migration reports kept for metrics


class Migrator:
    """Migrations of one deployment. ``replicas()``: its live replicas (runtime deployments, in step);
    ``lock``: the engine's lock; ``changes``: held while the deployment's wiring or bin tables change
    (shared with replica catch-up); ``cluster``: the instance managers (None: all in one process)."""

    def __init__(self, replicas, lock, changes: threading.Lock, cluster=None):
        self.replicas, self.lock, self.changes, self.cluster = replicas, lock, changes, cluster
        self.on_change = None  # called with the deployment and the report once a migration changed its layout
        self.sides: list[set[int]] | None = None  # a replicated deployment's instance managers, per replica
        self.running: dict[str, Watch] = {}  # operator -> its migration under way
        self.reports: deque = deque(maxlen=HISTORY)
        self._busy = threading.Lock()

    # --- the public operations -------------------------------------------------------
    def migrate(self, operator: str, assignment: dict, strategy: str = "fluid", batch: int = 16,
                gap_ms: float = 0.0) -> dict:
        """Move bins of route-key ``operator``: ``assignment`` {bin: instance}; see :mod:`.plan`."""
        dep = self._first()
        self._subquery(dep, operator)
        plan.check_strategy(strategy)
        batch = _batch(batch)
        table = dep._table(operator)
        new = plan.table_from(table.owners.tolist(), assignment, table.instances)
        gap_s = gap_ms / 1e3
        return self._run(operator, "migrate", strategy, lambda watch: self._bins(operator, new, strategy, batch,
                                                                                   gap_s, watch))

    def move(self, operator: str, instance: int, to: str) -> dict:
        """State Transfer: instance ``instance`` of ``operator``'s sub-query to instance manager ``to``."""
        dep = self._first()
        sq = self._subquery(dep, operator)
        n = dep.parallelism[sq]
        instance = integer(instance, "instance", code="BAD_INSTANCE")
        if not 0 <= instance < n:
            raise QueryError(f"{operator!r} has instances 0..{n - 1}, not {instance}", "BAD_INSTANCE")
        target = self._instance_manager(to)
        capacity.check_generation(dep.plan, dep.parallelism, dep.bins, len(self.replicas()), self.cluster,
                                  f"moving instance {instance} of {operator!r} (a new generation of query "
                                  f"{dep.query.name!r})")

        moving = [d for d in self._replicas_on(target)
                  if target is None or d.assignment[(sq, instance)] != target]  # one already there stays

        def run(watch):
            for d in moving:
                placement = None if target is None else {**d.assignment, (sq, instance): target}
                switch(d, self.lock, d.parallelism, placement, watch)
            if moving:
                watch.steps += 1
                watch.bins = len(_held(dep, operator, instance))
        return self._run(operator, "move", "state-transfer", run)

    def _replicas_on(self, target: int | None) -> list:
        """The replicas a move to instance manager ``target`` moves: all of them in one process; of a
        replicated deployment on instance managers, the one whose side holds ``target`` (or, in no side,
        the first, whose side then takes it), so replicas never share an instance manager."""
        if target is None or self.sides is None:
            return self.replicas()
        mine = next((r for r, side in enumerate(self.sides) if target in side), None)
        if mine is None:
            mine = self.replicas()[0].replica
            self.sides[mine].add(target)
            self.cluster.put_to_use(target)  # a standby no more: no other replica may be rebuilt on it
        moving = [d for d in self.replicas() if d.replica == mine]
        if not moving:
            raise EngineError(f"replica {mine}, whose side holds the instance manager asked for, is not running "
                              "now (it is being rebuilt): move once it runs", "NO_REPLICA")
        return moving

    def rescale(self, operator: str, instances: int, strategy: str = "batched", batch: int = 16,
                gap_ms: float = 0.0) -> dict:
        """Run ``operator``'s sub-query on ``instances`` instances, live, its bins spread evenly."""
        dep = self._first()
        sq = self._subquery(dep, operator)
        plan.check_strategy(strategy)
        batch = _batch(batch)
        instances = integer(instances, "instances", minimum=1, code="BAD_INSTANCE")
        gap_s = gap_ms / 1e3
        if instances > 1 and not dep.plan.sq_of[operator].parallelizable:
            raise QueryError(f"{operator!r} is a global aggregate (no by=): it runs as one instance", "BAD_INSTANCE")
        dep._table(operator)
        parallelism_of(dep.plan, {operator: instances}, dep.bins)  # an instance owns at least one bin
        capacity.check_generation(dep.plan, {**dep.parallelism, sq: instances}, dep.bins, len(self.replicas()),
                                  self.cluster, f"rescaling {operator!r} of query {dep.query.name!r} to "
                                                f"{instances} instances")

        def run(watch):
            def grow(d):
                switch(d, self.lock, {**d.parallelism, sq: instances}, self._grown(d, sq, instances), watch)

            def shrink(d):  # the instances left over hold no bins now
                placement = None if self.cluster is None else {
                    ep: i for ep, i in d.assignment.items() if ep[0] != sq or ep[1] < instances}
                switch(d, self.lock, {**d.parallelism, sq: instances}, placement, watch)

            reps = self.replicas()
            n = reps[0].parallelism[sq]
            if instances > n:  # new instances first, holding nothing; then bins move to them
                reps = self._each(reps, grow)
                watch.steps += 1  # one step for every replica
            new = plan.even_owners(reps[0].bin_owners(operator), instances)
            self._bins(operator, new, strategy, batch, gap_s, watch)
            if instances < n:
                self._each(self.replicas(), shrink)
                watch.steps += 1
        return self._run(operator, "rescale", strategy, run)

    # --- helpers --------------------------------------------------------------------
    def _bins(self, operator, new_owners, strategy, batch, gap_s, watch) -> None:
        moves = plan.moves_between(self.replicas()[0].bin_owners(operator), new_owners)
        watch.total = len(moves)
        migrate_bins(self.replicas(), self.lock, operator, plan.steps(moves, strategy, batch), watch, self._each, gap_s)

    def _each(self, reps: list, act) -> list:
        """``act(replica)`` for each of ``reps``; returns those it ran on. A replica whose instance
        manager died meanwhile is dropped, as on the data path: the others go on, and it is rebuilt from
        one of them (in its new layout) once the migration is over. Raises when no other one runs."""
        done = []
        for d in reps:
            try:
                act(d)
            except EngineError as e:
                if not self._lost(d, e):
                    raise
                log.warning("query %s: replica %s failed during a migration (%s); it goes on without it",
                            d.query.name, d.replica, e)
                continue
            done.append(d)
        return done

    def _lost(self, dep, error: EngineError) -> bool:
        """Did replica ``dep`` fail (its error set, or an instance manager of its running generation dead),
        with another replica running on? It is then marked failed."""
        dead = self.cluster is not None and any(self.cluster.ims[i].dead for i in dep.gen.hosts)
        if dep.error is None and not dead:
            return False
        dep.fail(error)
        return any(d is not dep for d in self.replicas())

    def _run(self, operator: str, kind: str, strategy: str, body) -> dict:
        with self._busy:
            if operator in self.running:
                raise QueryError(f"a migration ({self.running[operator].kind}) of {operator!r} is under way; "
                                 "wait for it to finish", "MIGRATION_RUNNING")
            self._first()  # a running replica to migrate
            watch = self.running[operator] = Watch(self.replicas, kind, operator, strategy)
        try:
            with self.changes:
                watch.restart()
                body(watch)
            report = watch.report()
        except SparkcepError as e:  # kept with what it did: bins may have moved before it failed
            self.reports.append(watch.report(error=e))
            raise
        finally:
            with self._busy:
                del self.running[operator]
        self.reports.append(report)
        if self.on_change is not None:
            self.on_change(self._first(), report)
        log.info("query %s: %s of %s (%s): %d bins, %d bytes, %d steps in %.3f s, latency max %.1f ms",
                 report["query"], kind, operator, strategy, report["bins"], report["bytes"], report["steps"],
                 report["duration_s"], report["max_latency_ms"])
        return report

    def _first(self):
        reps = self.replicas()
        if not reps:
            raise EngineError("the deployment has no running replica to migrate", "NO_REPLICA")
        for d in reps:  # one that failed and is not yet marked so is not the one to look at
            if d.error is None:
                return d
        reps[0].check()

    @staticmethod
    def _subquery(dep, operator: str) -> str:
        if operator not in dep.plan.sq_of:
            raise QueryError(f"query {dep.query.name!r} has no operator {operator!r}"
                             f"{did_you_mean(operator, dep.plan.sq_of)}; operators: {sorted(dep.plan.sq_of)}",
                             "UNKNOWN_OPERATOR")
        return dep.plan.sq_of[operator].name

    def _instance_manager(self, name: str) -> int | None:
        """The index of the live instance manager ``name`` (None: the engine's own process)."""
        if self.cluster is None:
            if name != ENGINE_HOST:
                raise EngineError(f"this engine runs its instances in its own process ({ENGINE_HOST!r}); "
                                  f"there is no instance manager {name!r}", "UNKNOWN_INSTANCE_MANAGER")
            return None
        im = next((im for im in self.cluster.ims if im.name == name), None)
        if im is None:
            names = [im.name for im in self.cluster.ims if im.dead is None]
            raise EngineError(f"no instance manager named {name!r}{did_you_mean(name, names)}; "
                              f"instance managers: {names}", "UNKNOWN_INSTANCE_MANAGER")
        if im.dead is not None:
            raise EngineError(f"instance manager {name!r} died: {im.dead}", "WORKER_DIED")
        return im.index

    def _grown(self, dep, sq: str, instances: int):
        if self.cluster is None:
            return None
        from sparkcep.runtime.layout import Layout
        slots, _ = self.cluster.slots_and_topology(dep.ims)
        if not slots:  # the replica lost them meanwhile: the migration goes on without it (_each)
            raise EngineError(f"query {dep.query.name!r}: every instance manager of replica {dep.replica} died",
                              "WORKER_DIED")
        kept = {ep: i for ep, i in dep.assignment.items()}
        return extend(kept, Layout(dep.plan, {**dep.parallelism, sq: instances}), slots, self.cluster.load())

    def snapshot(self) -> dict:
        """For metrics: the migrations under way (bins done of planned) and the finished ones."""
        with self._busy:
            running = [{"operator": op, "kind": w.kind, "strategy": w.strategy, "bins": w.bins,
                        "planned_bins": getattr(w, "total", None), "steps": w.steps} for op, w in self.running.items()]
        return {"running": running, "finished": list(self.reports)}


def _batch(batch) -> int:
    return integer(batch, "batch", minimum=1, code="BAD_OPTION")


def _held(dep, operator: str, instance: int) -> list[int]:
    """The bins of route-key ``operator`` that ``instance`` owns (all of them for other operators)."""
    if operator in dep.tables:
        return [b for b, o in enumerate(dep.bin_owners(operator)) if o == instance]
    return list(range(dep.bins))
