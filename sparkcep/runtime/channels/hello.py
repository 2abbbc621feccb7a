"""The hello that opens a network channel's connection, and the listening side's check of it.

A channel address ``tcp:HOST:PORT/CHANNEL_ID`` names a service listening on
HOST:PORT and one of its channels. The connecting end sends one frame (a
u32 length, then at most ``HELLO_MAX`` bytes of JSON): ``{"token",
"channel", "role", "capacity"}`` — its role (``producer`` or ``consumer``),
the capacity when it is the producer. The service hands the accepted socket
to its :class:`Gate`, which reads that frame within a timeout and checks the
token; a connection without the right token, or with a malformed or late
hello, is answered ``{"ok": false, "error"}``, logged, counted and closed.
An instance manager's services take engines' control connections the same
way (role ``control``, no channel; :mod:`sparkcep.runtime.commands`). A
verified channel :class:`Hello` goes to the end the service created for the
channel, which answers ``{"ok": true, "capacity"}``
(:meth:`sparkcep.runtime.channels.tcp.TcpProducer.attach`). Nothing here
is unpickled: frames are JSON.
"""

from __future__ import annotations

import json
import logging
import socket
import struct
import time
from dataclasses import dataclass

from sparkcep.auth import AuthError, check as token_matches
from sparkcep.errors import EngineError

log = logging.getLogger(__name__)

ROLES = ("producer", "consumer")
CONTROL = "control"  # the role of an engine's control connection to an instance manager
HELLO_MAX = 4096  # bytes of a hello or its answer
HELLO_TIMEOUT_S = 5.0
FRAME = struct.Struct("<I")  # the JSON's length


class ChannelRefused(EngineError):
    """The other side of a connection did not accept it as the channel asked for."""

    code = "CHANNEL_REFUSED"


def parse_address(address: str) -> tuple[str, int, str]:
    """``tcp:HOST:PORT/CHANNEL_ID`` as (host, port, channel id); an IPv6 HOST is written in brackets."""
    kind, _, rest = address.partition(":")
    where, slash, channel = rest.partition("/")
    host, _, port = where.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if kind != "tcp" or not slash or not channel or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise EngineError(f"bad channel address {address!r}; expected tcp:HOST:PORT/CHANNEL_ID", "CHANNEL")
    return host, int(port), channel


def check_capacity(capacity) -> int:
    """``capacity`` if it is a channel capacity: a multiple of 8 in [4096, 2**30] bytes."""
    if not isinstance(capacity, int) or isinstance(capacity, bool) or not 4096 <= capacity <= 1 << 30 or capacity % 8:
        raise EngineError(f"channel capacity must be a multiple of 8 in [4096, 2**30], got {capacity!r}", "CHANNEL")
    return capacity


def send_frame(sock: socket.socket, fields: dict, deadline: float) -> None:
    """Send one frame of ``fields``, blocking until ``deadline`` (time.monotonic()) at most."""
    sock.settimeout(max(deadline - time.monotonic(), 0.001))
    body = json.dumps(fields, separators=(",", ":")).encode()
    sock.sendall(FRAME.pack(len(body)) + body, socket.MSG_NOSIGNAL)


def _read_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no complete hello in time")
        sock.settimeout(left)
        part = sock.recv(n - len(buf))
        if not part:
            raise ConnectionError("the connection closed during the hello")
        buf += part
    return bytes(buf)


def read_frame(sock: socket.socket, deadline: float) -> dict:
    """One hello frame as a dict; ValueError when it is not a small JSON object."""
    (size,) = FRAME.unpack(_read_exact(sock, FRAME.size, deadline))
    if size > HELLO_MAX:
        raise ValueError(f"a frame of {size} bytes (at most {HELLO_MAX})")
    try:
        fields = json.loads(_read_exact(sock, size, deadline))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError("a frame that is not JSON") from None
    if not isinstance(fields, dict):
        raise ValueError("a frame that is not a JSON object")
    return fields


def _hello_fields(fields: dict) -> tuple[str, str, int | None]:
    """(channel, role, capacity) of a hello; ValueError when one is missing or malformed.

    An engine's control connection to an instance manager says role ``control`` and no channel.
    """
    channel, role, capacity = fields.get("channel"), fields.get("role"), fields.get("capacity")
    if role == CONTROL:
        return "", CONTROL, None
    if not isinstance(channel, str) or not 0 < len(channel) <= 256:
        raise ValueError(f"channel {channel!r}: expected a string of 1-256 characters")
    if role not in ROLES:
        raise ValueError(f"role {role!r}: expected one of {ROLES}")
    if role == "producer":
        try:
            check_capacity(capacity)
        except EngineError as e:
            raise ValueError(str(e)) from None
    return channel, role, capacity if role == "producer" else None


@dataclass
class Hello:
    """A connection whose hello carried the right token: the peer's ``role`` on ``channel``.

    ``capacity``: the channel's capacity when the peer is the producer.
    Pass it to the :meth:`attach` of this service's end of ``channel`` (whose
    role is the other one), or to :meth:`Gate.refuse`.
    """

    channel: str
    role: str
    sock: socket.socket
    capacity: int | None
    peer: str


class Gate:
    """The listening side's check of incoming channel connections; one per service, holding its token.

    A service accepts a connection and calls :meth:`accept` with the socket;
    ``refused`` counts the connections it refused.
    """

    def __init__(self, token: str, timeout: float = HELLO_TIMEOUT_S):
        self.token, self.timeout = token, timeout
        self.refused = 0

    def accept(self, sock: socket.socket) -> Hello:
        """Read and check the hello on ``sock`` (at most ``timeout`` s); a :class:`Hello` if it is right.

        A connection without the token, with another token, or whose hello is
        malformed or late is answered no, logged, counted and closed:
        AuthError ``UNAUTHENTICATED`` or :class:`ChannelRefused`.
        """
        try:
            peer = "%s:%s" % sock.getpeername()[:2]
        except OSError:
            peer = "?"
        deadline = time.monotonic() + self.timeout
        try:
            fields = read_frame(sock, deadline)
        except (OSError, ValueError) as e:
            self._refuse(sock, peer, f"no valid hello: {e}")
            raise ChannelRefused(f"connection from {peer}: no valid hello ({e})") from None
        if not token_matches(self.token, fields.get("token")):
            reason = "a hello without a token" if fields.get("token") is None else "a hello with a wrong token"
            self._refuse(sock, peer, reason, "unauthenticated")
            raise AuthError(f"connection from {peer}: {reason}")
        try:
            channel, role, capacity = _hello_fields(fields)
        except ValueError as e:
            self._refuse(sock, peer, f"a malformed hello: {e}")
            raise ChannelRefused(f"connection from {peer}: a malformed hello ({e})") from None
        return Hello(channel, role, sock, capacity, peer)

    def refuse(self, hello: Hello, reason: str) -> None:
        """Answer no to a verified hello (e.g. no such channel here), log it, count it, close the connection."""
        self._refuse(hello.sock, hello.peer, f"channel {hello.channel!r} ({hello.role}): {reason}")

    def _refuse(self, sock: socket.socket, peer: str, reason: str, answer: str | None = None) -> None:
        self.refused += 1
        say_no(sock, peer, reason, answer)


def say_no(sock: socket.socket, peer: str, reason: str, answer: str | None = None) -> None:
    """Log a refused connection, tell the peer (``answer``, else ``reason``) and close it."""
    log.warning("refused a channel connection from %s: %s", peer, reason)
    try:
        send_frame(sock, {"ok": False, "error": answer or reason}, time.monotonic() + 1.0)
    except OSError:
        pass
    sock.close()
