"""``sparkcep rescale`` and ``sparkcep migrate``: change a query deployed on a cluster, live.

    sparkcep rescale --zk HOST:PORT/PATH --token-file F QUERY OPERATOR N
    sparkcep migrate --zk HOST:PORT/PATH --token-file F QUERY OPERATOR --bins 0-63,128 --to 1
    sparkcep migrate --zk HOST:PORT/PATH --token-file F QUERY OPERATOR --file moves.txt

Each runs the method of the same name of the deployed query
(``cep.Engine.connect(zk, token_file=F).deployment(QUERY)``; the registry is waited
for 10 s, as by ``sparkcep deploy``) with
``--strategy``, ``--batch`` and ``--gap-ms`` as the Python methods take
them, and prints its report. ``--bins`` takes bins and inclusive ranges
(``0-63,128``); ``--to`` one instance for every bin, or one per bin;
``--file``, lines of ``bin=instance`` (or ``first-last=instance``), ``#``
starting a comment. A refusal prints ``sparkcep <command>: message [CODE]``
and exits with 1; nothing changed then.
"""

from __future__ import annotations

import argparse
import sys

from sparkcep import auth
from sparkcep.arguments import whole_number
from sparkcep.errors import QueryError, SparkcepError

REPORT_KEYS = ("kind", "strategy", "bins", "bytes", "steps", "duration_s", "max_latency_ms", "p99_latency_ms",
               "latency_epochs")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--zk", required=True, metavar="HOST:PORT/PATH", help="the cluster's ZooKeeper and root path")
    parser.add_argument("--token-file", required=True, help="the cluster's token")
    parser.add_argument("query", metavar="QUERY", help="the deployed query's name")
    parser.add_argument("operator", metavar="OPERATOR", help="its operator (a route-key one, to migrate bins)")
    if parser.prog.split()[-1] == "rescale":
        parser.add_argument("instances", metavar="N", help="the instances it runs on from now on")
        strategy = "batched"
    else:
        parser.add_argument("--bins", nargs="+", metavar="BINS", help="bins to move: 3, 0-63, 0-63,128")
        parser.add_argument("--to", nargs="+", metavar="INSTANCE", help="the instance for every bin, or one per bin")
        parser.add_argument("--file", help="a file of bin=instance (or first-last=instance) lines instead")
        strategy = "fluid"
    parser.add_argument("--strategy", default=strategy, help=f"fluid, batched or all-at-once (default {strategy})")
    parser.add_argument("--batch", default="16", help="bins per pair of instances a step, batched (default 16)")
    parser.add_argument("--gap-ms", default="0", help="milliseconds between two steps (default 0)")


def run(args) -> int:
    command = args.command
    try:
        options = {"strategy": args.strategy, "batch": _number(args.batch, "--batch", int, "BAD_OPTION"),
                   "gap_ms": _number(args.gap_ms, "--gap-ms", float, "BAD_OPTION")}
        if command == "rescale":
            instances = _number(args.instances, "N (instances)", int, "BAD_INSTANCE")
        else:
            assignment = _assignment(args)
        from sparkcep.control.connect import ConnectedEngine
        from sparkcep.control.orchestrator import zk_address
        with ConnectedEngine(zk_address(args.zk), auth.read(args.token_file)) as engine:
            deployed = engine.deployment(args.query)
            if command == "rescale":
                report = deployed.rescale(args.operator, instances, **options)
            else:
                report = deployed.migrate(args.operator, assignment, **options)
    except SparkcepError as e:
        print(f"sparkcep {command}: {e} [{e.code}]", file=sys.stderr)
        return 1
    if command == "rescale":
        what = f"to {instances} instances"
    else:
        stayed = len(assignment) - report["bins"]
        what = f"{len(assignment)} bins" + (f" asked for, {report['bins']} moved ({stayed} there already)" if stayed else "")
    print(f"{command}: {args.operator} of {args.query} ({deployed.id}), {what}")
    for key in REPORT_KEYS:
        print(f"  {key:>15}: {report[key]}")
    return 0


