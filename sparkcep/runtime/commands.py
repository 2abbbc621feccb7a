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
are ``record length u32 | payload length u64 | pickled record | payload``
(the state of a handoff, never unpickled on the way), with size limits.
"""

from __future__ import annotations

import dataclasses
import pickle
import socket
import struct
from dataclasses import dataclass, field

import cloudpickle  # user functions defined in __main__ or as lambdas

from sparkcep.errors import EngineError
from sparkcep.runtime.layout import Endpoint
from sparkcep.runtime.wiring import ChannelPlan

FRAME = struct.Struct("<IQ")  # the pickled record's length, its payload's length
RECORD_LIMIT = 256 << 20  # bytes of a command (a query with large user functions fits)
PAYLOAD_LIMIT = 1 << 36  # bytes of the state a handoff carries



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
    (:mod:`sparkcep.runtime.handoff`): pickled by its sender, it travels after the record as the frame's
    payload, and the engine passes it on unread."""

    deployment: str
    ticket: str
    host: str
    blob: bytes | bytearray | None = None


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
    """Send one record (blocking); a :class:`Handoff`'s state follows it as the frame's payload, unpickled."""
    payload = b""
    if isinstance(record, Handoff):
        payload, record = record.blob, dataclasses.replace(record, blob=None)
    body = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(FRAME.pack(len(body), len(payload)) + body)
    if payload:
        sock.sendall(payload)


class RecordReader:
    """Records from a socket, as they arrive: each call takes what is there now without waiting (an
    instance manager and the engine read each other so). A payload is read straight into a buffer of
    its size, however many calls that takes."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buf = sock, bytearray()
        self._record = None  # a record whose payload is being read
        self._payload: bytearray | None = None
        self._got = 0

    def read(self) -> list:
        """Every whole record available now; CommandError when the peer closed or broke the framing."""
        out = []
        if self._payload is not None:
            if not self._fill():
                return out
            out.append(self._finish())
        chunk = self._recv()
        if chunk:
            self.buf += chunk
        while len(self.buf) >= FRAME.size:
            size, payload = FRAME.unpack_from(self.buf)
            if size > RECORD_LIMIT or payload > PAYLOAD_LIMIT:
                raise CommandError(f"a command of {size} bytes with a payload of {payload} exceeds the limits "
                                   f"({RECORD_LIMIT}, {PAYLOAD_LIMIT})")
            if len(self.buf) < FRAME.size + size:
                break
            record = pickle.loads(bytes(self.buf[FRAME.size:FRAME.size + size]))
            del self.buf[:FRAME.size + size]
            if not payload:
                out.append(record)
                continue
            self._record, self._payload = record, bytearray(payload)
            self._got = min(payload, len(self.buf))
            self._payload[:self._got] = self.buf[:self._got]
            del self.buf[:self._got]
            if not self._fill():
                break
            out.append(self._finish())
        return out

    def _recv(self) -> bytes | None:
        try:
            chunk = self.sock.recv(1 << 20, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as e:
            raise CommandError(f"the command connection broke: {e}") from None
        if chunk == b"":
            raise CommandError("the peer closed the command connection")
        return chunk

    def _fill(self) -> bool:
        """Read what the socket holds of the payload under way, without waiting; True once it is whole."""
        view = memoryview(self._payload)
        while self._got < len(view):
            try:
                n = self.sock.recv_into(view[self._got:], len(view) - self._got, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError as e:
                raise CommandError(f"the command connection broke: {e}") from None
            if n == 0:
                raise CommandError("the peer closed the command connection in the middle of a payload")
            self._got += n
        return True

    def _finish(self):
        """The record whose payload is whole, carrying it."""
        record = self._record
        record.blob = self._payload
        self._record, self._payload = None, None
        return record
