"""What :meth:`sparkcep.Engine.deploy` returns: a deployed query, to inspect and to reconfigure live.

>>> dep = engine.deploy(q, parallelism=2, bins=4096)          # doctest: +SKIP
>>> dep.bin_owners("agg")[:4]                                  # doctest: +SKIP
[0, 0, 0, 0]
>>> dep.migrate("agg", {0: 1, 1: 1}, strategy="fluid")        # doctest: +SKIP
{'strategy': 'fluid', 'bins': 2, 'bytes': ..., 'steps': 2, 'duration_s': ..., 'max_latency_ms': ..., ...}

Reading attributes (``explain()``, ``parallelism``, ``bin_owners()``,
``instance_metrics()``, ...) reach the running deployment (with replicas:
the first running one).
"""

from __future__ import annotations


class Deployed:
    """A deployed query: ``migrate``, ``move`` and ``rescale`` change it live (:mod:`sparkcep.migration`)."""

    def __init__(self, deployment, migrator):
        self._deployment, self._migrator = deployment, migrator

    def migrate(self, operator: str, assignment: dict, strategy: str = "fluid", batch: int = 16,
                gap_ms: float = 0.0) -> dict:
        """Move bins of route-key ``operator`` to other instances, live: ``assignment`` {bin: instance}.

        ``strategy``: ``"fluid"`` (one bin per step), ``"batched"`` (at most
        ``batch`` bins per pair of instances per step, ``gap_ms`` between
        steps) or ``"all-at-once"``. Returns when every bin is installed at
        its new owner, with a report: ``strategy``, ``bins``, ``bytes``,
        ``steps``, ``duration_s``, ``max_latency_ms``, ``p99_latency_ms`` (of
        the input that arrived meanwhile) and ``latency_epochs`` (how many
        sends those latencies summarise).
        """
        return self._migrator.migrate(operator, assignment, strategy, batch, gap_ms)

    def move(self, operator: str, instance: int, to: str) -> dict:
        """State Transfer: run instance ``instance`` of ``operator``'s sub-query on instance manager ``to``
        (a name from ``engine.instance_managers()``), live. Returns its report."""
        return self._migrator.move(operator, instance, to)

    def rescale(self, operator: str, instances: int, strategy: str = "batched", batch: int = 16,
                gap_ms: float = 0.0) -> dict:
        """Run ``operator``'s sub-query on ``instances`` instances, live: new instances join (or surplus
        ones leave) and the bins are spread evenly with ``strategy`` (``batch``, ``gap_ms`` as for
        :meth:`migrate`). Returns its report."""
        return self._migrator.rescale(operator, instances, strategy, batch, gap_ms)

    def replicas(self) -> list[dict]:
        """Each replica: ``replica`` (its number), ``state`` (``"running"``, ``"failed"`` or
        ``"catching-up"``) and the ``instance_managers`` it runs on."""
        dep = self._deployment
        if hasattr(dep, "describe"):
            return dep.describe()
        gen = dep.gen
        ims = sorted({gen.names[i] for i in gen.hosts}) if hasattr(gen, "names") else []
        return [{"replica": 0, "state": "failed" if dep.error else "running", "instance_managers": ims}]

    def migrations(self) -> dict:
        """The migrations under way and the last ones finished (their reports)."""
        return self._migrator.snapshot()

    def __getattr__(self, name: str):
        return getattr(self._deployment, name)

    def __repr__(self) -> str:
        return f"<deployed query {self._deployment.query.name!r} ({self._deployment.id})>"
