"""``sparkcep token FILE``: write a new cluster token to ``FILE`` (mode 0600; a missing directory
is made 0700, an existing one keeps its mode).

Every process of a cluster — orchestrators, workers, the engine host,
clients and Spark — is given the same file with ``--token-file``: each
connection proves it holds the token, and requests left in the registry
are sealed with it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sparkcep import auth


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="where to write the token (refused if it exists, unless --force)")
    parser.add_argument("--force", action="store_true", help="replace an existing token file")


def run(args) -> int:
    path = Path(args.file)
    if path.exists() and not args.force:
        print(f"sparkcep token: {path} exists; keep it, or replace it with --force")
        return 1
    auth.write(path.resolve(), auth.generate(), own_dir=False)
    print(f"wrote a new cluster token to {path} (mode 0600)")
    return 0
