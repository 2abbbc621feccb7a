"""``sparkcep status``: what a running engine is doing — queries, sub-queries, instance managers, late
tuples, migrations and the balancer.

Reads the engine's metrics through its loopback endpoint (the local engine
by default, or ``--engine host:port``) and prints, per query, its input rate,
throughput and latency, each sub-query's instances and where they run, and
per instance manager its core, CPU, memory and bytes in/out; then the
migrations under way (bins done of planned) and the last ones finished
(bins, bytes, steps, duration, latency of the input meanwhile), and the
balancer's view: how busy each instance manager is and its last decisions,
each with its reason and outcome.

    sparkcep status                 # the local engine, once
    sparkcep status --watch 1       # every second until Ctrl-C
    sparkcep status --json          # the raw metrics
    sparkcep status --zk 127.0.0.1:2181/demo [--json]   # a cluster, from its registry
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from sparkcep.arguments import bounded
from sparkcep.errors import SparkcepError
from sparkcep.runtime.metrics import answered


def add_arguments(parser) -> None:
    parser.add_argument("--engine", default=None, help="host:port of the engine (default: the local engine)")
    parser.add_argument("--json", action="store_true", help="print the raw metrics as JSON")
    parser.add_argument("--watch", type=_interval, default=0, metavar="SECONDS",
                        help="repeat every SECONDS (0.1 to 86400; default 0: once)")
    parser.add_argument("--zk", default=None, metavar="HOST:PORT/PATH",
                        help="show a cluster from its registry: orchestrators, instance managers, deployments")


def _interval(text: str) -> float:
    """``--watch``: 0 (once), or 0.1 to 86400 seconds between two reports."""
    seconds = bounded(float, 0, 86_400)(text)
    if 0 < seconds < 0.1:
        raise argparse.ArgumentTypeError(f"must be 0 (once) or from 0.1 to 86,400, got {text}")
    return seconds


def run(args) -> int:
    from sparkcep.gateway.client import EngineClient

    if args.zk:
        from sparkcep.control import cluster_status
        from sparkcep.control.orchestrator import zk_address
        from sparkcep.control.registry import open_registry

        def open_source():
            return open_registry(zk_address(args.zk))

        def show(registry):
            doc = cluster_status.cluster(registry)
            return json.dumps(doc, indent=1) if args.json else cluster_status.render(doc)
    else:
        def open_source():
            return EngineClient.connect(args.engine, timeout=30)

        def show(client):
            hello, metrics = client.hello(), client.metrics()
            return json.dumps({"engine": hello, "metrics": metrics}, indent=1) if args.json else render(hello, metrics)
    try:
        with open_source() as source:
            while True:
                print(show(source), flush=True)
                if not args.watch:
                    return 0
                time.sleep(args.watch)
                print()
    except KeyboardInterrupt:
        return 0
    except SparkcepError as e:
        print(f"sparkcep status: {e} [{e.code}]", file=sys.stderr)
        return 1


def _rate(x) -> str:
    x = float(x or 0)
    for unit, k in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if x >= k:
            return f"{x / k:.1f}{unit}"
    return f"{x:.0f}"


def _bytes(x) -> str:
    x = float(x or 0)
    for unit, k in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if x >= k:
            return f"{x / k:.1f} {unit}"
    return f"{x:.0f} B"


def _lat(d: dict) -> str:
    return " ".join(f"{k} {v:g}" for k, v in d.items() if k in ("p50", "p99")) + " ms" if d else "-"


RECENT = 5  # finished migrations and balancer decisions shown


def _clock(t) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if t else "--:--:--"


def _report(r: dict) -> str:
    """One finished migration: what moved, how long it took, the latency of the input meanwhile."""
    return (f"{r.get('bins', 0):,} bins, {_bytes(r.get('bytes'))}, {r.get('steps', 0)} steps in "
            f"{r.get('duration_s', 0):.2f} s, latency max {r.get('max_latency_ms', 0):g} ms, "
            f"p99 {r.get('p99_latency_ms', 0):g} ms")


def render_migrations(m: dict) -> list[str]:
    """The migrations under way, the last ones finished, and the balancer's view and decisions."""
    lines = []
    running, finished = [], []
    for q, mig in sorted((m.get("migrations") or {}).items()):
        running += [(q, r) for r in mig.get("running", [])]
        finished += [(q, r) for r in mig.get("finished", [])]
    if running or finished:
        lines.append(f"migrations ({len(running)} running, {len(finished)} finished):")
    for q, r in running:
        planned = r.get("planned_bins")
        done = f"{r.get('bins', 0):,}" + (f"/{planned:,}" if planned is not None else "")
        lines.append(f"  running  {q}.{r['operator']}: {r['kind']} ({r['strategy']}), {done} bins, "
                     f"{r.get('steps', 0)} steps")
    for q, r in sorted(finished, key=lambda qr: qr[1].get("finished") or 0)[-RECENT:]:
        lines.append(f"  {_clock(r.get('finished'))} {q}.{r['operator']}: {r['kind']} ({r['strategy']}), {_report(r)}")
    b = m.get("balancer")
    if b:
        queued = b.get("queued_bytes", {})
        busy = ", ".join(f"{name} {share:.0%}" + (f" ({_bytes(queued[name])} queued)" if queued.get(name) else "")
                         for name, share in sorted(b.get("busy", {}).items()))
        busy = busy or "not sampled yet"
        lines.append(f"balancer (queries {', '.join(b.get('watched', [])) or 'none'}): busy {busy}")
        decisions = b.get("decisions", [])
        if decisions:
            lines.append(f"  decisions ({len(decisions)}, the last {min(RECENT, len(decisions))}):")
        for d in decisions[-RECENT:]:
            state = d.get("state", "done")
            lines.append(f"    {_clock(d.get('time'))} {d['query']}.{d['operator']} {d['action']} [{state}]: "
                         f"{d['reason']}")
            if d.get("report"):
                lines.append(f"        {_report(d['report'])}")
            if d.get("error"):
                lines.append(f"        failed: {d['error']}")
    return lines


