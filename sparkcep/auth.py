"""Tokens that let only an engine's owner talk to it.

An engine generates a token when its endpoint starts (:func:`generate`) and
writes it to a file only its user can read (:func:`write`: mode 0600, in a
directory of mode 0700); a client reads it (:func:`read`) and puts it in
every request; the endpoint compares it in constant time (:func:`check`).
Nothing here knows about the endpoint or its framing, so any connection
between sparkcep processes (engine, instance managers) can use the same
token the same way.

>>> token = generate()
>>> check(token, token), check(token, "guess"), check(token, None)
(True, False, False)

Documents that others could forge — the registry has no ACLs — are
*sealed*: :func:`seal` adds an HMAC-SHA256 of the document under the token,
:func:`unseal` checks it before anything in the document is acted on or
unpickled. A seal proves who wrote a document, it does not hide it; tokens
themselves never go into a document.

>>> unseal(seal({"query": "q1"}, token), token)
{'query': 'q1'}
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import time
from pathlib import Path

from sparkcep.errors import EngineError

TOKEN_BYTES = 32
SEAL = "_seal"  # the key of a sealed document's HMAC
_SEAL_CONTEXT = b"sparkcep seal v1\n"


class AuthError(EngineError):
    """A request without the engine's token, or no token to send."""

    code = "UNAUTHENTICATED"


def generate() -> str:
    """A fresh token: 32 random bytes as 64 hex digits."""
    return secrets.token_hex(TOKEN_BYTES)


def private_dir(path: Path) -> Path:
    """``path`` as a directory only its owner may enter (created if missing, mode 0700)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)
    return path


def write_private(path: str | os.PathLike, text: str, own_dir: bool = True) -> Path:
    """Write ``text`` to ``path`` atomically, readable by its owner only (0600). ``own_dir``: the directory
    is the engine's own, made 0700; otherwise one that exists (a user's, ``/tmp``) is left as it is."""
    path = Path(path)
    if own_dir:
        private_dir(path.parent)
    else:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write(path: str | os.PathLike, token: str, own_dir: bool = True) -> Path:
    """Store ``token`` in ``path`` (mode 0600; ``own_dir`` as :func:`write_private`)."""
    return write_private(path, token + "\n", own_dir)


def read(path: str | os.PathLike) -> str:
    """The token stored in ``path``; AuthError ``TOKEN_FILE`` when it cannot be read or holds none."""
    try:
        token = Path(path).read_text().strip()
    except OSError as e:
        raise AuthError(f"cannot read the engine token file {path}: {e.strerror or e}", "TOKEN_FILE") from None
    if not token:
        raise AuthError(f"the engine token file {path} is empty", "TOKEN_FILE")
    return token


def check(expected: str, given) -> bool:
    """Whether ``given`` is the token ``expected``, compared in constant time."""
    return isinstance(given, str) and hmac.compare_digest(expected.encode(), given.encode())


def _mac(body: dict, token: str, what: str) -> str:
    """HMAC-SHA256 under ``token`` of ``body``'s canonical JSON (sorted keys, no spaces, ASCII)."""
    try:
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise AuthError(f"cannot seal {what}: it is not JSON ({e})", "BAD_DOCUMENT") from None
    if token in canonical:
        raise AuthError(f"cannot seal {what}: it holds the token itself", "TOKEN_IN_DOCUMENT")
    return "hmac-sha256:" + hmac.new(token.encode(), _SEAL_CONTEXT + canonical.encode(), hashlib.sha256).hexdigest()


def seal(doc: dict, token: str, what: str = "document") -> dict:
    """``doc`` with its seal under ``token`` (key ``_seal``, replacing any former one); called before a
    document that something will act on goes into the registry."""
    if not isinstance(doc, dict):
        raise AuthError(f"cannot seal {what}: expected a dict, got {type(doc).__name__}", "BAD_DOCUMENT")
    body = {k: v for k, v in doc.items() if k != SEAL}
    return {**body, SEAL: _mac(body, token, what)}


def unseal(doc, token: str, what: str = "document") -> dict:
    """``doc`` without its seal, if the seal is ``token``'s; AuthError ``UNAUTHENTICATED`` naming ``what``
    when it is unsealed or its seal does not match (tampered with, or sealed with another token)."""
    if not isinstance(doc, dict) or not isinstance(doc.get(SEAL), str):
        raise AuthError(f"{what} is not sealed: refused (only holders of the cluster token may write it)",
                        "UNAUTHENTICATED")
    body = {k: v for k, v in doc.items() if k != SEAL}
    if not hmac.compare_digest(_mac(body, token, what).encode(), doc[SEAL].encode()):
        raise AuthError(f"{what}: its seal does not match (tampered with, or sealed with another token): refused",
                        "UNAUTHENTICATED")
    return body
