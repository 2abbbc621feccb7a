"""Journal entries on the standby link: a JSON header, and Arrow IPC or a pickled query as the payload.

An entry is a dict with a ``kind`` and JSON fields, plus at most one of
``batches`` (Arrow record batches of one schema) or ``blob`` (bytes: a
query pickled by the primary, which proved the cluster's token). One
entry may span several frames: :func:`frames` cuts its batches into pieces
of at most :func:`~sparkcep.gateway.protocol.chunk_bytes` (a Spark
micro-batch is one send of hundreds of MiB), every frame but the last
marked ``more``; :class:`Assembler` joins them again.
"""

from __future__ import annotations

import pyarrow as pa

from sparkcep.gateway.protocol import chunk_bytes, chunks, from_ipc, to_ipc


def frames(entry: dict) -> list[tuple[dict, object]]:
    """``(header, payload)`` frames carrying ``entry``."""
    fields = {k: v for k, v in entry.items() if k not in ("batches", "blob", "schema")}
    if entry.get("blob") is not None:
        return [({**fields, "body": "blob"}, entry["blob"])]
    batches, schema = entry.get("batches") or [], entry.get("schema")
    if not batches and schema is None:
        return [(fields, b"")]
    schema = schema or batches[0].schema
    pieces = list(chunks(batches, chunk_bytes())) or [[]]
    return [({**fields, "body": "ipc", "more": k < len(pieces) - 1}, to_ipc(piece, schema))
            for k, piece in enumerate(pieces)]


class Assembler:
    """Joins the frames of one entry at a time: :meth:`add` returns the entry once its last frame came."""

    def __init__(self):
        self._batches: list[pa.RecordBatch] = []
        self._schema: pa.Schema | None = None

    def add(self, header: dict, payload) -> dict | None:
        entry = {k: v for k, v in header.items() if k not in ("op", "era", "body", "more")}
        if header.get("body") == "blob":
            entry["blob"] = bytes(payload) if payload is not None else b""
            return entry
        if header.get("body") == "ipc":
            table = from_ipc(payload)
            self._schema = table.schema
            self._batches.extend(table.to_batches())
            if header.get("more"):
                return None
            entry["batches"], entry["schema"] = self._batches, self._schema
            self._batches, self._schema = [], None
        return entry
