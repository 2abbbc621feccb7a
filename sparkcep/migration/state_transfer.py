"""UPM-CEP's State Transfer (§5) as a generation switch: instances move to other instance managers live.

1. The new generation of the deployment is deployed beside the running one
   (the moving instance on its new instance manager, every other one where
   it was); its instances wait.
2. At the next epoch the running generation gets ``Export`` and ``Retire``
   (upstreams flush: everything before the epoch goes to the old
   instances) and the new one ``Import`` first; the engine's sources send
   every later epoch to the new generation, whose channels hold it (the
   paper's buffers) until the state is installed.
3. Each stateful instance hands its state to its successor: the moving one
   takes all its bins and ships them; one staying in the same process gives
   its whole instance over, without a copy (``adopt``).
4. The new instances install, then consume what waited for them; the old
   generation drains into the sink and is undeployed.

The same switch adds or removes instances (:meth:`~sparkcep.migration.migrator.Migrator.rescale`).
"""

from __future__ import annotations

from sparkcep.migration.megaphone import ticket
from sparkcep.runtime.channels import Export, Import


def handoff_records(dep, gen):
    """The Export records for the running generation of ``dep``, the Import records for ``gen``, and the
    tickets to wait for: each stateful instance hands everything to the instance of its index in ``gen``;
    a stateless one staying in its process hands its counters over with itself."""
    exports, imports, tickets = [], [], []
    old = dep.gen
    for sq in dep.plan.subqueries:
        out, into = [], []
        for i in range(min(old.layout.parallelism[sq.name], gen.layout.parallelism[sq.name])):
            host = gen.host_of((sq.name, i))
            stays = host == old.host_of((sq.name, i))
            if not stays and not sq.head.stateful:
                continue
            t = ticket(dep, sq.head.name, i, i)
            out.append([i, t, host, "adopt" if stays else "take", None])
            into.append([i, t])
            tickets.append(t)
        if out:
            exports.append(Export(0, 0, sq.head.name, out))
            imports.append(Import(0, 0, sq.head.name, into))
    return exports, imports, tickets


def switch(dep, lock, parallelism: dict[str, int], placement, watch) -> None:
    """Run ``dep`` (one replica) from the next epoch on as a new generation with ``parallelism`` and
    ``placement`` ({endpoint: instance manager index}, None in-process); returns once it took over. The
    caller counts the step, once for all the replicas it switches."""
    gen = dep.prepare(parallelism, placement)
    try:
        with lock:
            exports, imports, tickets = handoff_records(dep, gen)
            if exports:
                dep.control(*exports)
            dep.cut_over(gen, imports)
    except BaseException:
        if dep.gen is not gen:
            gen.close()
        raise
    watch.bytes += dep.await_handoffs(tickets)
    dep.await_retired()
