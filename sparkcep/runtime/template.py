"""The instance-manager template: a process with the engine's modules imported and its kernels loaded,
which forks the instance managers the engines of the process that started it run (``Engine.local``).

An instance manager started from nothing spends 1.2-1.4 s on a 2-core machine in Python's imports and
loading numba's kernels, and two start side by side as slowly; a fork of the template is ready in tens
of milliseconds and shares the template's compiled code copy-on-write. One template serves every engine
of its process, started with the first of them:

* it lives as long as that process: it exits when its control socket closes (that process ended,
  however it ended), and its instance managers get SIGTERM when it exits (``PR_SET_PDEATHSIG``), as an
  instance manager started alone does when its engine's process ends; with none running and no request
  for :data:`IDLE_S` it exits too (the next engine starts another);
* each fork runs ``sparkcep worker`` with the environment, ``sys.path`` and working directory the
  requesting process has at that moment: the modules of a query's functions are imported by the fork,
  never by the template;
* it reaps its forks and writes each one's exit code to that fork's status pipe, whose reader
  (:class:`ForkedWorker`) is the engine's handle of the process.

The control socket is a ``SOCK_SEQPACKET`` pair, one request a message, unreachable from any other
process: a request carries the fork's ``worker`` arguments and the write ends of its stdout and status
pipes; the answer is its pid.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback

from sparkcep.errors import EngineError
from sparkcep.runtime.worker_start import Starting, die_with_parent, wait_ready, worker_args, worker_env

FORK_ANSWER_S = 10.0  # a template answers a fork at once; one that does not is stopped
IDLE_S = 60.0  # a template with no fork running ends after this long without a request
_lock = threading.Lock()  # one request at a time on the control socket; one start of the template
_template: Template | None = None


def fork_worker(name: str, cpu: int, listen: str, token_file: str) -> ForkedWorker:
    """An instance manager forked from this process's template (started first if there is none, or
    its last one is gone), as :func:`~sparkcep.runtime.worker_start.start_worker` would start it: its
    READY line comes on the handle's ``stdout`` for :func:`wait_ready`."""
    global _template
    with _lock:
        for attempt in (1, 2):
            if _template is not None and _template.owner != os.getpid():
                _template = None  # this process is a fork of the one that started it: that one's, not ours
            if _template is not None and not _template.alive():
                _template.close()
                _template = None
            if _template is None:
                _template = Template()
            try:
                return _template.fork(worker_args(name, cpu, listen, token_file))
            except (ConnectionResetError, BrokenPipeError):  # it ended (idle) as the request went: another
                if attempt == 2:
                    raise
                _template.close()
                _template = None


class Template:
    """The engine's side of a template process."""

    def __init__(self):
        self.owner = os.getpid()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "sparkcep.runtime.template", str(theirs.fileno()), str(IDLE_S)],
                stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env=worker_env(), pass_fds=(theirs.fileno(),),
                preexec_fn=_ignore_ctrl_c)
        finally:
            theirs.close()
        self.control, self._requests = ours, 0
        try:
            wait_ready([Starting(self.process, f"the instance-manager template (pid {self.process.pid})")])
        except BaseException:
            self.close()
            raise

    def alive(self) -> bool:
        return self.process.poll() is None

    def fork(self, argv: list[str]) -> ForkedWorker:
        self._requests += 1
        request = {"id": self._requests, "argv": argv, "env": dict(os.environ), "path": sys.path, "cwd": os.getcwd()}
        out_r, out_w = os.pipe()
        status_r, status_w = os.pipe()
        self.control.settimeout(FORK_ANSWER_S)
        try:
            socket.send_fds(self.control, [json.dumps(request).encode()], [out_w, status_w])
            while True:
                answer = self.control.recv(4096)
                if not answer:
                    raise ConnectionResetError(f"the instance-manager template (pid {self.process.pid}) exited")
                answer = json.loads(answer)
                if answer["id"] == request["id"]:  # not the answer to one that timed out before
                    break
        except socket.timeout:
            os.close(out_r)
            os.close(status_r)
            raise EngineError(f"the instance-manager template (pid {self.process.pid}), which forks this "
                              f"process's instance managers, did not answer within {FORK_ANSWER_S:.0f} s: is it "
                              "stopped (SIGSTOP)?", "WORKER_STUCK") from None
        except BaseException:
            os.close(out_r)
            os.close(status_r)
            raise
        finally:
            os.close(out_w)
            os.close(status_w)
        if "error" in answer:
            os.close(out_r)
            os.close(status_r)
            raise EngineError(f"the instance-manager template (pid {self.process.pid}) could not start an "
                              f"instance manager: {answer['error']}", "WORKER_START")
        return ForkedWorker(answer["pid"], os.fdopen(out_r, "rb", buffering=0), status_r)

    def close(self) -> None:
        self.control.close()  # it exits when it reads the end
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()


