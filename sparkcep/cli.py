"""The ``sparkcep`` command line: one sub-command per module.

Each module in COMMANDS provides ``add_arguments(parser)`` and
``run(args) -> int``; it is imported only when its sub-command runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "status": ("sparkcep.control.status", "show a running local engine: queries, instance managers, metrics"),
    "bench": ("sparkcep.bench.cli", "run a HiBench streaming workload, optionally beside Spark"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sparkcep", description="UPM-CEP streaming engine")
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name, (module, help_text) in COMMANDS.items():
        try:
            modules[name] = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            continue
        modules[name].add_arguments(sub.add_parser(name, help=help_text, description=help_text))
    args = parser.parse_args(argv)
    return int(modules[args.command].run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
