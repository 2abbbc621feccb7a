"""The instance manager (UPM-CEP §4.1.2) as a service: ``sparkcep worker``.

One single-threaded process, pinned to its CPUs, that listens on an address
(loopback unless told otherwise) and runs the sub-query instances engines
deploy to it. ``Engine.local(workers=N)`` starts N of them; the Spark
executor plugin starts them with each executor; anyone may start one by
hand on any host::

    sparkcep worker --listen 127.0.0.2:7001 --cpus 1 --name im-a --token-file ~/.sparkcep/cluster.token

Every connection starts with a hello carrying the token (checked before
anything else is read; a connection without it is refused and logged): an
engine's *control* connection (:mod:`sparkcep.runtime.commands`: deploy,
start, undeploy, metrics, stop) or a peer's *channel* connection (a network
channel end, :mod:`sparkcep.runtime.channels`). The loop runs every hosted
instance over its input channels, flushes what outputs could not take, and
handles connections; when nothing moves it spins a moment, then sleeps on
its doorbell and sockets until a peer wakes it. An engine's deployments go
when its command connection closes; with ``--once`` the process then exits
(that is how an engine's own workers end with it).
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import json
import logging
import os
import pickle
import select
import shutil
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass, field

import psutil

from sparkcep import auth
from sparkcep.arguments import host_port
from sparkcep.errors import EngineError, OperatorError
from sparkcep.query.planner import plan
from sparkcep.runtime import commands as cmd
from sparkcep.runtime.channels import ChannelClosed, Doorbell, hello, tcp
from sparkcep.runtime.handoff import Handoffs
from sparkcep.runtime.layout import Endpoint, Layout
from sparkcep.runtime.metrics import EpochClock
from sparkcep.runtime.process import GCPauses, keep_freed_memory, shared_dir
from sparkcep.runtime.topology import Topology, pin, prefer_node
from sparkcep.runtime.warmup import heartbeat, warm_up
from sparkcep.runtime.wiring import ChannelEnds, host_key, host_runners

log = logging.getLogger("sparkcep")

SPIN_S = 100e-6     # busy-poll this long after the last message before sleeping
SLEEP_S = 0.2       # longest sleep: bounds a missed wake-up
CONTROL_EVERY = 32  # loop turns between looks at the connections while busy
LOOK_EVERY_S = 0.05  # and at most this long: a saturated one still answers its engine (metrics, commands)
HELLO_TIMEOUT_S = 5.0  # a new connection must say hello within this long


@dataclass
class Hosted:
    """The part of one deployment this instance manager runs."""

    link: "Link"
    spec: cmd.DeploySpec
    layout: Layout
    mine: list[Endpoint]
    ends: ChannelEnds
    runners: list = field(default_factory=list)
    failed: bool = False


@dataclass
class Link:
    """An engine's command connection, and the state its deployments hand over to this process."""

    sock: socket.socket
    reader: cmd.RecordReader
    peer: str
    arrived: dict = field(default_factory=dict)  # ticket -> state, shared by the link's deployments


