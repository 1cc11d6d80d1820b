"""Another local user cannot stop a cluster serving its owner by flooding its ports
with idle TCP connections, and the owner's commands tell a cluster that does not
answer from one that has stopped.

The cluster runs with 1,024 descriptors (a common default), so the attacker's few
thousand connections a port are several times its limit (as 2 x 10,000 were against
20,000 in issue 66).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from snakemake_executor_context.cluster.connection import ClusterConnection
from snakemake_executor_context.cluster.infofiles import ClusterFiles
from snakemake_executor_context.errors import ClusterError
from tests.cluster.test_security import attacker  # noqa: F401 (a fixture)
from tests.conftest import BIN, shared_cluster, snakemake, toy_files

pytestmark = pytest.mark.slow

FLOOD = Path(__file__).with_name("flood_probe.py")
#: The cluster's descriptor limit in these tests.
CLUSTER_FILES = 1024
#: Idle connections the attacker opens to each port it floods.
CONNECTIONS = 3000
#: At most this much the cluster's log may grow while flooded.
LOG_GROWTH = 32 * 1024


def _cluster_limit() -> None:
    """In `up`, before exec: the cluster's descriptor limit (it inherits it)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (CLUSTER_FILES, hard))


@pytest.fixture(scope="module")
def cluster() -> Iterator[Path]:
    """An `up` cluster of one server with 1,024 descriptors, in a shared directory."""
    with shared_cluster("--servers", "1", preexec_fn=_cluster_limit) as path:
        yield path


def _status(scheduler_file: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "snakemake-context"), "status", "--scheduler-file", str(scheduler_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _scheduler_and_server_port(scheduler_file: Path) -> tuple[int, int]:
    connection = ClusterConnection.attach(address=None, scheduler_file=scheduler_file, timeout=20)
    try:
        workers = connection.client.scheduler_info(n_workers=-1)["workers"]
        scheduler = connection.client.scheduler.address
    finally:
        connection.client.close()
    return int(scheduler.rsplit(":", 1)[1]), int(next(iter(workers)).rsplit(":", 1)[1])


def _attacker_limit() -> None:
    """As root, before runuser drops privileges: room for the attacker's connections."""
    wanted = 2 * CONNECTIONS + 256
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, max(wanted, hard)))


def test_idle_connections_of_another_user_leave_the_cluster_serving_its_owner(
    attacker,  # noqa: F811
    cluster,
    make_workflow,
):
    """``ctxattacker`` holds 3,000 idle TCP connections to the scheduler's port and
    3,000 to a server's, sending nothing: the owner's status answers and a real run
    finishes meanwhile, and the cluster's log grows by a few KB, not a traceback per
    refused accept."""
    command, env, base = attacker
    script = base / FLOOD.name
    shutil.copy2(FLOOD, script)
    os.chmod(script, 0o644)
    ports = list(_scheduler_and_server_port(cluster))
    log = ClusterFiles(cluster).log_file
    spec = {"host": "127.0.0.1", "ports": ports, "count": CONNECTIONS, "connect_seconds": 10}
    flood = subprocess.Popen(
        [*command[:-1], str(script), json.dumps({**spec, "hold": 50})],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_attacker_limit,
    )
    try:
        before = log.stat().st_size
        assert flood.stdout is not None
        opened = json.loads(flood.stdout.readline() or "{}")
        assert opened.get("uid", 0) != 0, (opened, flood.stderr and flood.stderr.read())
        # A real flood: thousands held on each port, beyond the cluster's descriptors.
        assert all(count >= 2000 for count in opened["connected"].values()), opened
        started = time.monotonic()
        status = _status(cluster)
        assert status.returncode == 0, status.stdout + status.stderr
        assert "1 server(s) running" in status.stdout, status.stdout + status.stderr
        workdir = make_workflow(
            toy_files(
                """
                rule all:
                    input: expand("out/{i}.txt", i=range(4))

                rule use:
                    output: "out/{i}.txt"
                    resources: context="toy"
                    script: "scripts/use.py"
                """
            )
        )
        run = snakemake(
            workdir,
            "--executor",
            "context",
            "--jobs",
            "2",
            "--context-scheduler-file",
            str(cluster),
            timeout=60,
        )
        took = time.monotonic() - started
        assert flood.poll() is None, "the attacker must still hold its connections"
        run.check()
        assert all((workdir / f"out/{i}.txt").read_text() == "5" for i in range(4))
        grown = log.stat().st_size - before
        print(f"owner's status and run took {took:.1f} s; the log grew {grown} bytes")
        assert grown < LOG_GROWTH, log.read_text()[-3000:]
    finally:
        os.killpg(flood.pid, signal.SIGKILL)
        flood.communicate()


def test_a_cluster_that_does_not_answer_is_busy_not_stopped(cluster):
    """Its process runs (its pid file says so) but its port does not answer (stopped
    here with SIGSTOP, as a flood stalls it): an attaching run tries again until its
    timeout, and then it and status say it is busy, not that it has stopped and must
    be started again."""
    pid = ClusterFiles(cluster).running_pid()
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        status = _status(cluster)
        started = time.monotonic()
        with pytest.raises(ClusterError) as caught:
            ClusterConnection.attach(address=None, scheduler_file=cluster, timeout=4)
        waited = time.monotonic() - started
    finally:
        os.kill(pid, signal.SIGCONT)
    message = str(caught.value)
    assert "\n" not in message
    assert "has stopped" not in message, message
    assert f"runs (pid {pid}): it is busy or flooded" in message, message
    assert "Fix: try again in a while" in message, message
    assert message.replace("4 s", "") in status.stderr.replace("10 s", ""), status.stderr
    assert waited >= 3.5, f"tried {waited:.1f} s, not until its timeout of 4 s"


def test_a_cluster_that_answers_late_is_attached_to(cluster):
    """A scheduler stalled past the probe's 1.5 s (its process stopped for 3 s, as a
    flood under a loaded host stalled one in CI) while its process runs: attaching
    tries again and connects once it answers, instead of failing at 1.5 s."""
    pid = ClusterFiles(cluster).running_pid()
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    resume = threading.Timer(3.0, os.kill, (pid, signal.SIGCONT))
    resume.start()
    started = time.monotonic()
    try:
        connection = ClusterConnection.attach(address=None, scheduler_file=cluster, timeout=20)
    finally:
        resume.join()
        os.kill(pid, signal.SIGCONT)
    try:
        assert connection.client.scheduler_info()["id"]  # it answers
    finally:
        connection.client.close()
    assert time.monotonic() - started >= 3.0
