"""The handshake that opens every connection to a service of the engine: channels and command connections.

A channel address ``tcp:HOST:PORT/CHANNEL_ID`` names a service (an instance
manager) listening on HOST:PORT and one of its channels. The handshake is
three JSON frames (a u32 length, then at most ``HELLO_MAX`` bytes), and the
token never travels in it, so a peer that does not hold it learns nothing:

1. the connecting side says who it is: ``{"channel", "role", "capacity",
   "nonce"}`` — its role (``producer``, ``consumer``, or ``control`` for an
   engine's command connection, which has no channel), the capacity when it is the
   producer, and a fresh random nonce;
2. the service proves it holds the token: ``{"nonce", "proof"}``, an HMAC
   of both nonces under the token;
3. the connecting side checks that proof and proves the same with its own
   HMAC (another label, so a proof cannot be reflected).

The service's :class:`Gate` reads and checks it within a timeout; a
connection without a valid proof, or with a malformed or late hello, is
answered ``{"ok": false, "error"}``, logged, counted and closed, and the
connecting side of a service without the token gets AuthError too. A
verified channel :class:`Hello` goes to the end the service created for the
channel, which answers ``{"ok": true, "capacity"}``
(:meth:`sparkcep.runtime.channels.tcp.TcpProducer.attach`); an instance
manager answers a command connection with its description. Nothing here is
unpickled: frames are JSON, and nothing is unpickled from a peer before
both proofs passed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import socket
import struct
import threading
import time
from dataclasses import dataclass

from sparkcep.auth import AuthError
from sparkcep.errors import EngineError

log = logging.getLogger(__name__)

ROLES = ("producer", "consumer")
COMMAND = "command"  # the role of an engine's command connection to an instance manager
CLIENT = "client"  # the role of a client of an engine's endpoint (sparkcep.gateway)
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
    if kind != "tcp" or not slash or not channel or not host or not port.isdecimal() or not 0 < int(port) < 65536:
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

    An engine's command connection to an instance manager (role ``command``) and a client of an
    engine's endpoint (role ``client``) name no channel.
    """
    channel, role, capacity = fields.get("channel"), fields.get("role"), fields.get("capacity")
    if role in (COMMAND, CLIENT):
        return "", role, None
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


def _proof(token: str, side: str, first: str, second: str) -> str:
    return hmac.new(token.encode(), f"{side}|{first}|{second}".encode(), hashlib.sha256).hexdigest()


def _proves(proof, token: str, side: str, first, second) -> bool:
    return (isinstance(proof, str) and isinstance(first, str) and isinstance(second, str)
            and hmac.compare_digest(proof, _proof(token, side, first, second)))


def greet(sock: socket.socket, fields: dict, token: str, deadline: float, peer: str) -> dict:
    """The connecting side of the handshake: say ``fields``, check the service's proof, give ours.

    Returns the service's answer (``{"ok": true, ...}`` or a refusal); AuthError
    when the service does not prove it holds ``token``.
    """
    nonce = secrets.token_hex(16)
    send_frame(sock, {**fields, "nonce": nonce}, deadline)
    challenge = read_frame(sock, deadline)
    if challenge.get("ok") is False:
        return challenge
    if not _proves(challenge.get("proof"), token, "service", nonce, challenge.get("nonce")):
        raise AuthError(f"{peer} and this side hold different tokens: {peer} proved a token other than the one "
                        "given here; check the token (token=, token_file=, --token-file) this side was given")
    send_frame(sock, {"proof": _proof(token, "client", challenge["nonce"], nonce)}, deadline)
    return read_frame(sock, deadline)


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
        self._logged: set[str] = set()  # peer hosts whose refusals were logged (later ones are only counted)
        self._lock = threading.Lock()  # an endpoint checks its connections on threads of their own

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
        try:
            channel, role, capacity = _hello_fields(fields)
            theirs = fields.get("nonce")
            if not isinstance(theirs, str) or not 16 <= len(theirs) <= 64:
                raise ValueError("no nonce")
        except ValueError as e:
            self._refuse(sock, peer, f"a malformed hello: {e}")
            raise ChannelRefused(f"connection from {peer}: a malformed hello ({e})") from None
        ours = secrets.token_hex(16)
        try:
            send_frame(sock, {"nonce": ours, "proof": _proof(self.token, "service", theirs, ours)}, deadline)
            answer = read_frame(sock, deadline)
        except (OSError, ValueError) as e:
            self._refuse(sock, peer, f"no proof of the token: {e}", "unauthenticated")
            raise AuthError(f"connection from {peer}: no proof of the token") from None
        if not _proves(answer.get("proof"), self.token, "client", ours, theirs):
            self._refuse(sock, peer, "a wrong proof of the token", "unauthenticated")
            raise AuthError(f"connection from {peer}: a wrong proof of the token")
        return Hello(channel, role, sock, capacity, peer)

    def refuse(self, hello: Hello, reason: str) -> None:
        """Answer no to a verified hello (e.g. no such channel here), log it, count it, close the connection."""
        self._refuse(hello.sock, hello.peer, f"channel {hello.channel!r} ({hello.role}): {reason}")

    def _refuse(self, sock: socket.socket, peer: str, reason: str, answer: str | None = None) -> None:
        host = peer.rpartition(":")[0] or peer
        with self._lock:
            self.refused += 1
            quiet = host in self._logged
            self._logged.add(host)
        say_no(sock, peer, reason, answer, quiet=quiet)


def say_no(sock: socket.socket, peer: str, reason: str, answer: str | None = None, quiet: bool = False) -> None:
    """Log a refused connection (unless ``quiet``: its host's first refusal was), tell the peer (``answer``,
    else ``reason``) and close it."""
    if not quiet:
        log.warning("refused a connection from %s: %s (further refusals from its host are only counted)", peer,
                    reason)
    try:
        send_frame(sock, {"ok": False, "error": answer or reason}, time.monotonic() + 1.0)
    except OSError:
        pass
    sock.close()