class InstanceManager:
    """The service: a listening socket, engines' command connections, hosted deployments."""

    def __init__(self, name: str, server: socket.socket, token: str, once: bool = False,
                 node: int | None = None):
        self.name, self.server, self.token, self.once, self.node = name, server, token, once, node
        self.server.setblocking(False)
        host, port = server.getsockname()[:2]
        self.address = f"{host}:{port}"
        self.shm_dir = shared_dir("im-")
        self.bell = Doorbell.create(os.path.join(self.shm_dir, "bell"))
        self.links: dict[socket.socket, Link] = {}
        self.greeting: dict[socket.socket, float] = {}  # accepted, hello not read yet -> deadline
        self.hosted: dict[tuple[int, str], Hosted] = {}  # (id of the link, deployment id) -> part
        self.gate = tcp.Gate(token)  # checks every hello; counts the refused
        self.stopping = False
        self.busy_ns = 0  # wall time spent in turns that did work: the balancer's measure of load
        self.bytes_gone = [0, 0]  # bytes in and out of the channels of deployments undeployed here
        self.process = psutil.Process()
        self.gc_pauses = GCPauses()
        gc.callbacks.append(self.gc_pauses)

    def info(self) -> cmd.IMInfo:
        return cmd.IMInfo(self.name, self.address, host_key(self.address.rpartition(":")[0]), os.getpid(),
                          sorted(os.sched_getaffinity(0)), self.node, self.shm_dir)

    # --- the loop ----------------------------------------------------------------------
    def loop(self) -> None:
        turns, idle_since, looked = 0, None, time.perf_counter()
        while not self.stopping:
            work, t0 = 0, time.perf_counter_ns()
            for h in list(self.hosted.values()):
                if not h.failed:
                    work += self._step(h)
            turns += 1
            if work:
                self.busy_ns += time.perf_counter_ns() - t0
                idle_since = None
                if turns % CONTROL_EVERY == 0 or time.perf_counter() - looked > LOOK_EVERY_S:
                    self._io(0)
                    looked = time.perf_counter()
                continue
            now = time.perf_counter()
            if idle_since is None:
                idle_since = now
                self._io(0)
            elif now - idle_since > SPIN_S:
                self._sleep()
                idle_since = None

    def _step(self, h: Hosted) -> int:
        work, current = 0, None
        try:
            for current in h.runners:
                if current.router.backlog_bytes:
                    current.router.flush()
                if current.ready:
                    work += current.poll()
        except Exception as e:  # an operator failed or a peer died: report it, stop running this deployment
            h.failed = True
            where = f"instance manager {self.name} (pid {os.getpid()}): {current.name if current else '?'}"
            if isinstance(e, (OperatorError, ChannelClosed)):
                self._tell(h.link, cmd.Failed(h.spec.id, f"{where}: {e}", e.code))
            else:
                self._tell(h.link, cmd.Failed(h.spec.id, f"{where} failed: {type(e).__name__}: {e}\n"
                                                         f"{traceback.format_exc()}", "INSTANCE_FAILED"))
        return work

    def _sleep(self) -> None:
        live = [h for h in self.hosted.values() if not h.failed]
        consumers = [end for h in live for r in h.runners if not r.importing for end in r.channels]  # those read
        producers = [end for h in live for end in h.ends.outputs.values() if end.backlog_bytes]
        for end in consumers + producers:
            end.sleep_flag(True)
        try:
            if any(end.ready() for end in consumers) or any(end.flush() for end in producers):
                return
            fds = {self.bell.fileno()}
            for end in consumers + producers:
                fd = end.fileno()
                if fd is not None:
                    fds.add(fd)
            ready, _, _ = select.select([*fds, self.server, *self.links, *self.greeting], [], [], SLEEP_S)
            if self.bell.fileno() in ready:
                self.bell.drain()
        finally:
            for end in consumers + producers:
                end.sleep_flag(False)
        self._serve(ready)  # the connections that woke it, without a select of their own

    # --- connections -------------------------------------------------------------------
    def _io(self, timeout: float) -> None:
        try:
            ready, _, _ = select.select([self.server, *self.links, *self.greeting], [], [], timeout)
        except (OSError, ValueError):
            ready = []
        self._serve(ready)

    def _serve(self, ready: list) -> None:
        """Accept, greet or read the connections among ``ready``; drop greetings that took too long."""
        for s in ready:
            if s is self.server:
                self._accept()
            elif s in self.greeting:
                self._greet(s)
            elif s in self.links:
                self._records(self.links[s])
        now = time.monotonic()
        for s, deadline in list(self.greeting.items()):
            if now > deadline:
                self._stale(s)

    def _accept(self) -> None:
        while True:
            try:
                s, _ = self.server.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.greeting[s] = time.monotonic() + HELLO_TIMEOUT_S

    def _greet(self, s: socket.socket) -> None:
        """Read the hello of a new connection and hand it on: a command connection or a channel end."""
        del self.greeting[s]
        try:
            greeting = self.gate.accept(s)  # refuses, logs and counts a connection without the token
        except EngineError:
            return
        if greeting.role == hello.COMMAND:
            try:
                hello.send_frame(s, {"ok": True, "info": vars(self.info())}, time.monotonic() + HELLO_TIMEOUT_S)
            except OSError:  # the engine went between its hello and our answer (it was stopped)
                s.close()
                return
            s.setblocking(True)
            s.settimeout(None)
            self.links[s] = Link(s, cmd.RecordReader(s), greeting.peer)
            return
        end = next((h.ends.waiting.pop(greeting.channel) for h in self.hosted.values()
                    if greeting.channel in h.ends.waiting), None)
        if end is None:
            self.gate.refuse(greeting, "no such channel here")
            return
        try:
            end.attach(greeting)
        except EngineError as e:
            log.warning("instance manager %s: channel %s: %s", self.name, greeting.channel, e)

    def _stale(self, s: socket.socket) -> None:
        """A connection that said nothing within HELLO_TIMEOUT_S."""
        del self.greeting[s]
        self.gate.refused += 1
        hello.say_no(s, _peer(s), "no hello in time")

    def _records(self, link: Link) -> None:
        try:
            records = link.reader.read()
        except EngineError:
            self._drop(link)
            return
        for record in records:
            self._handle(link, record)

    def _drop(self, link: Link) -> None:
        """The engine closed its command connection (or died): its deployments go."""
        del self.links[link.sock]
        link.sock.close()
        for key in [k for k, h in self.hosted.items() if h.link is link]:
            self._undeploy(link, key[1])
        if self.once:
            self.stopping = True

    def _handle(self, link: Link, record) -> None:
        try:
            if isinstance(record, cmd.Deploy):
                value = self._deploy(link, record.spec)
            elif isinstance(record, cmd.Start):
                value = self._start(link, record.deployment, record.addresses)
            elif isinstance(record, cmd.Undeploy):
                value = self._undeploy(link, record.deployment)
            elif isinstance(record, cmd.Metrics):
                value = self.snapshot(link)
            elif isinstance(record, cmd.Handoff):  # state for an instance here, relayed by the engine
                link.arrived[record.ticket] = record.blob
                return
            elif isinstance(record, cmd.Stop):
                self.stopping, value = True, None
            else:
                raise EngineError(f"unknown command {type(record).__name__}", "COMMAND")
            self._tell(link, cmd.Reply(record.number, value))
        except Exception as e:
            code = e.code if isinstance(e, EngineError) else "INSTANCE_MANAGER"
            self._tell(link, cmd.Refused(getattr(record, "number", -1),
                                         f"instance manager {self.name}: {type(e).__name__}: {e}", code))

    def _tell(self, link: Link, record) -> None:
        try:
            cmd.send_record(link.sock, record)
        except OSError:
            pass  # the link is gone: _records notices and drops it

    # --- deployments -------------------------------------------------------------------
    def _deploy(self, link: Link, spec: cmd.DeploySpec) -> dict:
        """Create the hosted instances' first channel ends; returns the addresses of the rings made here."""
        layout = Layout(plan(pickle.loads(spec.query)), spec.parallelism)
        mine = [ep for ep in layout.instances() if spec.assignment[ep] == self.name]
        ends = ChannelEnds(spec.id, spec.channels, set(mine), self.shm_dir, self.bell, self.bell, self.token,
                           spec.ring_bytes, copy_of=lambda c: layout.sq[c[0]].head.stateful or not spec.zero_copy)
        self.hosted[(id(link), spec.id)] = Hosted(link, spec, layout, mine, ends)
        try:
            return ends.open_first()
        except BaseException:
            self._undeploy(link, spec.id)
            raise

    def _start(self, link: Link, dep: str, addresses: dict) -> dict:
        """Open the other ends (ring producers, connections to listening peers); build the instances."""
        h = self.hosted[(id(link), dep)]
        h.ends.open_rest(addresses)
        handoffs = Handoffs(self.name, forward=lambda ticket, host, blob: self._tell(
                                link, cmd.Handoff(dep, ticket, host, blob)),
                            report=lambda ticket, nbytes: self._tell(link, cmd.Installed(ticket, nbytes)))
        handoffs.arrived = link.arrived
        h.runners = host_runners(h.layout, h.spec.bins, h.spec.owners, h.mine, h.ends.inputs, h.ends.outputs,
                                 EpochClock(), handoffs)
        return {"instances": [r.name for r in h.runners], "pid": os.getpid()}

    def _undeploy(self, link: Link, dep: str) -> None:
        h = self.hosted.pop((id(link), dep), None)
        if h is not None:
            self.bytes_gone[0] += _bytes_in(h.ends)
            self.bytes_gone[1] += _bytes_out(h.ends)
            h.runners.clear()
            h.ends.close()

    def snapshot(self, link: Link) -> dict:
        """Counters of the link's hosted instances, plus this process's bytes in/out, CPU, memory, GC pauses."""
        deps = {}
        bytes_in, bytes_out = self.bytes_gone
        for (owner, dep_id), h in self.hosted.items():
            if owner == id(link):
                deps[dep_id] = {r.endpoint: {**r.counters.snapshot(), "queue": r.queued(), "late": r.late()}
                                for r in h.runners}
            bytes_in += _bytes_in(h.ends)
            bytes_out += _bytes_out(h.ends)
        mem = self.process.memory_info()
        cpu = self.process.cpu_times()
        return {"deployments": deps, "bytes_in": bytes_in, "bytes_out": bytes_out,
                "cpu_s": cpu.user + cpu.system, "rss": mem.rss, "cpu_num": self.process.cpu_num(),
                "pid": os.getpid(), "time": time.monotonic(), "busy_ns": self.busy_ns, "gc": self.gc_pauses.snapshot(),
                "refused_connections": self.gate.refused}

    def close(self) -> None:
        for link in list(self.links.values()):
            self._drop(link)
        for s in list(self.greeting):
            s.close()
        self.server.close()
        self.bell.close()
        shutil.rmtree(self.shm_dir, ignore_errors=True)


