"""The engine's instance managers — started with it or already serving at an address.

:class:`Cluster` starts ``workers`` instance managers as ``sparkcep worker``
processes pinned to this machine's cores (:func:`~sparkcep.runtime.placement.im_slots`),
connects to those given by address, and keeps one authenticated control
connection to each (:mod:`sparkcep.runtime.commands`). One *collector*
thread reads every deployment's output channels into the output logs,
answers to replies, and notices an instance manager that died (its control
connection closes): every deployment with an instance on it fails with an
:class:`~sparkcep.errors.EngineError` ``WORKER_DIED`` naming it and its
instances; nothing waits forever.
"""

from __future__ import annotations

import logging
import os
import queue
import select
import shutil
import socket
import subprocess
import threading
import time
import traceback
import uuid
import weakref
from dataclasses import dataclass, field

from sparkcep import auth
from sparkcep.errors import EngineError
from sparkcep.runtime import commands as cmd
from sparkcep.runtime.channels import DEFAULT_CAPACITY, Doorbell, RingConsumer, hello
from sparkcep.runtime.handoff import Board
from sparkcep.runtime.placement import Slot, im_slots
from sparkcep.runtime.process import reclaim, shared_dir
from sparkcep.runtime.topology import Topology
from sparkcep.runtime.wiring import host_key
from sparkcep.runtime.template import ForkedWorker, fork_worker
from sparkcep.runtime.worker_start import TELL_EVERY_S, Starting, wait_ready

log = logging.getLogger("sparkcep")

REPLY_TIMEOUT_S = 30.0
METRICS_TIMEOUT_S = 10.0  # an instance manager not answering metrics() within this is reported so
PEER_GRACE_S = 1.0         # a channel's dead peer waits this long for its instance manager's death to be known
ENGINE_HOST = "127.0.0.1"  # the engine's own host key is that of a process serving on loopback


@dataclass
class InstanceManagerLink:
    """The engine's handle on one instance manager."""

    index: int
    info: cmd.IMInfo
    sock: socket.socket
    slot: Slot
    process: ForkedWorker | None = None  # when this engine started it
    standby: bool = False  # kept free to rebuild lost replicas
    reader: cmd.RecordReader = field(init=False)
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    dead: str | None = None

    def __post_init__(self):
        self.reader = cmd.RecordReader(self.sock)

    @property
    def name(self) -> str:
        return self.info.name

    def describe(self) -> str:
        return (f"instance manager {self.name} ({self.info.address}, pid {self.info.pid}, cpu {self.slot.cpu}, "
                f"node {self.slot.node})")


