"""The command line on a cluster, as the README's walkthrough uses it: ``sparkcep deploy`` of
``examples/cluster_query.py``, ``examples/cluster_feed.py`` run twice (it never ends the stream, so it
can run again; each run checks the windows that closed per IP), ``sparkcep rescale`` and ``sparkcep
migrate`` between the runs (their reports printed, the bins where they were asked to be), ``sparkcep
undeploy`` at the end, and their refusals (``sparkcep <command>: message [CODE]``, exit 1, nothing changed)."""

from __future__ import annotations

import contextlib
import logging
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from api_harness import ENV, ROOT

import sparkcep as cep


def feed(cluster) -> str:
    """Run examples/cluster_feed.py: it exits 0 once the windows that closed while it ran equal what it sent,
    per window and IP."""
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "cluster_feed.py"), "--zk", f"zk://{cluster.zk}",
                          "--token-file", cluster.token_file, "--sends", "25", "--rows", "500"], env=ENV,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    closed = re.search(r"(\d+) windows closed during this run: per window and IP, clicks and bytes equal what this "
                       r"run sent \(([\d,]+) rows\)", run.stdout)
    assert closed and int(closed[1]) >= 1, run.stdout
    return run.stdout


def report(stdout: str) -> dict:
    return dict(re.findall(r"^\s+(\w+): (.+)$", stdout, re.M))


def test_rescale_and_migrate_from_the_command_line_between_two_runs_of_the_feed(cluster):
    zk = ["--zk", cluster.zk, "--token-file", cluster.token_file]
    run = cluster.cli("deploy", *zk, "--parallelism", "2", str(ROOT / "examples" / "cluster_query.py"))
    assert run.returncode == 0, run.stderr
    try:
        feed(cluster)
        run = cluster.cli("rescale", *zk, "clicks", "per_ip", "3", "--batch", "8")
        assert run.returncode == 0, run.stderr
        assert run.stdout.startswith("rescale: per_ip of clicks (clicks#") and "to 3 instances" in run.stdout
        got = report(run.stdout)
        assert got["kind"] == "rescale" and got["strategy"] == "batched" and int(got["bins"]) == 128 // 3
        dep = cluster.engine.deployment("clicks")
        assert dep.parallelism == {"SQ1": 3} and sorted(set(dep.bin_owners("per_ip"))) == [0, 1, 2]

        run = cluster.cli("migrate", *zk, "clicks", "per_ip", "--bins", "0-9,20", "--to", "2", "--strategy",
                      "all-at-once")
        assert run.returncode == 0, run.stderr
        owners = dep.bin_owners("per_ip")
        assert [owners[b] for b in [*range(10), 20]] == [2] * 11
        assert report(run.stdout)["strategy"] == "all-at-once" and run.stdout.splitlines()[0].endswith(", 11 bins")

        moves = cluster.token_file + ".moves"
        with open(moves, "w") as f:
            f.write("# bin=instance\n0-3=0\n20=1  # back\n9=2  # where it is\n")
        run = cluster.cli("migrate", *zk, "clicks", "per_ip", "--file", moves)
        assert run.returncode == 0, run.stderr
        owners = dep.bin_owners("per_ip")
        assert [owners[b] for b in (0, 1, 2, 3, 20, 9)] == [0, 0, 0, 0, 1, 2] and int(report(run.stdout)["bins"]) == 5
        assert run.stdout.splitlines()[0].endswith(", 6 bins asked for, 5 moved (1 there already)")
        feed(cluster)  # again: the stream never ended, the windows go on
        assert [r["kind"] for r in dep.migrations()["finished"]] == ["rescale", "migrate", "migrate"]

        run = cluster.cli("undeploy", *zk, "clicks")
        assert run.returncode == 0 and run.stdout == "undeployed clicks\n", run.stdout + run.stderr
        with pytest.raises(cep.QueryError, match="no query named 'clicks'") as e:
            cluster.engine.deployment("clicks")
        assert e.value.code == "UNKNOWN_QUERY"
    finally:
        with contextlib.suppress(cep.QueryError):  # taken off by the command already when it got that far
            cluster.engine.undeploy("clicks")