def _peer(s: socket.socket) -> str:
    try:
        host, port = s.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "?"


def _listen(spec: str) -> socket.socket:
    return socket.create_server(host_port(spec, "OPTION"))


def _bytes_in(ends) -> int:
    return sum(getattr(end, "bytes_in", 0) for end in ends.inputs.values())


def _bytes_out(ends) -> int:
    return sum(getattr(end, "bytes_out", 0) for end in ends.outputs.values())


def _cpus(text: str) -> list[int]:
    """``--cpus``: a non-empty CPU list (:func:`~sparkcep.runtime.topology.parse_cpulist`)."""
    from sparkcep.runtime.topology import parse_cpulist
    try:
        cpus = parse_cpulist(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not cpus:
        raise argparse.ArgumentTypeError(f"expected at least one CPU, got {text!r}")
    return cpus


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT",
                        help="address to serve on (default 127.0.0.1:0: loopback, any free port); "
                             "an address beyond loopback is reachable from other hosts")
    parser.add_argument("--cpus", default=None, type=_cpus,
                        help="CPUs to pin to, e.g. 3 or 2-3 (default: all allowed)")
    parser.add_argument("--name", default=None, help="its name in the engine (default: worker-HOST-PORT)")
    parser.add_argument("--token-file", required=True, help="file holding the token every connection must present")
    parser.add_argument("--topology", default=None, help="NUMA topology file (default: this machine's sysfs)")
    parser.add_argument("--once", action="store_true",
                        help="exit when the first engine's command connection closes")
    parser.add_argument("--zk", default=None, metavar="HOST:PORT/PATH",
                        help="join this cluster's registry as a member (its engine host then deploys here)")


