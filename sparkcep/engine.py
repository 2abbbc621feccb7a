"""The engine: deploy queries, send tuples in, read results out.

``Engine.local(workers=0)`` runs everything in the calling process.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from sparkcep.core import columns
from sparkcep.core.ingest import to_batch
from sparkcep.core.operators import WM_NONE
from sparkcep.errors import EngineError, InputError, QueryError, UnknownStreamError
from sparkcep.query.query import Query
from sparkcep.runtime.deployment import Deployment
from sparkcep.runtime.output_log import OutputLog


class Engine:
    """A running engine. Use :meth:`local` to start one."""

    def __init__(self, workers: int = 0):
        if workers != 0:
            raise EngineError("only workers=0 (everything in this process) is available so far", "WORKERS")
        self.workers = workers
        self.deployments: dict[str, Deployment] = {}
        self.streams: dict[str, list[Deployment]] = {}
        self.outputs: dict[str, OutputLog] = {}
        self._seq = 0  # the next sequence number: one order over every stream of the engine
        self._ended: set[str] = set()
        self._closed = False

    @classmethod
    def local(cls, workers: int = 0) -> "Engine":
        """An engine on this machine; ``workers=0`` runs every instance in this process."""
        engine = cls(workers)
        # --- loopback endpoint for Spark workers and the CLI (sparkcep.control.endpoint) ---
        from sparkcep.control.endpoint import start_endpoint
        engine.endpoint = start_endpoint(engine)
        # --- end of loopback endpoint ---
        return engine

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True
        # --- loopback endpoint ---
        if getattr(self, "endpoint", None) is not None:
            self.endpoint.close()
        # --- end of loopback endpoint ---

    # --- queries -----------------------------------------------------------------
    def deploy(self, query: Query, parallelism=1, bins: int = 128) -> Deployment:
        """Plan and start ``query``; ``parallelism``: an int or ``{operator name: instances}``."""
        self._check_open()
        if not isinstance(query, Query):
            raise QueryError(f"deploy() takes a Query, got {type(query).__name__}")
        if query.name in self.deployments:
            raise QueryError(f"a query named {query.name!r} is already deployed")
        clash = [o for o in query.outputs if o in self.outputs or o in self.streams]
        if clash:
            raise QueryError(f"output {clash[0]!r} of query {query.name!r} is already a stream of this engine")
        for name, src in query.sources.items():
            for other in self.streams.get(name, ()):
                if other.query.sources[name].schema != src.schema:
                    raise QueryError(f"stream {name!r} is declared with schema {src.schema} but query "
                                     f"{other.query.name!r} declares it as {other.query.sources[name].schema}")
            if name in self.outputs:
                raise QueryError(f"stream {name!r} is an output of another query")
        dep = Deployment(query, parallelism, bins)
        for out, op in query.outputs.items():
            self.outputs[out] = dep.logs[out] = OutputLog(op.schema.to_arrow())
        for name in query.sources:
            self.streams.setdefault(name, []).append(dep)
        self.deployments[query.name] = dep
        return dep

    # --- input -------------------------------------------------------------------
    def send(self, stream: str, data) -> int:
        """Send tuples into ``stream``; returns how many. A rejected batch leaves no trace."""
        deps = self._deployments_of(stream)
        if stream in self._ended:
            raise InputError(f"stream {stream!r} has ended; no more tuples can be sent to it", "ENDED")
        src = deps[0].query.sources[stream]
        batch = to_batch(stream, src.schema, data, src.time_field)
        n = batch.num_rows
        if n == 0:
            return 0
        seq = np.arange(self._seq, self._seq + n, dtype=np.int64)
        if src.time_field is not None:
            ts = batch.column(src.time_field).cast(pa.int64()).to_numpy()
        else:
            ts = np.zeros(n, np.int64)
        for dep in deps:
            before = dep.sources[stream].max_ts
            stamped = batch.append_column(columns.SEQ, pa.array(seq)) \
                .append_column(columns.TS, pa.array(ts)) \
                .append_column(columns.WM, pa.array(np.full(n, before, np.int64)))
            dep.push(stream, stamped, int(ts.max()))
        self._seq += n
        for dep in deps:
            dep.progress(self._seq - 1)
        return n

    def end(self, stream: str) -> None:
        """End of input for ``stream``: once all inputs of a query end, every open window fires."""
        deps = self._deployments_of(stream)
        self._ended.add(stream)
        for dep in deps:
            dep.end(stream, self._seq - 1)

    # --- output ------------------------------------------------------------------
    def collect(self, output: str) -> pa.Table:
        """Everything ``output`` has produced so far, as a pyarrow Table."""
        return self._log(output).table()

    def subscribe(self, output: str, callback) -> None:
        """Call ``callback(pyarrow.RecordBatch)`` with every batch ``output`` produces from now on."""
        self._log(output).subscribers.append(callback)

    def metrics(self) -> dict:
        """Counters of the engine: tuples in per stream, rows out per output, late tuples per operator."""
        return {
            "sequence": self._seq,
            "outputs": {name: log.rows for name, log in self.outputs.items()},
            "late": {q: dep.late_tuples() for q, dep in self.deployments.items()},
        }

    def _log(self, output: str) -> OutputLog:
        self._check_open()
        if output not in self.outputs:
            raise UnknownStreamError(f"no deployed query has an output named {output!r}; "
                                     f"outputs: {sorted(self.outputs)}")
        return self.outputs[output]

    def _deployments_of(self, stream: str) -> list[Deployment]:
        self._check_open()
        if stream not in self.streams:
            raise UnknownStreamError(f"no deployed query reads a stream named {stream!r}; "
                                     f"streams: {sorted(self.streams)}")
        return self.streams[stream]

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("the engine is closed", "CLOSED")
