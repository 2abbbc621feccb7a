"""``sparkcep status --zk HOST:PORT/PATH``: a cluster as its registry records it.

The orchestrators (which one leads), the data path's engine hosts (the
primary, its standby, spares), the instance managers that are members (and
the instances each runs), the deployments (their state, where their
instances run, their rates and latency as the leader last recorded them,
every couple of seconds: figures older than :data:`STALE_S` are marked
stale, never shown as live), and the last events (deaths, changes of
leader). Reading it needs no token: the registry holds no stream data and
nothing that lets a reader act.
"""

from __future__ import annotations

import time

from sparkcep.control import tree
from sparkcep.control.registry import Registry

EVENTS_SHOWN = 10
STALE_S = 10.0  # figures the leader recorded longer ago than this are stale


def cluster(registry: Registry) -> dict:
    """The status document: ``orchestrators``, ``instance_managers``, ``deployments``, ``engine``, ``events``."""
    leader = registry.leader(tree.LEASE)
    orchestrators = [{**(registry.get(f"{tree.ORCHESTRATORS}/{n}") or {"name": n}), "leader": n == leader}
                     for n in registry.children(tree.ORCHESTRATORS)]
    deployments, hosted = [], {}
    for q in registry.children(tree.DEPLOYMENTS):
        record = registry.get(f"{tree.DEPLOYMENTS}/{q}") or {}
        placement = registry.get(f"{tree.DEPLOYMENTS}/{q}/placement") or {}
        for instance, ims in placement.items():  # one instance manager a replica
            for im in ims:
                hosted.setdefault(im, []).append(f"{q}.{instance}")
        deployments.append({"query": q, "deployment": record.get("deployment"), "streams": record.get("streams", []),
                            "outputs": record.get("outputs", []), "options": record.get("options", {}),
                            "placement": placement,
                            "metrics": registry.get(f"{tree.DEPLOYMENTS}/{q}/metrics") or {}})
    members = []
    for name in registry.children(tree.MEMBERS):
        info = registry.get(tree.member(name)) or {}
        members.append({"name": name, "pid": info.get("pid"), "host": info.get("address", "").rpartition(":")[0],
                        "address": info.get("address"), "cpus": info.get("cpus"), "node": info.get("node"),
                        "instances": sorted(hosted.get(name, []))})
    events = [registry.get(f"{tree.EVENTS}/{e}") for e in registry.children(tree.EVENTS)[-EVENTS_SHOWN:]]
    hosts = [registry.get(tree.host(n)) or {"name": n} for n in registry.children(tree.HOSTS)]
    now = time.time()
    for d in deployments:
        m = d["metrics"]
        age = now - m["time"] if "time" in m else None
        d["state"] = "unknown" if age is None or age > STALE_S else m.get("state", "running")
        d["figures_age_s"] = None if age is None else round(age, 1)
    return {"cluster": getattr(registry, "address", repr(registry)), "engine": registry.get(tree.ENGINE),
            "engine_hosts": hosts, "orchestrators": orchestrators, "instance_managers": members,
            "deployments": deployments, "events": [e for e in events if e]}


def render(doc: dict) -> str:
    """The status document as tables."""
    engine = doc.get("engine")
    if not any(doc.get(k) for k in ("engine_hosts", "orchestrators", "instance_managers", "deployments", "events")):
        return (f"cluster {doc['cluster']}: nothing is registered here: no orchestrator, engine host or worker has "
                "joined it (is the path the one they were started with?)")
    lines = [f"cluster {doc['cluster']}: data path "
             + (f"{engine.get('name')} at {engine['address']} (pid {engine['pid']}, era {engine.get('era')})"
                if engine else "not served now (no primary engine host)")]
    lines.append(f"engine hosts ({len(doc.get('engine_hosts', []))}):")
    for h in doc.get("engine_hosts", []):
        lines.append(f"  {h.get('name'):>12} pid {h.get('pid')!s:>7}  {h.get('role', '?')} of era {h.get('era')}  "
                     f"{h.get('address')}")
    lines.append(f"orchestrators ({len(doc['orchestrators'])}):")
    for o in doc["orchestrators"]:
        lines.append(f"  {o.get('name'):>12} pid {o.get('pid')!s:>7}  {'LEADER' if o['leader'] else 'standby'}"
                     + (f"  metrics http://{o['metrics']}/metrics" if o.get("metrics") else ""))
    lines.append(f"instance managers ({len(doc['instance_managers'])}):")
    lines.append(f"  {'name':>12} {'address':>21} {'pid':>7} {'cpus':>6}  instances")
    for im in doc["instance_managers"]:
        cpus = ",".join(map(str, im.get("cpus") or []))
        lines.append(f"  {im['name']:>12} {im.get('address') or '':>21} {im.get('pid')!s:>7} {cpus:>6}  "
                     f"{', '.join(im['instances']) or '-'}")
    lines.append(f"deployments ({len(doc['deployments'])}):")
    for d in doc["deployments"]:
        m = d.get("metrics") or {}
        lat = m.get("latency_ms") or {}
        head = f"  {d['query']} ({d.get('deployment')}) {d.get('state')}: {', '.join(d['streams'])} -> " \
               f"{', '.join(d['outputs'])}"
        if d.get("state") == "unknown":
            age = d.get("figures_age_s")
            lines.append(head + ("; no figures recorded yet" if age is None else
                                 f"; figures stale (recorded {age:.0f} s ago: the leader cannot reach the data path)"))
        else:
            lines.append(head + f"; in {m.get('rows_in') or 0:,} ({m.get('input_rate') or 0:,.0f}/s), out "
                         f"{m.get('rows_out') or 0:,} ({m.get('throughput') or 0:,.0f}/s), latency p50 "
                         f"{lat.get('p50', '-')} p99 {lat.get('p99', '-')} ms ({d['figures_age_s']:.0f} s ago)")
        for instance, ims in sorted(d["placement"].items()):
            lines.append(f"      {instance} on {', '.join(ims)}")
    if doc["events"]:
        lines.append("events:")
        for e in doc["events"]:
            what = {k: v for k, v in e.items() if k not in ("kind", "time")}
            lines.append(f"  {e.get('kind')}: {what}")
    return "\n".join(lines)
