"""A deployed query of an engine reached through its endpoint: what ``Engine.connect(...).deploy`` returns.

:class:`ClientDeployed` is :class:`sparkcep.deployed.Deployed` over the
endpoint's ``deployment`` operation: the engine runs the same method of the
same handle ``Engine.local(...).deploy`` returns, so results and error codes
are the same. Arguments and results cross as JSON; the two that JSON cannot
hold as they are (an ``assignment`` keyed by bin, ``instance_metrics`` keyed
by ``(sub-query, index)``) travel as lists of pairs (:func:`to_wire`,
:func:`from_wire`).
"""

from __future__ import annotations

import operator

from sparkcep.arguments import scalar
from sparkcep.deployed import CHANGES, Deployed
from sparkcep.errors import EngineError
from sparkcep.gateway.discovery import EngineNotFoundError
from sparkcep.runtime.output_log import Retention


def to_wire(method: str, value, result: bool = False):
    """``value`` (the arguments of ``method``, or its ``result``) as JSON holds it."""
    if not result and method == "migrate":
        return {**value, "assignment": [[b, i] for b, i in value["assignment"].items()]}
    if result and method == "instance_metrics":
        return [[sq, i, m] for (sq, i), m in value.items()]
    return value


def from_wire(method: str, value, result: bool = False):
    """The inverse of :func:`to_wire`."""
    if not result and method == "migrate":
        return {**value, "assignment": {int(b): int(i) for b, i in value["assignment"]}}
    if result and method == "instance_metrics":
        return {(sq, int(i)): m for sq, i, m in value}
    return value


def options_to_wire(options: dict) -> dict:
    """``deploy()``'s keyword arguments as JSON holds them (a ``Retention`` as a dict, integers plain)."""
    out = dict(options)
    retain = out.get("retain")
    if isinstance(retain, Retention):
        out["retain"] = {"rows": retain.rows, "bytes": retain.bytes, "age_s": retain.age_s}
    elif retain is not None and not isinstance(retain, bool):
        raise EngineError(f"retain={retain!r}: expected True, False or a cep.Retention", "BAD_RETENTION")
    parallelism = out.get("parallelism")
    if hasattr(parallelism, "items"):
        out["parallelism"] = {str(k): _plain(v) for k, v in parallelism.items()}
    elif parallelism is not None:
        out["parallelism"] = _plain(parallelism)
    for key in ("bins", "replicas", "balance"):
        if key in out:
            out[key] = _plain(out[key])
    return out


def options_from_wire(options: dict) -> dict:
    """The inverse of :func:`options_to_wire`."""
    out = dict(options)
    if isinstance(out.get("retain"), dict):
        out["retain"] = Retention(**out["retain"])
    return out


def _plain(value):
    """An integer or bool as JSON holds it (numpy's made Python's); anything else as it is, for the engine's
    checks."""
    value = scalar(value)
    try:
        return value if isinstance(value, bool) else operator.index(value)
    except TypeError:
        return value


class ClientDeployed(Deployed):
    """Query ``query`` deployed as ``id`` on a cluster's data path ``path``
    (:class:`sparkcep.control.connect.DataPath`): a client of its own per call, so a long migration does
    not hold up the sends of the engine object it came from. Calls name deployment ``id``: once it is
    undeployed they act on no later deployment of the same name.

    Reads ride through fail-overs of the data path. A change (``migrate``,
    ``move``, ``rescale``) whose connection is lost while it runs is not
    tried again: the data path that took over replayed its journal in the
    layout recorded last, and the call raises ``MIGRATION_INTERRUPTED``
    saying so (call it again to finish).
    """

    def __init__(self, id: str, query, path):
        super().__init__(id, query)
        self._path = path

    def _call(self, method: str, **args):
        lost = []

        def ask(client):
            if lost:
                raise EngineError(f"the cluster's data path failed over while {method} of query {self.name!r} ran "
                                  f"({lost[0]}): it stopped there, and the data path that took over runs the layout "
                                  f"its journal last recorded (bin_owners() says where each bin is): {method} "
                                  "again to finish", "MIGRATION_INTERRUPTED")
            try:
                return client.request("deployment", query=self.name, deployment=self.id, method=method,
                                      args=to_wire(method, args))[0]
            except EngineNotFoundError as e:  # the connection went: a change may have been under way
                if method in CHANGES:
                    lost.append(e)
                raise

        header, client = self._path.call(f"{method} of query {self.name!r}", ask)
        client.close()
        return from_wire(method, header["result"], result=True)