def render(hello: dict, m: dict) -> str:
    """The status text of one metrics snapshot."""
    lines = [f"engine {hello.get('address')} (pid {hello.get('pid')}): {m.get('sequence', 0):,} tuples in"]
    ims = m.get("instance_managers") or {}
    if ims:
        lines.append(f"instance managers ({len(ims)}):")
        lines.append(f"  {'name':>12} {'address':>21} {'pid':>7} {'cpu':>4} {'node':>4} {'state':>9} {'cpu%':>6} "
                     f"{'rss':>9} {'in/s':>9} {'out/s':>9} {'instances':>9}")
        for i, im in sorted(ims.items(), key=lambda kv: int(kv[0])):
            state = "DEAD" if not im.get("alive") else "up" if answered(im) else "no answer"
            figures = (f"{im.get('cpu_percent', 0):>6} {_bytes(im.get('rss_bytes')):>9} "
                       f"{_bytes(im.get('bytes_in_rate')) + '/s':>9} {_bytes(im.get('bytes_out_rate')) + '/s':>9} "
                       f"{im.get('instances', ''):>9}")
            if not answered(im):  # unknown, not 0
                figures = f"{'?':>6} {'?':>9} {'?':>9} {'?':>9} {'?':>9}"
            lines.append(f"  {im.get('name', i):>12} {im.get('address', ''):>21} {im.get('pid', ''):>7} "
                         f"{im.get('cpu', ''):>4} {im.get('node', ''):>4} {state:>9} {figures}")
            if im.get("error"):
                lines.append(f"      {im['error']}")
    else:
        lines.append("instance managers: none (instances run in the engine process)")
    queries = m.get("queries") or {}
    lines.append(f"queries ({len(queries)}):")
    for name, q in queries.items():
        state = q.get("state", "running")
        shown = name if state == "running" else f"{name} [{state.upper()}]"
        lines.append(f"  {shown}: in {q['rows_in']:,} ({_rate(q.get('input_rate'))}/s), out {q['rows_out']:,} "
                     f"({_rate(q.get('throughput'))}/s), latency {_lat(q.get('latency_ms', {}))}, "
                     f"epoch {q.get('done_epoch')}/{q.get('epoch')}")
        for sq_name, sq in q.get("subqueries", {}).items():
            queue = sq.get("queue", {})
            lines.append(f"    {sq_name} x{sq['instances']} [{' -> '.join(sq.get('operators', []))}]: "
                         f"in {sq['rows_in']:,} ({_rate(sq.get('input_rate'))}/s), out {sq['rows_out']:,} "
                         f"({_rate(sq.get('throughput'))}/s), latency {_lat(sq.get('latency_ms', {}))}, "
                         f"queued {_bytes(queue.get('input_bytes'))} + {queue.get('stashed_rows', 0):,} rows")
            for where in sq.get("placement", []):
                lines.append(f"        {where}")
        for out, o in q.get("outputs", {}).items():
            lines.append(f"    output {out}: {o['rows']:,} rows, latency {_lat(o.get('latency_ms', {}))}")
        late = (m.get("late") or {}).get(name) or {}
        if any(late.values()):
            lines.append("    late tuples: " + ", ".join(f"{k} {v:,}" for k, v in late.items()))
    by_stream = m.get("late_by_stream") or {}
    if by_stream:
        lines.append("late tuples per input stream:")
        for stream, ops in sorted(by_stream.items()):
            lines.append(f"  {stream}: " + ", ".join(f"{op} {n:,}" for op, n in sorted(ops.items())))
    lines += render_migrations(m)
    return "\n".join(lines)
