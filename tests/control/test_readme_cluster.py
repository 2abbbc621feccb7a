"""The README's cluster walkthrough, run exactly as written (ports moved to free ones, from a scratch
directory): ZooKeeper, an orchestrator, two workers, deploy (at once: it waits for the workers itself),
feed, status, the metrics endpoint, a rescale; then terminal 1's ZooKeeper is restarted as the README
runs it (temporary data: it comes back empty), and the cluster serves again: the feed runs once more."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LONG_RUNNING = ("sparkcep zookeeper", "sparkcep orchestrator", "sparkcep worker")


def walkthrough() -> list[str]:
    """The commands of the README's walkthrough, in order."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- cluster-walkthrough -->(.*?)<!-- /cluster-walkthrough -->", text, re.S).group(1)
    return [line.strip() for line in block.splitlines()
            if line.strip() and not line.strip().startswith(("#", "```"))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_readme_cluster_walkthrough_runs_as_written(tmp_path):
    zk_port, metrics_port = free_port(), free_port()
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]))
    background, outputs = [], {}

    def status() -> dict:
        out = subprocess.run(["sparkcep", "status", "--zk", f"127.0.0.1:{zk_port}/demo", "--json"], env=env,
                             cwd=tmp_path, capture_output=True, text=True, timeout=60)
        return json.loads(out.stdout) if out.returncode == 0 else {}

    def wait(predicate, what, timeout=90):
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.2)

    def commands():
        return [line.replace("2181", str(zk_port)).replace("9464", str(metrics_port))
                .replace("examples/", f"{ROOT}/examples/").rstrip("&").strip() for line in walkthrough()]

    def run_(command: str) -> str:
        run = subprocess.run(command, shell=True, env=env, cwd=tmp_path, capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 0, f"{command}\n{run.stdout}\n{run.stderr}"
        return run.stdout

    try:
        for command in commands():
            if command.startswith(LONG_RUNNING):
                background.append(subprocess.Popen(shlex.split(command), env=env, cwd=tmp_path,
                                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
                if command.startswith("sparkcep zookeeper"):
                    wait(lambda: _listening(zk_port), "ZooKeeper")
                continue
            outputs[command.split()[0] + " " + command.split()[1]] = run_(command)
        zookeeper = background[0]  # terminal 1: Ctrl-C, then the same command again
        zookeeper.send_signal(signal.SIGINT)
        assert zookeeper.wait(30) == 0
        background[0] = subprocess.Popen(zookeeper.args, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE)
        wait(lambda: _listening(zk_port), "ZooKeeper again")
        again = run_(next(c for c in commands() if "cluster_feed.py" in c))
    finally:
        for p in reversed(background):  # the orchestrator, last to leave, stops the engine host
            p.send_signal(signal.SIGTERM)
            p.wait(30)
    assert "deployed clicks" in outputs["sparkcep deploy"] and "instance manager w" in outputs["sparkcep deploy"]
    feed = outputs[f"python3 {ROOT}/examples/cluster_feed.py"]  # its second run, after the rescale
    closed = re.search(r"(\d+) windows closed during this run: per window and IP, clicks and bytes equal what "
                       r"this run sent", feed)
    assert closed and int(closed[1]) >= 1, feed
    assert "to 3 instances" in outputs["sparkcep rescale"], outputs["sparkcep rescale"]
    text = outputs["sparkcep status"]
    assert "LEADER" in text and re.search(r"w1 .* clicks\.SQ1", text) and re.search(r"w2 .* clicks\.SQ1", text), text
    assert re.search(r'sparkcep_query_rows_in_total\{query="clicks"\} 100000', outputs["curl -s"]), outputs["curl -s"]
    assert re.search(r"(\d+) windows closed during this run: per window and IP", again), again


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
