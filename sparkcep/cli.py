"""The ``sparkcep`` command line: one sub-command per module.

Each module in COMMANDS provides ``add_arguments(parser)`` and
``run(args) -> int``; only the module of the sub-command that runs is
imported (``sparkcep worker`` starts without the benchmark's dependencies).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import re
import sys

from sparkcep.arguments import did_you_mean

COMMANDS = {
    "worker": ("sparkcep.runtime.instance_manager", "run an instance manager: a service engines deploy instances to"),
    "status": ("sparkcep.control.status", "show a running engine (or a cluster, --zk): queries, instance managers"),
    "zookeeper": ("sparkcep.control.zookeeper", "run a development ZooKeeper server on loopback for the registry"),
    "orchestrator": ("sparkcep.control.orchestrator", "run an orchestrator of a cluster (state in ZooKeeper)"),
    "deploy": ("sparkcep.control.deploy", "deploy a query (a Python file defining `query`) on a cluster"),
    "undeploy": ("sparkcep.control.deploy", "stop a query deployed on a cluster and forget it"),
    "rescale": ("sparkcep.control.reconfigure", "run an operator of a query on a cluster on N instances, live"),
    "migrate": ("sparkcep.control.reconfigure", "move bins of an operator of a query deployed on a cluster, live"),
    "metrics": ("sparkcep.control.metrics_cli", "print a running engine's metrics in Prometheus text, or serve them"),
    "token": ("sparkcep.control.token", "write a new cluster token to a file (mode 0600)"),
    "engine-host": ("sparkcep.control.host", "serve a cluster's engine (started by the leading orchestrator)"),
    "warm-up": ("sparkcep.runtime.warmup", "compile the engine's kernels into numba's cache (the install does it)"),
    "bench": ("sparkcep.bench.cli", "run a HiBench or NEXMark workload, optionally beside Spark"),
}
# commands that do one thing and end: each says itself why it could not reach the registry, so the
# ZooKeeper client's line a retry ("Connection dropped: ... Connection refused") is left unsaid
ONE_SHOT = {"status", "deploy", "undeploy", "rescale", "migrate"}


class Parser(argparse.ArgumentParser):
    """argparse's parser, naming the closest valid choice of a mistyped one."""

    def error(self, message: str):
        wrong = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if wrong:
            message += did_you_mean(wrong[1], [c.strip("'") for c in wrong[2].split(", ")])
        super().error(message)


def _check_options(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """Refuse an option ``parser`` does not have, naming the closest it has (before argparse, which
    would first say that a required option is missing when it is only misspelled)."""
    options = [o for a in parser._actions for o in a.option_strings]
    for arg in argv:
        if arg == "--":
            return
        name = arg.split("=")[0]
        if arg.startswith("--") and not any(o.startswith(name) for o in options):  # argparse takes prefixes
            parser.error(f"unrecognized arguments: {arg}{did_you_mean(name, options)}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = Parser(prog="sparkcep", description="UPM-CEP streaming engine")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            importlib.import_module(module).add_arguments(p)
            _check_options(p, argv[argv.index(name) + 1:])
    args = parser.parse_args(argv)
    if args.command in ONE_SHOT:
        logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    return int(importlib.import_module(COMMANDS[args.command][0]).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