def test_refusals_print_the_code_and_change_nothing(cluster, tmp_path):
    zk = ["--zk", cluster.zk, "--token-file", cluster.token_file]
    (tmp_path / "empty.txt").write_text("# nothing\n")
    (tmp_path / "typo.py").write_text('import sparkcep as cep\nquery = cep.Query("t")\nquery.stream("s", "a strin")\n')
    run = cluster.cli("deploy", *zk, "--parallelism", "2", str(ROOT / "examples" / "cluster_query.py"))
    assert run.returncode == 0, run.stderr
    try:
        dep = cluster.engine.deployment("clicks")
        owners = dep.bin_owners("per_ip")
        for argv, code, says in [
            (["rescale", "clicks", "per_ipp", "3"], "UNKNOWN_OPERATOR", "did you mean 'per_ip'"),
            (["rescale", "clickz", "per_ip", "3"], "UNKNOWN_QUERY", "did you mean 'clicks'"),
            (["rescale", "clicks", "per_ip", "2.5"], "BAD_INSTANCE", "N (instances) must be an integer"),
            (["rescale", "clicks", "per_ip", "100000"], "TOO_MANY_INSTANCES", "exceed its 128 bins"),
            (["rescale", "clicks", "per_ip", "3", "--strategy", "fluidd"], "BAD_STRATEGY", "fluid"),
            (["migrate", "clicks", "per_ip", "--bins", "0-200", "--to", "1"], "BAD_BIN", "out of range"),
            (["migrate", "clicks", "per_ip", "--bins", "0-10000000000", "--to", "1"], "BAD_BIN", "more than 65536 bins"),
            (["migrate", "clicks", "per_ip", "--bins", "0", "--to", "5"], "BAD_INSTANCE", "does not exist"),
            (["migrate", "clicks", "per_ip", "--bins", "0-3", "--to", "1", "0"], "BAD_INSTANCE", "one per bin"),
            (["migrate", "clicks", "per_ip", "--bins", "x", "--to", "1"], "BAD_BIN", "a bin must be an integer"),
            (["migrate", "clicks", "per_ip", "--bins", "-1", "--to", "1"], "BAD_BIN", "bin '-1': bins are from 0"),
            (["migrate", "clicks", "per_ip"], "BAD_OPTION", "--bins ... --to ..."),
            (["migrate", "clicks", "per_ip", "--file", "/nonexistent"], "BAD_OPTION", "cannot read"),
            # an empty shell variable, a doubled comma, an empty file: "0 bins" moved and exit 0 before
            (["migrate", "clicks", "per_ip", "--bins", "", "--to", "1"], "BAD_BIN", "hold an empty item"),
            (["migrate", "clicks", "per_ip", "--bins", "0,,3", "--to", "1"], "BAD_BIN", "hold an empty item"),
            (["migrate", "clicks", "per_ip", "--file", str(tmp_path / "empty.txt")], "BAD_BIN", "names no bin"),
            # a query file the query layer refuses: a 30-line traceback before
            (["deploy", str(tmp_path / "typo.py")], "SCHEMA", "unknown type 'strin'"),
            (["undeploy", "clickz"], "UNKNOWN_QUERY", "did you mean 'clicks'"),
        ]:
            command, *rest = argv
            run = cluster.cli(command, *zk, *rest)
            assert run.returncode == 1 and run.stdout == "", (argv, run.stdout, run.stderr)
            line = run.stderr.strip().splitlines()[-1]
            assert line.startswith(f"sparkcep {command}: ") and line.endswith(f"[{code}]") and says in line, line
        assert dep.bin_owners("per_ip") == owners and dep.migrations()["finished"] == []
    finally:
        cluster.engine.undeploy("clicks")


def test_status_of_a_path_nothing_joined_says_so(cluster):
    """A slip in the path showed an empty cluster, as if it were one whose processes had all stopped."""
    typo = cluster.zk.rpartition("/")[0] + "/dmeo"
    run = cluster.cli("status", "--zk", typo)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == (f"cluster zk://{typo}: nothing is registered here: no orchestrator, engine host or "
                                  "worker has joined it (is the path the one they were started with?)"), run.stdout
    run = cluster.cli("status", "--zk", cluster.zk)
    assert "nothing is registered" not in run.stdout and "orchestrators (1):" in run.stdout, run.stdout


