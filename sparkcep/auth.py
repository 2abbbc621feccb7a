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
"""

from __future__ import annotations

import hmac
import os
import secrets
import time
from pathlib import Path

from sparkcep.errors import EngineError

TOKEN_BYTES = 32


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


def write_private(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically, readable by its owner only (0600), in a 0700 directory."""
    private_dir(path.parent)
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


def write(path: Path, token: str) -> Path:
    """Store ``token`` in ``path`` (mode 0600)."""
    return write_private(path, token + "\n")


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