class Cluster:
    """The instance managers of one engine, and the plumbing to them."""

    def __init__(self, token: str, topology=None, ring_bytes: int = DEFAULT_CAPACITY):
        self.token, self.ring_bytes = token, ring_bytes
        self.machine = Topology.load(topology)
        self.host = host_key(ENGINE_HOST)
        self.tag = uuid.uuid4().hex[:6]  # names this engine's generations on the instance managers
        self.dir = shared_dir("")
        weakref.finalize(self, shutil.rmtree, self.dir, True)  # even if close() is never called
        self.token_file = str(auth.write(_path(self.dir, "token"), token))
        self.send_bell = Doorbell.create(os.path.join(self.dir, "engine-send"))
        self.sink_bell = Doorbell.create(os.path.join(self.dir, "engine-sink"))
        self.ims: list[InstanceManagerLink] = []
        self.asked = False  # the user asked for instance managers (workers=N, given addresses)
        self.deployments: dict = {}  # id -> RemoteDeployment (sparkcep.runtime.remote)
        self.wires: dict = {}  # id of a generation on the instance managers -> its RemoteDeployment
        self.board = Board()  # handoffs the instance managers installed
        self.lock = threading.RLock()
        self.progress = threading.Condition(self.lock)  # notified when outputs arrive or an IM dies
        self._replies: dict[int, list] = {}
        # deployment -> (when, a PEER_DIED error, the generation it concerns)
        self._suspects: dict[str, tuple[float, EngineError, object]] = {}
        self._numbers = iter(range(1, 1 << 62))
        self._closed = self._closing = False
        self._relays: queue.SimpleQueue = queue.SimpleQueue()  # (sender, Handoff) to pass on
        self._relayer = threading.Thread(target=self._relay_loop, name="sparkcep-relay", daemon=True)
        self._relayer.start()
        self._thread = threading.Thread(target=self._collect, name="sparkcep-collector", daemon=True)
        self._thread.start()

    # --- instance managers -------------------------------------------------------------
    def spawn(self, n: int, standby: int = 0) -> None:
        """Start ``n`` instance managers on this machine's cores, nearest NUMA nodes first, and
        ``standby`` more kept free to rebuild the instances of lost replicas."""
        self.asked = True
        slots = [Slot(len(self.ims) + s.index, s.cpu, s.node) for s in im_slots(self.machine, n + standby)]
        procs = []
        try:
            for slot in slots:
                procs.append((slot, fork_worker(f"im-{slot.index}", slot.cpu, f"{ENGINE_HOST}:0", self.token_file)))
            infos = wait_ready([Starting(proc, f"instance manager im-{slot.index} (cpu {slot.cpu})")
                                for slot, proc in procs])
            for k, ((slot, proc), info) in enumerate(zip(procs, infos)):
                self._link(info["address"], proc, slot).standby = k >= n
        except BaseException:
            for _, proc in procs:
                if proc.poll() is None:
                    proc.kill()
            raise

    def adopt_all(self, addresses) -> None:
        """Use the instance managers serving at ``addresses``, as the user asked (see :meth:`in_process`)."""
        for address in addresses:
            self.adopt(address)
        self.asked = self.asked or bool(addresses)

    def in_process(self) -> bool:
        """Should a new deployment run in the engine process? Only when no instance manager lives and
        none was asked for (the engine's own ``workers``, given addresses): those registered by Spark
        executors come and go with the session, and the engine runs queries itself meanwhile."""
        if any(im.dead is None for im in self.ims):
            return False
        if not self.asked:
            log.warning("no live instance manager: query deployed in the engine process")
        return not self.asked

    def await_live(self, n: int, timeout: float) -> None:
        """Return once ``n`` live instance managers (standbys aside) serve this engine; EngineError
        ``NOT_ENOUGH_WORKERS`` saying how many did after ``timeout`` seconds (logging what it waits for)."""
        deadline, told = time.monotonic() + timeout, time.monotonic()
        while (live := sum(1 for im in self.ims if im.dead is None and not im.standby)) < n:
            now = time.monotonic()
            if now >= deadline:
                raise EngineError(f"{live} of the {n} instance managers needed serve this engine"
                                  f"{f' after {timeout:.0f} s' if timeout else ''} (start more: sparkcep worker)",
                                  "NOT_ENOUGH_WORKERS")
            if now - told > TELL_EVERY_S:
                told = now
                log.warning("waiting for instance managers to join: %d of %d (%.0f s left)", live, n, deadline - now)
            time.sleep(0.05)

    def adopt(self, address: str) -> InstanceManagerLink:
        """Use the instance manager serving at ``address`` (``host:port``), as a running engine may."""
        return self._link(address, None, None)

    def _link(self, address: str, proc, slot: Slot | None) -> InstanceManagerLink:
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdecimal():
            raise EngineError(f"instance manager address {address!r} is not host:port", "OPTION")
        try:
            sock = socket.create_connection((host, int(port)), timeout=REPLY_TIMEOUT_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            answer = hello.greet(sock, {"role": hello.COMMAND}, self.token, time.monotonic() + REPLY_TIMEOUT_S,
                                 f"the instance manager at {address}")
        except (OSError, ValueError) as e:
            raise EngineError(f"cannot reach the instance manager at {address}: {e}", "WORKER_START") from None
        if not answer.get("ok"):
            sock.close()
            raise EngineError(f"the instance manager at {address} refused this engine: {answer.get('error')} "
                              "(was it started with this engine's token?)", "UNAUTHENTICATED")
        sock.settimeout(None)
        info = cmd.IMInfo(**answer["info"])
        if any(im.name == info.name and im.dead is None for im in self.ims):
            sock.close()
            raise EngineError(f"an instance manager named {info.name!r} is already in use by this engine; "
                              f"start the one at {address} with another --name", "WORKER_NAME")
        index = len(self.ims)
        if slot is None:
            slot = Slot(index, info.cpus[0], info.node or 0)
        im = InstanceManagerLink(index, info, sock, Slot(index, slot.cpu, slot.node), proc)
        with self.lock:
            self.ims.append(im)
        return im

    def slots_and_topology(self, only=None) -> tuple[list[Slot], Topology]:
        """Placement's view: one slot per live instance manager (of ``only``, if given; standbys only
        then), NUMA nodes per host.

        Instance managers of this host keep the machine's nodes and distances;
        each other host is a node group of its own, far from the rest.
        """
        groups: dict[tuple[str, int], int] = {}
        for im in self.ims:
            groups.setdefault((im.info.host, im.slot.node), len(groups))
        nodes = {k: [] for k in range(len(groups))}
        slots = []
        for im in self.ims:
            if im.dead is None and (im.index in only if only is not None else not im.standby):
                g = groups[(im.info.host, im.slot.node)]
                nodes[g].append(im.index)
                slots.append(Slot(im.index, im.index, g))
        keys = list(groups)

        def distance(a, b):
            (ha, na), (hb, nb) = keys[a], keys[b]
            if ha != hb:
                return 40
            known = na in self.machine.nodes and nb in self.machine.nodes and ha == self.host
            return self.machine.distance(na, nb) if known else (10 if na == nb else 20)
        return slots, Topology(nodes, [[distance(a, b) for b in range(len(keys))] for a in range(len(keys))],
                               source="instance managers")

    def load(self) -> dict[int, int]:
        """Instances per instance manager over the live deployments."""
        out = {im.index: 0 for im in self.ims}
        for dep in self.deployments.values():
            for i in dep.assignment.values():
                out[i] += 1
        return out

    def replica_sides(self, k: int) -> list[set[int]]:
        """The live instance managers (standbys aside) cut into ``k`` disjoint sides, one per replica:
        NUMA node by node where there are several (a replica per node), else in halves by index."""
        live = [im for im in self.ims if im.dead is None and not im.standby]
        if len(live) < k:
            raise EngineError(f"{k} replicas need {k} live instance managers on disjoint sides; this engine has "
                              f"{len(live)} (start it with more workers)", "NOT_ENOUGH_WORKERS")
        nodes = sorted({(im.info.host, im.slot.node) for im in live})
        if len(nodes) >= k:
            return [{im.index for im in live if nodes.index((im.info.host, im.slot.node)) % k == r} for r in range(k)]
        return [{im.index for j, im in enumerate(live) if j * k // len(live) == r} for r in range(k)]

    def take_standby(self, avoid: set[int] = frozenset()) -> int | None:
        """A live instance manager to rebuild a lost replica on, in no replica side of ``avoid``, now put to
        use: a standby, else any (a worker that joined since: a cluster's members are no standbys); None
        when there is none."""
        with self.lock:
            free = [im for im in self.ims if im.dead is None and im.index not in avoid]
            im = next((im for im in free if im.standby), None) or next(iter(free), None)
            if im is None:
                return None
            im.standby = False
            return im.index

    def put_to_use(self, index: int) -> None:
        """Instance manager ``index`` runs a replica's instances now: it is no standby any more."""
        with self.lock:
            self.ims[index].standby = False

    def by_name(self, name: str) -> InstanceManagerLink | None:
        """The live instance manager called ``name``."""
        return next((im for im in self.ims if im.name == name and im.dead is None), None)

    def undeploy(self, wire: str, indices) -> None:
        """Drop the part of generation ``wire`` that the live ones of instance managers ``indices`` run."""
        live = [i for i in indices if self.ims[i].dead is None]
        try:
            self.request_all(live, lambda i, number: cmd.Undeploy(number, wire), timeout=5)
        except EngineError:
            pass

    def describe(self) -> list[dict]:
        """Every instance manager: name, address, pid, host, cpu, node and the instances it hosts."""
        hosted: dict[int, list[str]] = {im.index: [] for im in self.ims}
        replica: dict[int, int] = {}
        for dep in self.deployments.values():
            for (sq, i), im in sorted(dep.assignment.items()):
                hosted[im].append(f"{dep.query.name}.{sq}[{i}]")
                if dep.replica is not None:
                    replica.setdefault(im, dep.replica)
        return [{"name": im.name, "address": im.info.address, "pid": im.info.pid,
                 "host": im.info.address.rpartition(":")[0], "cpu": im.slot.cpu, "node": im.slot.node,
                 "alive": im.dead is None, "standby": im.standby, "replica": replica.get(im.index),
                 "instances": hosted[im.index]} for im in self.ims]

    # --- requests ----------------------------------------------------------------------
    def request_all(self, indices, make, timeout: float = REPLY_TIMEOUT_S, partial: bool = False) -> dict:
        """Send ``make(index, number)`` to each instance manager in ``indices`` (all at once); their replies.

        With ``partial``, the replies that came within ``timeout``: an instance manager that is dead, does
        not answer or refuses is left out instead of raising.
        """
        waiting = {}
        try:
            for i in indices:
                number = next(self._numbers)
                try:
                    waiting[i] = self._ask(self.ims[i], make(i, number), number)
                except EngineError:
                    if not partial:
                        raise
            return self._replies_of(waiting, timeout, partial)
        finally:
            with self.lock:
                for number, _ in waiting.values():
                    self._replies.pop(number, None)

    def _ask(self, im: InstanceManagerLink, request, number: int) -> tuple[int, list]:
        """Send ``request`` numbered ``number``: (``number``, the list its reply will be put in)."""
        if self._closed:
            raise EngineError("the engine is closed", "CLOSED")
        if im.dead:
            raise EngineError(im.dead, "WORKER_DIED")
        slot: list = []
        with self.lock:
            self._replies[number] = slot
        try:
            with im.send_lock:
                cmd.send_record(im.sock, request)
        except OSError:
            raise EngineError(f"{im.describe()} is gone", "WORKER_DIED") from None
        return number, slot

    def _replies_of(self, waiting: dict, timeout: float, partial: bool) -> dict:
        """The replies to the requests ``waiting`` (index -> (number, slot)), as :meth:`request_all`; once the
        engine is closed, none comes: the wait ends at once (CLOSED)."""
        out, deadline = {}, time.monotonic() + timeout
        with self.progress:
            for i, (_, slot) in waiting.items():
                im = self.ims[i]
                while not slot and not im.dead and not self._closed and time.monotonic() < deadline:
                    self.progress.wait(min(deadline - time.monotonic(), 0.1))
                if slot and not isinstance(slot[0], cmd.Refused):
                    out[i] = slot[0].value
                elif partial:
                    continue
                elif slot:
                    raise EngineError(slot[0].message, slot[0].code)
                elif im.dead:
                    raise EngineError(im.dead, "WORKER_DIED")
                elif self._closed:
                    raise EngineError(f"the engine closed before {im.describe()} answered", "CLOSED")
                else:
                    raise EngineError(f"{im.describe()} did not answer within {timeout:.0f} s", "WORKER_TIMEOUT")
        return out

    def snapshots(self) -> dict[int, dict]:
        """The metrics snapshot of every live instance manager that answers within METRICS_TIMEOUT_S (asked
        all at once: two stopped ones make metrics() wait that long once, not twice)."""
        live = [im.index for im in self.ims if im.dead is None]
        return self.request_all(live, lambda i, n: cmd.Metrics(n), METRICS_TIMEOUT_S, partial=True)

    def im_metrics(self, snaps: dict[int, dict], counters: dict) -> dict[int, dict]:
        """Per instance manager: where it runs, whether it lives, memory, bytes in/out, instances,
        Python GC pauses."""
        out = {}
        for im in self.ims:
            i = im.index
            m = {"name": im.name, "address": im.info.address, "pid": im.info.pid, "cpu": im.slot.cpu,
                 "node": im.slot.node, "alive": im.dead is None}
            if im.dead:
                m["error"] = im.dead
            s = snaps.get(i)
            if s is None and im.dead is None:
                m["error"] = f"no answer to the metrics request within {METRICS_TIMEOUT_S:.0f} s (stopped? overloaded?)"
            if s is not None:
                m.update(cpu_num=s["cpu_num"], rss_bytes=s["rss"], bytes_in=s["bytes_in"], bytes_out=s["bytes_out"],
                         cpu_s=round(s["cpu_s"], 3), instances=sum(len(d) for d in s["deployments"].values()),
                         gc=s["gc"], refused_connections=s["refused_connections"])
                for k in ("cpu_s", "bytes_in", "bytes_out"):
                    counters[("im", i, k)] = s[k]
            out[i] = m
        return out

    # --- the collector thread ----------------------------------------------------------
    def _collect(self) -> None:
        while not self._closed:
            try:
                self._collect_loop()
            except Exception:  # a bug here must not leave every waiter hanging: report, keep going
                traceback.print_exc()
                time.sleep(0.01)

    def _collect_loop(self) -> None:
        turns = 0
        while not self._closed:
            if self._suspects:
                self._settle_suspects()
            moved = 0
            for dep in list(self.deployments.values()):
                if dep.error is None:
                    moved += dep.poll_sink()
            turns += 1
            if moved:
                with self.progress:
                    self.progress.notify_all()
                if turns % 16:
                    continue
                self._events(0)
                continue
            self._events(0.05)

    def _events(self, timeout: float) -> None:
        """Wait up to ``timeout`` for outputs, control records or an instance manager's death."""
        consumers = [f.end for dep in list(self.deployments.values()) if dep.error is None
                     for f in dep.sink.feeds]
        links = {im.sock: im for im in self.ims if im.dead is None}
        fds = {self.sink_bell.fileno()}
        for end in consumers:
            fd = None if isinstance(end, RingConsumer) else end.fileno()
            if fd is not None:
                fds.add(fd)
        if timeout:
            for end in consumers:
                end.sleep_flag(True)
            if any(end.ready() for end in consumers):
                timeout = 0
        try:
            ready, _, _ = select.select([*fds, *links], [], [], timeout)
        except (OSError, ValueError):
            ready = []
        finally:
            if timeout:
                for end in consumers:
                    end.sleep_flag(False)
        if self.sink_bell.fileno() in ready:
            self.sink_bell.drain()
        for s in ready:
            if s in links:
                self._records(links[s])

    def _records(self, im: InstanceManagerLink) -> None:
        try:
            records = im.reader.read()
        except EngineError:
            self._died(im)
            return
        for record in records:
            if isinstance(record, cmd.Failed):
                dep = self.wires.get(record.deployment)
                if dep is not None:
                    self.blame(dep, EngineError(record.message, record.code))
                continue
            if isinstance(record, cmd.Handoff):
                self._relays.put((im, record))
                continue
            if isinstance(record, cmd.Installed):
                self.board.installed(record.ticket, record.nbytes)
                continue
            with self.progress:
                slot = self._replies.get(record.number)
                if slot is not None:
                    slot.append(record)
                self.progress.notify_all()

    def _relay_loop(self) -> None:
        """Pass handed-over state on, off the collector thread (which keeps publishing outputs meanwhile)."""
        while (item := self._relays.get()) is not None:
            self._relay(*item)

    def _relay(self, sender: InstanceManagerLink, record: cmd.Handoff) -> None:
        """State one instance manager hands to an instance on another: pass it on, unread."""
        to = self.by_name(record.host)
        dep = self.wires.get(record.deployment)
        try:
            if to is None:
                raise OSError(f"no live instance manager named {record.host!r}")
            with to.send_lock:
                cmd.send_record(to.sock, record)
        except OSError as e:
            if dep is not None:
                dep.fail(EngineError(f"query {dep.query.name}: state handed over by {sender.name} cannot reach "
                                     f"{record.host}: {e}", "HANDOFF"))

    def blame(self, dep, error: EngineError) -> None:
        """Fail ``dep`` with ``error`` — unless it is a channel whose peer died (PEER_DIED): then an
        instance manager probably died, and its command connection, closing within PEER_GRACE_S, says
        which (WORKER_DIED names it); only if none does, ``error`` stands."""
        if error.code != "PEER_DIED":
            dep.fail(error)
            return
        with self.lock:
            self._suspects.setdefault(dep.id, (time.monotonic() + PEER_GRACE_S, error, dep.gen))

    def _settle_suspects(self) -> None:
        now = time.monotonic()
        with self.lock:
            due = [(d, e, g) for d, (t, e, g) in self._suspects.items() if t <= now]
            for d, _, _ in due:
                del self._suspects[d]
        for dep_id, error, gen in due:
            dep = self.deployments.get(dep_id)
            if dep is not None and dep.gen is gen:  # not for a generation that was replaced meanwhile
                dep.fail(error)

    def _died(self, im: InstanceManagerLink) -> None:
        if im.dead is not None or self._closed:
            return
        code = None
        if im.process is not None:
            try:
                code = im.process.wait(0.5)
            except subprocess.TimeoutExpired:
                pass
        hosted = {dep: dep.uses(im.index) for dep in list(self.deployments.values())}
        hosted = {dep: v for dep, v in hosted.items() if v}
        what = "; ".join(f"query {dep.query.name}{'' if dep.replica is None else f' (replica {dep.replica})'}: "
                         f"{', '.join(v)}" for dep, v in hosted.items()) or "no instances"
        how = f"died with exit code {code}" if code is not None else "is gone (its command connection closed)"
        im.dead = f"{im.describe()} {how}; it ran {what}"
        log.warning("%s", im.dead)
        reclaim(os.path.dirname(self.dir))  # its rings, if it ran on this host (it could not remove them)
        for dep in hosted:
            dep.fail(EngineError(im.dead, "WORKER_DIED"))
        with self.progress:
            self.progress.notify_all()

    def close(self) -> None:
        """Stop the instance managers this engine started (politely, then by force), leave the others."""
        if self._closed or self._closing:
            return
        self._closing = True
        for dep in list(self.deployments.values()):  # the collector still reads the replies meanwhile
            dep.close()
        with self.progress:  # requests still waiting (a migration deploying a generation) end now
            self._closed = True
            self.progress.notify_all()
        for im in self.ims:
            try:
                im.sock.close()  # ours exit with --once; the others drop this engine's deployments
            except OSError:
                pass
        deadline = time.monotonic() + 5
        for im in self.ims:
            if im.process is not None:
                try:
                    im.process.wait(max(0.05, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    im.process.kill()
                    im.process.wait(2)
                if im.process.stdout is not None:
                    im.process.stdout.close()
        self._relays.put(None)
        if getattr(self, "_thread", None) is not None:
            with self.progress:
                self.progress.notify_all()
            self._thread.join(5)
        self.send_bell.close()
        self.sink_bell.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def _path(directory: str, name: str):
    from pathlib import Path
    return Path(directory) / name
