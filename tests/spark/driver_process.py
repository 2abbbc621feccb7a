"""A Spark driver in a child process, driven line by line, with a deadline on every step.

Spark plugins are fixed when a SparkContext starts, and one Python process
holds one SparkContext (the session-wide ``local[2]`` one of conftest), so
the plugin tests run their SparkSession in a child: it prints ``UP`` once
its executors are registered (with the application id and the
executors' work directory), then runs one JSON command per input line
(``OK {result}`` or ``ERR {message}``), and ``DOWN`` after ``spark.stop()``
when its input closes. The child is the leader of its own process group, so
a step that overruns can take down every JVM and process it started.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time

SCRIPT = r"""
import json, os, sys, time
from pyspark.sql import SparkSession
import sparkcep.spark

args = json.loads(sys.argv[1])
builder = SparkSession.builder.master(args["master"]).appName(args["app"])
for key, value in args["conf"].items():
    builder = builder.config(key, value)
spark = sparkcep.spark.configure(builder, **args["plugin"]).getOrCreate()
spark.sparkContext.setLogLevel("WARN")
while spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() < args["executors"] + 1:
    time.sleep(0.2)  # in local-cluster mode executors register after the session is up


def engine_options(engine, token_file):
    return {"engine": engine, **({"tokenFile": token_file} if token_file else {})}


def finish(q):
    q.awaitTermination(300)
    if q.exception() is not None:
        raise RuntimeError(str(q.exception()))
    return len(q.recentProgress)


def write(source, schema, engine, stream, checkpoint, token_file=None):
    # one Parquet file per micro-batch, so the engine sees them in file order
    events = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(source)
    q = (events.writeStream.format("upmcep").options(**engine_options(engine, token_file)).option("stream", stream)
         .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    return {"batches": finish(q)}


def read(engine, stream, columns, path, token_file=None):
    df = spark.read.format("upmcep").options(**engine_options(engine, token_file)).load(stream).select(*columns)
    df.write.parquet(path)
    return {"rows": spark.read.parquet(path).count()}


def read_stream(engine, stream, columns, path, checkpoint, token_file=None):
    df = spark.readStream.format("upmcep").options(**engine_options(engine, token_file)).load(stream)
    q = (df.select(*columns).writeStream.format("parquet").option("path", path)
         .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    return {"batches": finish(q), "rows": spark.read.parquet(path).count()}


# local-cluster executors work in $SPARK_HOME/work/APP: neither spark.worker.dir nor SPARK_WORKER_DIR
# reaches the workers of a local cluster (it passes them no work directory)
from pyspark.find_spark_home import _find_spark_home
app = spark.sparkContext.applicationId
print("UP " + json.dumps({"app": app, "work": os.path.join(_find_spark_home(), "work", app)}), flush=True)
for line in sys.stdin:
    command = json.loads(line)
    try:
        ops = {"write": write, "read": read, "read_stream": read_stream}
        print("OK " + json.dumps(ops[command["op"]](**command["args"])), flush=True)
    except Exception as e:
        print("ERR " + json.dumps(f"{type(e).__name__}: {e}"), flush=True)
spark.stop()
print("DOWN", flush=True)
"""


class DriverProcess:
    """A SparkSession with the sparkcep plugin (``plugin``: ``configure`` arguments) in a child process."""

    def __init__(self, master: str, plugin: dict, conf: dict, executors: int, cwd, timeout: float,
                 env: dict | None = None):
        args = {"master": master, "app": "sparkcep-plugin-test", "plugin": plugin, "executors": executors,
                "conf": {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                         "spark.sql.session.timeZone": "UTC", **conf}}
        self.proc = subprocess.Popen([sys.executable, "-c", SCRIPT, json.dumps(args)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, cwd=cwd, env=env, start_new_session=True)
        self._buffer = b""
        try:
            self.info = json.loads(self.expect("UP ", timeout)[3:])  # {"app": Spark's id, "work": executors' dirs}
        except BaseException:
            self.kill()
            raise

    def run(self, op: str, timeout: float, **args) -> dict:
        """Run command ``op`` in the driver; its result (AssertionError with the driver's error)."""
        self.proc.stdin.write((json.dumps({"op": op, "args": args}) + "\n").encode())
        self.proc.stdin.flush()
        line = self.expect(("OK ", "ERR "), timeout)
        if line.startswith("ERR "):
            raise AssertionError(f"the Spark driver failed to {op}: {json.loads(line[4:])}")
        return json.loads(line[3:])

    def stop(self, timeout: float) -> None:
        """``spark.stop()`` (by closing the driver's input), within ``timeout`` s."""
        self.proc.stdin.close()
        self.expect("DOWN", timeout)
        self.proc.wait(timeout)

    def kill(self) -> None:
        """Kill whatever is left of the driver's process group: the last step of a test, passed or failed."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)
        self.proc.stdin.close()
        self.proc.stdout.close()

    def expect(self, prefix, timeout: float) -> str:
        """The next stdout line starting with ``prefix`` (other lines are skipped), within ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                text = line.decode(errors="replace")
                if text.startswith(prefix):
                    return text
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"the Spark driver did not say {prefix!r} within {timeout:.0f} s")
            ready, _, _ = select.select([self.proc.stdout], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                if not chunk:
                    raise AssertionError(f"the Spark driver exited (code {self.proc.wait(30)}) before "
                                         f"saying {prefix!r}")
                self._buffer += chunk


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie has exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def parent(pid: int) -> int:
    """The parent process of ``pid``."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().split(") ")[1].split()[1])


def cmdline(pid: int) -> list[str]:
    """The command line of process ``pid``."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().decode(errors="replace").split("\0")
