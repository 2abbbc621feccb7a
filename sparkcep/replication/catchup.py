"""Flux's take-over and catch-up: a lost replica rebuilt from a survivor's state while the query runs.

When replica ``r`` fails, the survivors go on alone (the dedup sink passes
their rows through). Then, while the query keeps taking input:

1. The replica's next generation is deployed: its instances where they ran
   before, those of a dead instance manager on a standby one (or one in no
   replica's side: a worker that joined since), else on the live instance
   managers of the replica's own side, else on one that joins within
   :data:`ROOM_WAIT_S`; they wait.
2. At the open epoch ``E`` (under the engine's lock, between two sends) a
   survivor gets ``Export`` records: each of its stateful instances, once it
   consumed everything before ``E``, copies its state to the rebuilt
   instance of the same index. The rebuilt replica takes the survivor's
   progress (epoch, sources, bin tables) and its generation starts at
   ``E``; the sources feed it from ``E`` on, and its channels hold that input
   (bounded, back-pressuring the sources if the copy takes long) until
   the state is installed. Nothing before ``E`` is needed: the copy holds it.
3. Its sink publishes nothing until the survivor's rows of the epochs
   before ``E`` are out (the dedup sink takes epochs in order: a later
   one first would drop them). Once every copy is installed and those rows
   are out, it runs in step again and both replicas' rows meet in the
   dedup sink.

Not piecemeal: every instance of the lost replica is rebuilt (those on live
instance managers in place); its survivors could not be kept, as they
stopped at different epochs when their peers died.
"""

from __future__ import annotations

import logging
import threading
import time

from sparkcep.errors import EngineError
from sparkcep.migration.megaphone import ticket
from sparkcep.replication.replicas import CATCHING_UP, FAILED, RUNNING
from sparkcep.runtime.channels import Export, Import
from sparkcep.runtime.deployment import HANDOFF_TIMEOUT_S
from sparkcep.runtime.placement import extend

log = logging.getLogger("sparkcep")
ROOM_WAIT_S = 30.0  # a lost replica with nowhere to run waits this long for an instance manager to join


def copy_records(survivor, gen):
    """Export records (copy) for ``survivor`` and Import records for ``gen``, the lost replica's new
    generation, and the tickets: every stateful instance copied to the instance of its index."""
    exports, imports, tickets = [], [], []
    for sq in survivor.plan.subqueries:
        if not sq.head.stateful:
            continue
        out, into = [], []
        for i in range(gen.layout.parallelism[sq.name]):
            t = ticket(survivor, sq.head.name, i, i)
            out.append([i, t, gen.host_of((sq.name, i)), "copy", None])
            into.append([i, t])
            tickets.append(t)
        exports.append(Export(0, 0, sq.head.name, out))
        imports.append(Import(0, 0, sq.head.name, into))
    return exports, imports, tickets


def placement_for(rs, r: int, cluster, survivor) -> dict | None:
    """Where the rebuilt replica ``r`` runs: its instances' instance managers, a standby for each dead
    one (or the live ones of its side); raises EngineError NO_ROOM when it cannot run anywhere."""
    lost = rs.members[r]
    dead = {i for i in rs.sides[r] if cluster.ims[i].dead is not None}
    live = sorted(rs.sides[r] - dead)
    others = set().union(*(side for k, side in enumerate(rs.sides) if k != r))
    swap = {}
    deadline = time.monotonic() + ROOM_WAIT_S
    for i in sorted(dead):
        spare = cluster.take_standby(others | rs.sides[r])
        while spare is None and not live and time.monotonic() < deadline:  # a worker may be joining
            time.sleep(0.1)
            spare = cluster.take_standby(others | rs.sides[r])
        if spare is None:
            break
        swap[i] = spare
        rs.sides[r].add(spare)
    rs.sides[r] -= dead
    spill = [i for i in dead if i not in swap]
    if spill and not live:
        raise EngineError(f"no standby instance manager and no live one on replica {r}'s side (none joined "
                          f"within {ROOM_WAIT_S:.0f} s): it is not rebuilt; the query runs on the other replica "
                          "alone", "NO_ROOM")
    kept = {}
    for k, (ep, at) in enumerate(sorted(lost.assignment.items())):
        kept[ep] = swap.get(at, live[k % len(live)] if at in spill else at)
    slots, _ = cluster.slots_and_topology(rs.sides[r])
    from sparkcep.runtime.layout import Layout
    return extend({ep: at for ep, at in kept.items() if ep[1] < survivor.parallelism[ep[0]]},
                  Layout(survivor.plan, survivor.parallelism), slots, cluster.load())


def rebuild(rs, r: int, cluster, lock, changes) -> None:
    """Catch replica ``r`` of ``rs`` up from a survivor; record it in ``rs.catchups``."""
    with changes:
        survivors = rs.running()
        if not survivors:
            return
        survivor, lost = survivors[0], rs.members[r]
        t0 = time.monotonic()
        entry = {"replica": r, "from": survivor.replica, "started": time.time()}
        try:
            for op, table in survivor.tables.items():
                lost.tables[op] = table.copy()
            placement = None if cluster is None else placement_for(rs, r, cluster, survivor)
            gen = lost.prepare(survivor.parallelism, placement)
            with lock:
                exports, imports, tickets = copy_records(survivor, gen)
                entry["epoch"] = survivor.epoch
                if exports:
                    survivor.control(*exports)
                lost.rejoin(survivor)
                lost.sink.after = (survivor.sink, survivor.epoch - 1)  # the survivor's rows before E go first
                dead = lost.cut_over(gen, imports, retire=False)
                rs.states[r] = CATCHING_UP
            lost.drop(dead)  # its parts on live instance managers go, off the send path
            entry["bytes"] = lost.await_handoffs(tickets)
            _await_survivor(lost, survivor, entry["epoch"] - 1)
            rs.states[r] = RUNNING
            entry["duration_s"] = round(time.monotonic() - t0, 6)
            log.warning("query %s: replica %d caught up from replica %d in %.3f s (%d bytes of state)",
                        rs.query.name, r, survivor.replica, entry["duration_s"], entry["bytes"])
        except EngineError as e:
            rs.states[r] = FAILED
            entry["error"] = f"{e} [{e.code}]"
            log.warning("query %s: replica %d cannot be rebuilt: %s; it runs on %d replica(s)",
                        rs.query.name, r, e, len(rs.running()))
        rs.catchups.append(entry)


def _await_survivor(lost, survivor, epoch: int, timeout: float = HANDOFF_TIMEOUT_S) -> None:
    """Wait until the survivor's rows up to ``epoch`` reached the outputs: only then does the rebuilt replica
    carry the query alone if the survivor dies (its sink publishes nothing before)."""
    deadline = time.monotonic() + timeout
    while lost.sink.done_epoch < epoch:
        survivor.check()
        if time.monotonic() > deadline:
            raise EngineError(f"query {lost.query.name}: the survivor's outputs stayed behind epoch {epoch} for "
                              f"{timeout:.0f} s", "WAIT_TIMEOUT")
        time.sleep(0.002)


def start_rebuild(rs, cluster, lock, changes):
    """The ``rebuild`` hook of a :class:`~sparkcep.replication.replicas.ReplicaSet`: a thread per rebuild."""
    def start(r: int) -> None:
        threading.Thread(target=rebuild, args=(rs, r, cluster, lock, changes), name=f"sparkcep-catchup-{r}",
                         daemon=True).start()
    return start