class ForkedWorker:
    """An instance manager a template forked, handled as a ``subprocess.Popen``: ``pid``, ``stdout``,
    ``poll``, ``wait``, ``kill``, ``returncode``. The exit code comes on its status pipe; when the
    template itself is gone, the pipe closes with none, and the code is -SIGTERM, the signal its
    template's end sent it."""

    def __init__(self, pid: int, stdout, status_fd: int):
        self.pid, self.stdout, self._status = pid, stdout, status_fd
        self.returncode: int | None = None
        self._reading = threading.Lock()  # the send path and the collector may both see it ended

    def poll(self) -> int | None:
        return self._wait(0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._wait(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"instance manager pid {self.pid}", timeout)
        return code

    def _wait(self, timeout: float | None) -> int | None:
        if self.returncode is None:
            try:
                ended = select.select([self._status], [], [], timeout)[0]
            except (OSError, ValueError):  # another thread read it and closed it meanwhile
                ended = True
            if ended:
                with self._reading:
                    if self.returncode is None:
                        data = os.read(self._status, 32)
                        self.returncode = int(data) if data else -signal.SIGTERM
                        os.close(self._status)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:  # not yet reaped: the pid is still its own
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def __del__(self):
        if self.returncode is None:
            os.close(self._status)


def _ignore_ctrl_c() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: its starter stops it


# --- the template process --------------------------------------------------------------------------

def main(control_fd: int, idle_s: float) -> int:
    """Body of the template: load the kernels, print READY, fork on each request until the control
    socket closes (or ``idle_s`` pass with no fork running and no request)."""
    importlib.import_module("sparkcep.runtime.instance_manager")  # what every fork runs, imported once here
    from sparkcep.runtime.process import keep_freed_memory
    from sparkcep.runtime.warmup import heartbeat, warm_up
    control = socket.socket(fileno=control_fd)
    keep_freed_memory()  # as a worker does before its warm-up: the forks inherit this heap
    try:
        with heartbeat(lambda text: print(f"STARTING {text}", flush=True)) as progress:
            warm_up(progress)
        if threading.active_count() != 1:  # a fork keeps only the thread that forks
            raise EngineError(f"threads running after the warm-up: {threading.enumerate()}", "WORKER_START")
    except Exception as e:
        print(f"FAILED {e}", flush=True)
        return 1
    gc.freeze()  # the forks share these objects copy-on-write; never scanned, they stay shared
    print("READY {}", flush=True)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the select below
    statuses: dict[int, int] = {}  # pid -> the write end of its status pipe
    template = os.getpid()
    while True:
        ready = select.select([control, wake_r], [], [], idle_s)[0]
        if not ready and not statuses:
            return 0  # no instance manager and no request for idle_s: its memory goes back
        if wake_r in ready:
            os.read(wake_r, 4096)
            _reap(statuses)
        if control in ready:
            message, fds, _, _ = socket.recv_fds(control, 1 << 20, 2)
            if not message:
                return 0  # the process that started it is gone; the forks get SIGTERM as it exits
            out_fd, status_fd = fds
            request = json.loads(message)
            try:
                pid = os.fork()
            except OSError as e:  # out of memory or processes: said to the engine; its other forks go on
                os.close(status_fd)
                answer = {"error": f"fork failed: {e}"}
            else:
                if pid == 0:
                    _run_fork(request, out_fd, [control.fileno(), wake_r, wake_w, *statuses.values()], template)
                statuses[pid] = status_fd
                answer = {"pid": pid}
            os.close(out_fd)
            control.send(json.dumps({"id": request["id"], **answer}).encode())


def _reap(statuses: dict[int, int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = statuses.pop(pid, None)
        if fd is not None:
            try:
                os.write(fd, str(os.waitstatus_to_exitcode(status)).encode())
            except BrokenPipeError:  # nobody waits for it: a fork whose request timed out
                pass
            os.close(fd)


def _run_fork(request: dict, out_fd: int, template_fds: list[int], template: int) -> None:
    """In a fork of ``template`` (its pid): become ``sparkcep worker`` with the requester's environment,
    printing on ``out_fd``; never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in template_fds:
            os.close(fd)
        os.dup2(out_fd, 1)
        os.close(out_fd)
        die_with_parent()
        if os.getppid() != template:  # the template ended before that took effect
            os._exit(1)
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[:] = request["path"]
        os.chdir(request["cwd"])
        from sparkcep.runtime import instance_manager
        code = instance_manager.main(request["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # nobody reads it any more
                pass
        os._exit(code)


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), float(sys.argv[2])))
