"""``sparkcep deploy`` and ``sparkcep undeploy``: deploy a query on a cluster, or take one off it.

    sparkcep deploy --zk HOST:PORT/PATH --token-file F QUERY.py
    sparkcep undeploy --zk HOST:PORT/PATH --token-file F QUERY

``QUERY.py`` defines ``query`` (a :class:`sparkcep.Query`); the leading
orchestrator deploys it on the cluster's instance managers and the command
prints the plan with where each instance runs. ``undeploy`` stops the
deployed query named ``QUERY`` on every instance manager and forgets it (its
undelivered outputs with it). A refusal prints ``sparkcep <command>: message
[CODE]`` and exits with 1.
"""

from __future__ import annotations

import argparse
import runpy
import sys
import traceback

from sparkcep import auth
from sparkcep.arguments import bounded
from sparkcep.errors import SparkcepError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--zk", required=True, metavar="HOST:PORT/PATH", help="the cluster's ZooKeeper and root path")
    parser.add_argument("--token-file", required=True, help="the cluster's token")
    if parser.prog.split()[-1] == "undeploy":
        parser.add_argument("query", metavar="QUERY", help="the deployed query's name")
        return
    parser.add_argument("--parallelism", type=bounded(int, 1), default=1, help="instances per sub-query (default 1)")
    parser.add_argument("--bins", type=bounded(int, 1), default=128, help="bins per stateful operator (a power of two)")
    parser.add_argument("--replicas", type=bounded(int, 1), default=1, help="active replicas of the query (default 1)")
    parser.add_argument("file", metavar="QUERY.py", help="a Python file defining `query`, a sparkcep.Query")


def load_query(path: str):
    """The ``query`` a Python file defines; SystemExit with a clear message otherwise."""
    import sparkcep as cep
    try:
        names = runpy.run_path(path, run_name="__sparkcep_query__")
    except OSError as e:
        sys.exit(f"sparkcep deploy: cannot read {path}: {e}")
    except SparkcepError as e:  # the query it writes is refused: one line, as every refusal
        sys.exit(f"sparkcep deploy: {path}: {e} [{e.code}]")
    except Exception as e:  # the user's own code failed: where, not our traceback
        tb = traceback.extract_tb(e.__traceback__)
        at = next((f"line {f.lineno}" for f in reversed(tb) if f.filename == path), None) \
            or (f"line {e.lineno}" if isinstance(e, SyntaxError) else "running it")
        sys.exit(f"sparkcep deploy: {path} raised {type(e).__name__} at {at}: {e}")
    query = names.get("query")
    if not isinstance(query, cep.Query):
        sys.exit(f"sparkcep deploy: {path} must define `query`, a sparkcep.Query (found {type(query).__name__})")
    return query


def run(args) -> int:
    import logging
    logging.basicConfig(level=logging.WARNING, format=f"sparkcep {args.command}: %(message)s")
    from sparkcep.control.connect import ConnectedEngine
    from sparkcep.control.orchestrator import zk_address
    query = load_query(args.file) if args.command == "deploy" else None
    try:
        with ConnectedEngine(zk_address(args.zk), auth.read(args.token_file)) as engine:
            if query is None:
                engine.undeploy(args.query)
                print(f"undeployed {args.query}")
                return 0
            deployed = engine.deploy(query, parallelism=args.parallelism, bins=args.bins, replicas=args.replicas)
            explain = deployed.explain()
    except SparkcepError as e:
        print(f"sparkcep {args.command}: {e} [{e.code}]", file=sys.stderr)
        return 1
    print(f"deployed {query.name} as {deployed.id}")
    print(explain)
    return 0