def test_the_feed_ends_with_the_engine_s_message_not_a_traceback(cluster):
    """The walkthrough's feed, when the engine refuses a send (here: no query reads its stream; in the
    walkthrough, a worker died under a one-replica query), prints the engine's message and code, exit 1."""
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "cluster_feed.py"), "--zk", f"zk://{cluster.zk}",
                          "--token-file", cluster.token_file, "--sends", "2"], env=ENV, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    line, = run.stderr.strip().splitlines()
    assert line.startswith("cluster_feed: ") and "'clicks'" in line and line.endswith("[UNKNOWN_STREAM]"), line


def test_a_command_that_cannot_reach_zookeeper_says_so_once(monkeypatch, capsys, caplog, tmp_path):
    """One line naming the registry it could not reach: the ZooKeeper client's line a retry ("Connection
    dropped ... refused", 15 of them in 10 s) is not logged by the one-shot commands."""
    from sparkcep import auth, cli
    from sparkcep.control import connect
    from sparkcep.control.zookeeper import free_port

    monkeypatch.setattr(connect, "REGISTRY_TIMEOUT_S", 2.0)
    token = tmp_path / "token"
    auth.write(token, auth.generate())
    address, kazoo = f"127.0.0.1:{free_port()}", logging.getLogger("kazoo")
    level = kazoo.level
    try:
        assert cli.main(["undeploy", "--zk", f"{address}/x", "--token-file", str(token), "clicks"]) == 1
    finally:
        kazoo.setLevel(level)  # as the other tests of this process expect it
    err = capsys.readouterr().err.strip()
    assert err == f"sparkcep undeploy: no ZooKeeper server answered at {address} within 2.0 s (a local one for " \
                  "development: sparkcep zookeeper) [REGISTRY_UNREACHABLE]", err
    assert not [r for r in caplog.records if r.name.startswith("kazoo")], caplog.records[:3]


