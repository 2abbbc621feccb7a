"""``sparkcep metrics``: a running engine's metrics in Prometheus text format, printed once or served.

Reads the metrics through the engine's endpoint (the local engine by
default, or ``--engine host:port`` with its ``--token-file``) and maps them
as :mod:`sparkcep.control.prometheus` does.

    sparkcep metrics                                   # the local engine's metrics, once
    sparkcep metrics --engine 10.0.0.5:7077 --token-file token
    sparkcep metrics --listen 127.0.0.1:9464           # serve /metrics to Prometheus until Ctrl-C
"""

from __future__ import annotations

import sys
import time

from sparkcep.errors import SparkcepError


def add_arguments(parser) -> None:
    parser.add_argument("--engine", default=None, help="host:port of the engine (default: the local engine)")
    parser.add_argument("--token-file", default=None, help="file holding the engine's token (default: the one "
                        "the engine wrote on this machine, or $SPARKCEP_TOKEN_FILE)")
    parser.add_argument("--listen", default=None, metavar="HOST:PORT",
                        help="serve http://HOST:PORT/metrics until Ctrl-C instead of printing once (port 0: any "
                             "free port; the endpoint has no authentication: keep it on loopback unless needed)")


def run(args) -> int:
    from sparkcep.control import prometheus
    from sparkcep.gateway.client import EngineClient

    try:
        with EngineClient.connect(args.engine, timeout=30, token_file=args.token_file) as client:
            if not args.listen:
                m = client.metrics()  # read first: an error here fails the command instead of giving sparkcep_up 0
                sys.stdout.write(prometheus.exposition(lambda: m))
                return 0
            server, address = prometheus.serve(client.metrics, args.listen)
            print(f"serving the metrics of the engine at {client.address} on http://{address}/metrics "
                  "(Ctrl-C stops)", flush=True)
            try:
                while True:
                    time.sleep(3600)
            finally:
                server.shutdown()
    except KeyboardInterrupt:
        return 0
    except SparkcepError as e:
        print(f"sparkcep metrics: {e} [{e.code}]", file=sys.stderr)
        return 1