def _assignment(args) -> dict[int, int]:
    """``{bin: instance}`` from ``--bins``/``--to`` or ``--file`` (QueryError BAD_BIN / BAD_INSTANCE)."""
    if args.file is not None:
        if args.bins or args.to:
            raise QueryError("give --bins and --to, or --file, not both", "BAD_OPTION")
        try:
            with open(args.file) as f:
                lines = f.read().splitlines()
        except OSError as e:
            raise QueryError(f"cannot read {args.file}: {e.strerror}", "BAD_OPTION") from None
        out = {}
        for n, line in enumerate(lines, 1):
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            bins, eq, instance = text.partition("=")
            if not eq:
                raise QueryError(f"{args.file}, line {n}: {line.strip()!r} is not bin=instance", "BAD_BIN")
            to = _number(instance.strip(), f"{args.file}, line {n}: the instance", int, "BAD_INSTANCE")
            _assign(out, _bins([bins]), [to], f"{args.file}, line {n}")
        if not out:
            raise QueryError(f"{args.file} names no bin: lines of bin=instance (or first-last=instance)", "BAD_BIN")
        return out
    if not args.bins or not args.to:
        raise QueryError("say which bins move where: --bins ... --to ..., or --file FILE", "BAD_OPTION")
    bins = _bins(args.bins)
    to = [_number(t, "--to", int, "BAD_INSTANCE") for t in args.to]
    if len(to) not in (1, len(bins)):
        raise QueryError(f"--to gives {len(to)} instances for {len(bins)} bins: give one, or one per bin",
                         "BAD_INSTANCE")
    return _assign({}, bins, to, "--bins/--to")


def _assign(out: dict[int, int], bins: list[int], to: list[int], where: str) -> dict[int, int]:
    """``out`` with each of ``bins`` going to its instance in ``to`` (one for all, or one each); a bin sent
    to two instances is refused (BAD_BIN), naming ``where`` it came the second time."""
    for b, instance in zip(bins, to * len(bins) if len(to) == 1 else to):
        if out.setdefault(b, instance) != instance:
            raise QueryError(f"{where}: bin {b} goes to instance {out[b]} and to instance {instance}: "
                             "give each bin one instance", "BAD_BIN")
    return out


def _bins(words: list[str]) -> list[int]:
    """Bins from words of comma-separated bins and inclusive ranges: ``["0-3,8", "10"]`` -> 0..3, 8, 10.

    A bin past any operator's (``0-10000000000``, a slip) is refused before its range is listed."""
    from sparkcep.runtime.deployment import MAX_BINS
    out = []
    for part in (p.strip() for word in words for p in word.split(",")):
        if not part:  # an empty shell variable, or a doubled comma
            raise QueryError(f"bins {' '.join(words)!r} hold an empty item: bins are from 0 to {MAX_BINS - 1}, "
                             "comma-separated (a range: first-last)", "BAD_BIN")
        first, dash, last = part.partition("-")
        if not first:
            raise QueryError(f"bin {part!r}: bins are from 0 to {MAX_BINS - 1} (a range: first-last)", "BAD_BIN")
        a = _number(first, "a bin", int, "BAD_BIN")
        b = _number(last, "a bin", int, "BAD_BIN") if dash else a
        if b < a:
            raise QueryError(f"bin range {part!r} runs backwards", "BAD_BIN")
        if b >= MAX_BINS:
            raise QueryError(f"bin {b} of {part!r} is out of range: no operator has more than {MAX_BINS} bins "
                             f"(0-{MAX_BINS - 1})", "BAD_BIN")
        out.extend(range(a, b + 1))
    return out


def _number(text: str, name: str, kind, code: str):
    """``text`` as an int (written ``1e3`` or ``2.0`` too, as every command's counts) or a float, else
    QueryError ``code`` naming ``name``."""
    try:
        return kind(text)
    except ValueError:
        if kind is int and (value := whole_number(text)) is not None:
            return value
        what = "an integer" if kind is int else "a number"
        raise QueryError(f"{name} must be {what}, got {text!r}", code) from None