def test_an_orchestrator_that_cannot_reach_zookeeper_says_so_in_one_line(tmp_path):
    """It logged the ZooKeeper client's "Connecting to 127.0.0.1:PORT" line a retry (7 in 3 s) and its
    "session closed" before its own line."""
    from sparkcep import auth
    from sparkcep.control.zookeeper import free_port
    token = tmp_path / "token"
    auth.write(token, auth.generate())
    address = f"127.0.0.1:{free_port()}"
    run = subprocess.run([sys.executable, "-m", "sparkcep", "orchestrator", "--zk", f"{address}/x", "--token-file",
                          str(token), "--name", "o"], env=ENV, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith(f"orchestrator no ZooKeeper server answered at {address} within "
                                                 "3.0 s (a local one for development: sparkcep zookeeper) "
                                                 "[REGISTRY_UNREACHABLE]"), lines


def test_a_deploy_needing_more_workers_than_joined_says_so_after_one_wait(cluster, monkeypatch):
    """Five replicas on two workers: NOT_ENOUGH_WORKERS once the client's wait for members is over. The
    client waited, then the data path waited as long again (``sparkcep deploy --replicas 100``: 121 s)."""
    from sparkcep.control import connect

    monkeypatch.setattr(connect, "MEMBERS_WAIT_S", 2.0)
    q = cep.Query("five")
    q.output("five_out", q.stream("five_in", "k string, ts timestamp").map(k="k", ts="ts"))
    started = time.monotonic()
    with pytest.raises(cep.EngineError, match=r"^2 of the 5 instance managers needed serve this engine") as e:
        cluster.engine.deploy(q, replicas=np.int64(5))
    assert e.value.code == "NOT_ENOUGH_WORKERS" and time.monotonic() - started < 10
    with pytest.raises(cep.QueryError):
        cluster.engine.deployment("five")  # nothing was deployed


@pytest.mark.parametrize("argv,says", [
    (["deploy", "q.py", "--zk", "127.0.0.1:1/x", "--token-file", "t", "--parallelism", "0"],
     "argument --parallelism: must be 1 or more, got 0"),
    (["deploy", "q.py", "--zk", "127.0.0.1:1/x", "--token-file", "t", "--replicas", "-1"],
     "argument --replicas: must be 1 or more, got -1"),
    (["status", "--watch", "-1"], "argument --watch: must be from 0 to 86,400, got -1"),
    (["status", "--watch", "0.001"], "argument --watch: must be 0 (once) or from 0.1 to 86,400, got 0.001"),
])
def test_a_count_no_command_can_use_is_refused_before_reaching_anything(argv, says, capsys):
    """``status --watch -1`` ended in time.sleep's ValueError traceback, ``--watch 0.001`` asked the engine
    for its metrics a thousand times a second; ``deploy --parallelism 0`` waited for ZooKeeper first."""
    from sparkcep import cli
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"sparkcep {argv[0]}: error: {says}"


@pytest.mark.parametrize("argv,begins,ends", [
    (["statu"], "sparkcep: error: argument command: invalid choice: 'statu' (choose from 'worker', 'status', ",
     "(did you mean 'status'?)"),
    (["migrate", "q", "agg", "--zk", "127.0.0.1:1/x", "--tokenfile", "t"],
     "sparkcep migrate: error: unrecognized arguments: --tokenfile", " (did you mean '--token-file'?)"),
    (["status", "--jsn"], "sparkcep status: error: unrecognized arguments: --jsn", " (did you mean '--json'?)"),
    (["bench", "fixwindw"], "sparkcep bench: error: argument workload: invalid choice: 'fixwindw' (choose from ",
     "(did you mean 'fixwindow'?)"),
])
def test_a_mistyped_command_or_option_is_refused_naming_the_closest(argv, begins, ends, capsys):
    """``migrate --tokenfile t`` said only that --token-file was missing; no message named the closest."""
    from sparkcep import cli
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 2
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert said.startswith(begins) and said.endswith(ends), said


def test_a_deploy_with_the_workers_it_needs_does_not_warn_while_it_waits_to_spread(cluster, monkeypatch, caplog):
    """Three instances on two workers: it waits SETTLE_S for a third to join, silently; it said "waiting for
    instance managers ... (up to 57 s more)" as if the deploy could take a minute."""
    from sparkcep.control import connect

    monkeypatch.setattr(connect, "SETTLE_S", 3.5)
    q = cep.Query("spread")
    q.output("spread_out", q.stream("spread_in", "k string, ts timestamp").map(k="k", ts="ts"))
    with caplog.at_level(logging.WARNING, "sparkcep"):
        cluster.engine.deploy(q, parallelism=3)
    try:
        assert not [r for r in caplog.records if "waiting for instance managers" in r.getMessage()], caplog.text
    finally:
        cluster.engine.undeploy("spread")


def test_bins_and_counts_are_read_as_every_command_reads_them(tmp_path):
    """A file sending bin 2 to instance 1 (``0-3=1``) and then to 0 (``2=0``) moved it to 0 without a word;
    ``--bins 2 2 --to 1 0`` said "2 instances for 1 bins"; ``rescale ... 2.0`` was refused where ``deploy
    --parallelism 2.0`` is taken."""
    import argparse

    from sparkcep.control.reconfigure import _assignment, _number

    def assignment(text=None, bins=None, to=None):
        if text is not None:
            (tmp_path / "moves.txt").write_text(text)
        return _assignment(argparse.Namespace(file=None if text is None else str(tmp_path / "moves.txt"),
                                              bins=bins, to=to))
    for call, says in [(lambda: assignment("0-3=1\n2=0\n"), "moves.txt, line 2: bin 2 goes to instance 1 and to "
                                                            "instance 0"),
                       (lambda: assignment(bins=["2", "2"], to=["1", "0"]), "--bins/--to: bin 2 goes to instance 1 "
                                                                            "and to instance 0")]:
        with pytest.raises(cep.QueryError) as e:
            call()
        assert e.value.code == "BAD_BIN" and str(e.value).endswith(f"{says}: give each bin one instance"), e.value
    assert assignment("0-3=1\n2=1\n") == {0: 1, 1: 1, 2: 1, 3: 1}  # the same instance twice: no conflict
    assert assignment(bins=["2", "2,3"], to=["1"]) == {2: 1, 3: 1}
    assert assignment(bins=["2-3"], to=["1e0", "2.0"]) == {2: 1, 3: 2}
    assert [_number(t, "N", int, "BAD_INSTANCE") for t in ("3", "3.0", "1e3")] == [3, 3, 1000]
