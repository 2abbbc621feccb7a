"""Nodes of the registry: paths, documents, errors and session states, shared by the interface
(:mod:`.base`), its backends and its recipes (:mod:`.lease`)."""

from __future__ import annotations

import enum
import json
import re

from sparkcep.errors import EngineError

MAX_DOCUMENT = 512 * 1024  # ZooKeeper refuses requests over 1 MB (jute.maxbuffer)
LEASES = "/leases"

_PATH = re.compile(r"(/[^/\x00-\x1f\x7f]+)+")


class RegistryError(EngineError):
    """A registry operation failed: ``code`` says why, ``path`` names the node (None: the registry itself).

    Codes: REGISTRY_UNREACHABLE, REGISTRY_CLOSED, NO_NODE, NODE_EXISTS,
    NOT_EMPTY, EPHEMERAL_PARENT, BAD_VERSION, NOT_ALLOWED, BAD_PATH, BAD_DOCUMENT, DOCUMENT_TOO_LARGE,
    BAD_ADDRESS, UNKNOWN_ARGUMENT, LEASE_TIMEOUT, LEASE_LOST, and CONFLICT
    (ZooKeeper: concurrent writers kept spoiling a transaction's plan).
    """

    code = "REGISTRY"

    def __init__(self, message: str, code: str | None = None, path: str | None = None):
        super().__init__(message, code)
        self.path = path


_NODE_ERRORS = {
    "NO_NODE": "no such node",
    "NODE_EXISTS": "the node exists already",
    "NOT_EMPTY": "the node has children (delete with recursive=True)",
    "EPHEMERAL_PARENT": "its parent is an ephemeral node, which cannot have children",
    "BAD_VERSION": "the node changed since it was read (or is gone)",
    "NOT_ALLOWED": "this session does not hold the cluster's token (the registry's nodes are writable by its "
                   "holders only)",
}


def node_error(code: str, operation: str, path: str) -> RegistryError:
    """The error of ``operation`` on ``path`` (relative to the root), worded the same by both backends."""
    return RegistryError(f"{operation} {path}: {_NODE_ERRORS[code]}", code, path)


class State(enum.Enum):
    """A registry session's state: see the module docstring for what a caller may assume in each."""

    CONNECTED = "CONNECTED"
    SUSPENDED = "SUSPENDED"
    LOST = "LOST"


def check_path(path: str) -> str:
    """``path`` if it is an absolute node path (``/a/b``, or ``/``); RegistryError BAD_PATH otherwise."""
    if path == "/" or (isinstance(path, str) and _PATH.fullmatch(path)
                       and not {".", ".."} & set(path.split("/"))):
        return path
    raise RegistryError(f"bad registry path {path!r}: expected an absolute path such as '/members/im-1' "
                        "(no empty, '.' or '..' parts, no trailing '/', no control characters)", "BAD_PATH", path)


def parent(path: str) -> str:
    """The parent of an absolute path (``/`` for a top-level node)."""
    return path.rsplit("/", 1)[0] or "/"


def ancestors(path: str) -> list[str]:
    """The proper ancestors of ``path`` below ``/``, outermost first: ``/a/b/c`` -> ``/a``, ``/a/b``."""
    parts = path.split("/")[1:-1]
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def sequence_number(name: str) -> int:
    """The number a sequential node's name ends with (10 digits, as ZooKeeper appends)."""
    return int(name[-10:])


def encode(doc: dict, path: str) -> bytes:
    """``doc`` as stored: compact JSON; BAD_DOCUMENT or DOCUMENT_TOO_LARGE naming ``path`` otherwise."""
    if not isinstance(doc, dict):
        raise RegistryError(f"document for {path}: expected a dict (a JSON object), got {type(doc).__name__}",
                            "BAD_DOCUMENT", path)
    try:
        data = json.dumps(doc, separators=(",", ":"), sort_keys=True, allow_nan=False).encode()
    except (TypeError, ValueError) as e:
        raise RegistryError(f"document for {path} is not JSON: {e}", "BAD_DOCUMENT", path) from None
    if len(data) > MAX_DOCUMENT:
        raise RegistryError(f"document for {path} is {len(data):,} bytes encoded; at most {MAX_DOCUMENT:,} "
                            "(keep bulky state out of the registry)", "DOCUMENT_TOO_LARGE", path)
    return data


def decode(data: bytes, path: str) -> dict:
    """A stored document (``{}`` for a node made as a parent); BAD_DOCUMENT when it is not a JSON object."""
    if not data:
        return {}
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise RegistryError(f"node {path} holds no JSON document: {e}", "BAD_DOCUMENT", path) from None
    if not isinstance(doc, dict):
        raise RegistryError(f"node {path} holds a JSON {type(doc).__name__}, not an object", "BAD_DOCUMENT", path)
    return doc
