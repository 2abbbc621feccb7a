"""The command connection between an engine and an instance manager: a hello, then typed records.

The engine connects to the instance manager's address and sends a *hello*
(:mod:`sparkcep.runtime.channels.hello`: a JSON frame with the token and the
role ``control``); the instance manager checks the token and answers with
its description (:class:`IMInfo`) or refuses, logs and closes. Only after that does either side unpickle anything:
the records that follow are pickled dataclasses (a :class:`Deploy` carries
the query, whose user functions need cloudpickle). Each request has a
``number``; the instance manager answers it with :class:`Reply` or
:class:`Refused`, and reports on its own a deployment that failed
(:class:`Failed`), hands state over between instances (:class:`Handoff`, relayed
by the engine) and says when it installed some (:class:`Installed`). Frames
are ``length u32 | body``, with size limits.
"""

from __future__ import annotations

import pickle
import socket
import struct
from dataclasses import dataclass, field

import cloudpickle  # user functions defined in __main__ or as lambdas

from sparkcep.errors import EngineError
from sparkcep.runtime.layout import Endpoint
from sparkcep.runtime.wiring import ChannelPlan

FRAME = struct.Struct("<I")
RECORD_LIMIT = 256 << 20  # bytes of a control record (a query with large user functions fits)



class CommandError(EngineError):
    """The command connection broke, or a peer sent something that is not a control record."""

    code = "COMMAND"


@dataclass
class IMInfo:
    """What an instance manager says of itself in its answer to a hello."""

    name: str
    address: str  # host:port it listens on
    host: str  # host key: processes with the same one share memory (see wiring.host_key)
    pid: int
    cpus: list[int]
    node: int | None
    shm_dir: str


@dataclass
class DeploySpec:
    """One deployment as an instance manager gets it: picklable names and numbers only."""

    id: str
    query: bytes  # the Query, pickled (cloudpickle)
    parallelism: dict[str, int]
    bins: int
    owners: dict[str, list[int]]  # the current bin table of every route-key operator
    assignment: dict[Endpoint, str]  # instance -> name of the instance manager running it
    channels: dict[tuple[Endpoint, Endpoint], ChannelPlan]  # those touching this instance manager
    ring_bytes: int  # capacity of the rings it creates
    zero_copy: bool = True


@dataclass
class Deploy:
    """Create the instances of ``spec`` hosted here and open the channel ends that come first;
    the reply is the addresses of the rings created ({(producer, consumer): address})."""

    number: int
    spec: DeploySpec


@dataclass
class Start:
    """Open the remaining channel ends of ``deployment`` (``addresses`` of the rings others created)."""

    number: int
    deployment: str
    addresses: dict[tuple[Endpoint, Endpoint], str] = field(default_factory=dict)


@dataclass
class Undeploy:
    number: int
    deployment: str


@dataclass
class Metrics:
    """Ask for the counters of every hosted instance and of the process."""

    number: int


@dataclass
class Stop:
    number: int


@dataclass
class Reply:
    number: int
    value: object = None


@dataclass
class Refused:
    number: int
    message: str
    code: str


@dataclass
class Handoff:
    """State an instance of generation ``deployment`` hands to the process ``host`` under ``ticket``
    (:mod:`sparkcep.runtime.handoff`): pickled, sent to the engine, which passes it on unread."""

    deployment: str
    ticket: str
    host: str
    blob: bytes


@dataclass
class Installed:
    """The state handed over under ``ticket`` (``nbytes`` of it) is installed."""

    ticket: str
    nbytes: int


@dataclass
class Failed:
    """A hosted part of ``deployment`` failed (an operator raised, a channel's peer died)."""

    deployment: str
    message: str
    code: str


def pickled(query) -> bytes:
    """The query as a Deploy carries it; EngineError PICKLE when a user function cannot be sent."""
    try:
        return cloudpickle.dumps(query)
    except Exception as e:
        raise EngineError(f"query {query.name!r} cannot be sent to the instance managers: {e}; "
                          "functions given to apply()/stateful() must be picklable", "PICKLE") from None


def send_record(sock: socket.socket, record) -> None:
    """Send one record (blocking)."""
    body = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(FRAME.pack(len(body)) + body)


def recv_record(sock: socket.socket):
    """One record (blocking) from an authenticated peer."""
    return pickle.loads(_recv_frame(sock, RECORD_LIMIT))


def _recv_frame(sock: socket.socket, limit: int) -> bytes:
    (size,) = FRAME.unpack(_recv_exact(sock, FRAME.size))
    if size > limit:
        raise CommandError(f"a frame of {size} bytes exceeds the limit of {limit}")
    return _recv_exact(sock, size)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise CommandError(f"the connection closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


class RecordReader:
    """Records from a non-blocking socket, as they arrive (an instance manager reads its engines so)."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buf = sock, bytearray()

    def read(self) -> list:
        """Every whole record available now; CommandError when the peer closed."""
        try:
            chunk = self.sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            chunk = None
        except OSError as e:
            raise CommandError(f"the command connection broke: {e}") from None
        if chunk == b"":
            raise CommandError("the engine closed the command connection")
        if chunk:
            self.buf += chunk
        out = []
        while len(self.buf) >= FRAME.size:
            (size,) = FRAME.unpack_from(self.buf)
            if size > RECORD_LIMIT:
                raise CommandError(f"a control record of {size} bytes exceeds the limit of {RECORD_LIMIT}")
            if len(self.buf) < FRAME.size + size:
                break
            out.append(pickle.loads(bytes(self.buf[FRAME.size:FRAME.size + size])))
            del self.buf[:FRAME.size + size]
        return out