def run(args) -> int:
    """Body of ``sparkcep worker``: pin, warm up, listen, print a READY line, serve until stopped."""
    # SIGTERM stops it, and Ctrl-C unless whoever started it ignores Ctrl-C for it (die_with_parent: the engine
    # or the Spark launcher that started it stops it; a KeyboardInterrupt of theirs must not)
    ignores_ctrl_c = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    stopping = (signal.SIGTERM,) if ignores_ctrl_c else (signal.SIGTERM, signal.SIGINT)
    faulthandler.register(signal.SIGUSR1, all_threads=False)  # kill -USR1 <pid>: where is it stuck?
    stop = []
    for sig in stopping:
        signal.signal(sig, lambda *_: stop.append(1))
    try:
        token = auth.read(args.token_file)
        if args.cpus:
            pin(args.cpus)
        cpus = sorted(os.sched_getaffinity(0))
        node = Topology.load(args.topology).node_of(cpus[0])
        prefer_node(node)
        keep_freed_memory()
        server = _listen(args.listen)  # a bad or taken address is said at once, not after the warm-up (74 s cold)
        host, port = server.getsockname()[:2]
        with heartbeat(lambda text: print(f"STARTING {text}", flush=True)) as progress:
            warm_up(progress)  # compiles or loads numba's cache before the first batch
        # numba, pyarrow and numpy leave ~150K long-lived objects; a full collection scanning them
        # stops this process for ~100 ms. Frozen, they are never scanned (a deployment adds hundreds).
        gc.freeze()
        im = InstanceManager(args.name or f"worker-{host}-{port}", server, token, once=args.once, node=node)
    except (EngineError, OSError, ValueError) as e:
        print(f"FAILED {e}", flush=True)  # an engine that started us reads it instead of READY
        print(f"sparkcep worker: {e}", file=sys.stderr, flush=True)
        return 1
    im.stopping = bool(stop)  # told to stop since the warm-up

    def halt(*_):
        im.stopping = True
    for sig in stopping:
        signal.signal(sig, halt)
    member = None
    if args.zk and not im.stopping:
        print(f"STARTING joining the cluster at {args.zk}", flush=True)
        for sig in stopping:  # the join may wait long: for an unreachable registry, a dead predecessor's session
            signal.signal(sig, _stop_joining)
        try:
            member = join(args.zk, im, token)
        except StopJoining:
            im.stopping = True
        except EngineError as e:
            print(f"sparkcep worker: {e} [{e.code}]", file=sys.stderr, flush=True)
            im.close()
            return 1
        finally:
            for sig in stopping:
                signal.signal(sig, halt)
    if not im.stopping:
        print("READY " + json.dumps(vars(im.info())), flush=True)
    try:
        im.loop()
    finally:
        if member is not None:
            member.close()
        im.close()
    return 0


class StopJoining(BaseException):
    """SIGTERM or SIGINT while the worker joins its cluster: raised wherever the join waits, it ends there
    (a BaseException: no ``except Exception`` on the way takes it for a failure)."""


def _stop_joining(signum, frame):
    raise StopJoining()


def join(zk: str, im: InstanceManager, token: str):
    """Make ``im`` a member of the cluster whose registry is at ``zk`` (``HOST:PORT/PATH``), holding its
    ``token`` (only token holders write in the registry)."""
    from sparkcep.control.member import Membership
    from sparkcep.control.registry import open_registry
    info = vars(im.info())
    info = {k: info[k] for k in ("name", "address", "host", "pid", "cpus", "node")}
    registry = open_registry(zk if zk.startswith("zk://") else f"zk://{zk}", token=token, session_timeout=2.0)
    try:
        return Membership(registry, im.name, info, say=lambda text: print(f"STARTING {text}", flush=True))
    except BaseException:  # refused, or stopped while it waits
        registry.close()
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sparkcep worker", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
