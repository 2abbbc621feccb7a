"""What ``deploy`` returns, on every engine: a deployed query, to inspect and to reconfigure live.

>>> dep = engine.deploy(q, parallelism=2, bins=4096)          # doctest: +SKIP
>>> dep.bin_owners("agg")[:4]                                  # doctest: +SKIP
[0, 0, 0, 0]
>>> dep.migrate("agg", {0: 1, 1: 1}, strategy="fluid")        # doctest: +SKIP
{'strategy': 'fluid', 'bins': 2, 'bytes': ..., 'steps': 2, 'duration_s': ..., 'max_latency_ms': ..., ...}

:class:`Deployed` is the one interface: :class:`LocalDeployed` for an
engine of this process (``Engine.local``), and
:class:`sparkcep.gateway.deployed.ClientDeployed` for one reached through its
endpoint (``Engine.connect("zk://...")``). Both take the same arguments (numpy
integers too) and return the same results, with the same error codes.
Reading methods reach the running deployment (with replicas: the first
running one).
"""

from __future__ import annotations

import abc

from sparkcep.arguments import checked, integer, number
from sparkcep.errors import EngineError, QueryError
from sparkcep.migration.plan import assignment_of
from sparkcep.runtime.output_log import refuse_in_callback

MAX_GAP_MS = 60_000.0  # the longest pause between two steps of a migration
CHANGES = ("migrate", "move", "rescale")  # what reconfigures a deployed query; the other calls read it
CALLS = (*CHANGES, "replicas", "bin_owners", "explain", "migrations", "instance_metrics",
         "parallelism")  # what a client may call on a deployed query through an engine's endpoint


class Deployed(abc.ABC):
    """A deployed query: ``migrate``, ``move`` and ``rescale`` change it live (:mod:`sparkcep.migration`)."""

    def __init__(self, id: str, query):
        self.id, self.query = id, query

    @property
    def name(self) -> str:
        return self.query.name

    @checked(QueryError)
    def migrate(self, operator: str, assignment, strategy: str = "fluid", batch: int = 16,
                gap_ms: float = 0.0) -> dict:
        """Move bins of route-key ``operator`` to other instances, live: ``assignment`` {bin: instance}.

        ``strategy``: ``"fluid"`` (one bin per step), ``"batched"`` (at most
        ``batch`` bins per pair of instances per step, ``gap_ms`` between
        steps, at most 60,000) or ``"all-at-once"``. Returns when every bin is installed at
        its new owner, with a report: ``strategy``, ``bins``, ``bytes``,
        ``steps``, ``duration_s``, ``max_latency_ms``, ``p99_latency_ms`` (of
        the input that arrived meanwhile) and ``latency_epochs`` (how many
        sends those latencies summarise).
        """
        return self._call("migrate", operator=operator, assignment=assignment_of(assignment), strategy=strategy,
                          batch=integer(batch, "batch", minimum=1, code="BAD_OPTION"), gap_ms=_gap(gap_ms))

    @checked(QueryError)
    def move(self, operator: str, instance: int, to: str) -> dict:
        """State Transfer: run instance ``instance`` of ``operator``'s sub-query on instance manager ``to``
        (a name from ``engine.instance_managers()``), live. Returns its report."""
        return self._call("move", operator=operator, instance=integer(instance, "instance", code="BAD_INSTANCE"),
                          to=to)

    @checked(QueryError)
    def rescale(self, operator: str, instances: int, strategy: str = "batched", batch: int = 16,
                gap_ms: float = 0.0) -> dict:
        """Run ``operator``'s sub-query on ``instances`` instances, live: new instances join (or surplus
        ones leave) and the bins are spread evenly with ``strategy`` (``batch``, ``gap_ms`` as for
        :meth:`migrate`). At most one instance per bin (``TOO_MANY_INSTANCES``). Returns its report."""
        return self._call("rescale", operator=operator,
                          instances=integer(instances, "instances", minimum=1, code="BAD_INSTANCE"),
                          strategy=strategy, batch=integer(batch, "batch", minimum=1, code="BAD_OPTION"),
                          gap_ms=_gap(gap_ms))

    @checked(QueryError)
    def replicas(self) -> list[dict]:
        """Each replica: ``replica`` (its number), ``state`` (``"running"``, ``"failed"``,
        ``"catching-up"`` or ``"undeployed"``) and the ``instance_managers`` it runs on."""
        return self._call("replicas")

    @checked(QueryError)
    def bin_owners(self, operator: str) -> list[int]:
        """For each bin of route-key ``operator``, the instance that owns it."""
        return self._call("bin_owners", operator=operator)

    @checked(QueryError)
    def explain(self) -> str:
        """The plan, with each replica's instances and where each runs."""
        return self._call("explain")

    @checked(QueryError)
    def migrations(self) -> dict:
        """The migrations under way (``running``) and the last ones finished (``finished``: their reports)."""
        return self._call("migrations")

    @checked(QueryError)
    def instance_metrics(self) -> dict[tuple[str, int], dict]:
        """Per instance ``(sub-query, index)``: rows, batches, busy time, epoch, queues, late tuples."""
        return self._call("instance_metrics")

    @property
    def parallelism(self) -> dict[str, int]:
        """Instances per sub-query (``{"SQ1": 2, ...}``)."""
        return self._call("parallelism")

    @abc.abstractmethod
    def _call(self, method: str, **args):
        """Run ``method`` (one of :data:`CALLS`) with arguments already checked and made plain."""

    def __repr__(self) -> str:
        return f"<deployed query {self.name!r} ({self.id})>"


def _gap(gap_ms) -> float:
    return number(gap_ms, "gap_ms (milliseconds between steps)", maximum=MAX_GAP_MS, code="BAD_OPTION")


class LocalDeployed(Deployed):
    """A query deployed on an engine of this process: its runtime deployment and its migrations."""

    def __init__(self, deployment, migrator):
        super().__init__(deployment.id, deployment.query)
        self._deployment, self._migrator = deployment, migrator

    def _call(self, method: str, **args):
        dep = self._deployment
        if method in ("migrate", "move", "rescale"):
            refuse_in_callback(f"{method}()")
            if dep.closed:  # even one with nothing to do: it did not happen
                raise EngineError(f"query {self.query.name!r} is undeployed", "UNDEPLOYED")
            return getattr(self._migrator, method)(**args)
        if method == "migrations":
            return self._migrator.snapshot()
        if method == "replicas":
            if dep.closed:
                return [{"replica": r, "state": "undeployed", "instance_managers": []}
                        for r in range(len(getattr(dep, "members", [dep])))]
            if hasattr(dep, "describe"):
                return dep.describe()
            gen = dep.gen
            ims = sorted({gen.names[i] for i in gen.hosts}) if hasattr(gen, "names") else []
            return [{"replica": 0, "state": "failed" if dep.error else "running", "instance_managers": ims}]
        if method == "parallelism":
            return dict(dep.parallelism)
        return getattr(dep, method)(**args)

    def __getattr__(self, name: str):
        return getattr(self._deployment, name)
