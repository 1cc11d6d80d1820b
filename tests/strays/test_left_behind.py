"""Nothing a job leaves running outlives it, on a persistent cluster where it would
pile up: what a context job double-forks or never waits for, and what a shell rule
on a server ``setsid``s, are ended at the job's end and named in its log; a process
started with ``SNAKEMAKE_CONTEXT_KEEP=1`` is kept; a failing shell rule still fails;
a server killed while its job's daemon runs leaves nothing (its nanny ends it)."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from snakemake_executor_context.strays.processes import pid_alive
from tests.conftest import (
    BIN,
    TOY_LOADER,
    context_run,
    persistent_cluster,
    plain_dask_cluster,
    toy_files,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def one_server(tmp_path_factory) -> Iterator[Path]:
    """`snakemake-context up` with one server (one slot): plain jobs run there too."""
    with persistent_cluster(tmp_path_factory.mktemp("cluster"), "--servers", "1") as path:
        yield path


def _wait(condition: Callable[[], object], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} after {seconds} s"
        time.sleep(0.05)


def _pids(path: Path) -> list[int]:
    return [int(word) for word in path.read_text().split()]


def _log(workdir: Path, rule: str) -> str:
    (log,) = (workdir / ".snakemake" / "context" / "logs" / rule).glob("*.log")
    return log.read_text()


#: A double fork whose grandchild is a `sleep` (in a session of its own), and a
#: child the script never waits for.
DETACHING = """
import os, subprocess

read, write = os.pipe()
first = os.fork()
if first == 0:
    os.setsid()
    second = os.fork()
    if second == 0:
        os.execvp("sleep", ["sleep", "301"])
    os.write(write, str(second).encode())
    os._exit(0)
os.close(write)
os.waitpid(first, 0)
detached = int(os.read(read, 64))
unwaited = subprocess.Popen(["sleep", "302"])
with open(snakemake.output[0], "w") as f:
    f.write(f"{detached} {unwaited.pid}")
"""

LEAVING = textwrap.dedent("""
    rule all:
        input: "ctx.pids", "sh.pid", "kept.pid"

    rule ctx:
        output: "ctx.pids"
        resources: context="toy"
        script: "scripts/detaching.py"

    rule sh:
        output: "sh.pid"
        shell: "setsid sleep 303 >/dev/null 2>&1 </dev/null & echo $! > {output}"

    rule keep:
        output: "kept.pid"
        shell: "SNAKEMAKE_CONTEXT_KEEP=1 setsid sleep 304 >/dev/null 2>&1 & echo $! > {output}"
""")


def test_what_jobs_leave_running_is_ended_and_named_but_a_kept_process(make_workflow, one_server):
    workdir = make_workflow(toy_files(LEAVING, {"scripts/detaching.py": DETACHING}))
    run = context_run(workdir, "--context-scheduler-file", str(one_server))
    (kept,) = _pids(workdir / "kept.pid") if (workdir / "kept.pid").exists() else [0]
    try:
        run.check()
        detached, unwaited = _pids(workdir / "ctx.pids")
        (setsid,) = _pids(workdir / "sh.pid")
        for pid in (detached, unwaited, setsid):
            _wait(lambda pid=pid: not pid_alive(pid), 10, f"{pid} still runs")
        ctx_log, sh_log, keep_log = (_log(workdir, rule) for rule in ("ctx", "sh", "keep"))
        assert f"{detached} (sleep 301)" in ctx_log and f"{unwaited} (sleep 302)" in ctx_log
        assert "The job left 2 process(es) running on cpu0" in ctx_log
        assert f"{setsid} (sleep 303)" in sh_log
        # The way out: kept, and named as kept.
        assert pid_alive(kept)
        assert f"on purpose (SNAKEMAKE_CONTEXT_KEEP=1), kept until the server ends: {kept}" in (
            keep_log
        )
        # The run's output names them too.
        assert f"{setsid} (sleep 303)" in run.output
    finally:
        if kept:
            subprocess.run(["kill", str(kept)], check=False)


FAILING = textwrap.dedent("""
    rule all:
        input: "status.txt", "failed.txt"

    rule status:
        output: "status.txt"
        resources: context="toy"
        script: "scripts/status.py"

    rule failed:
        output: "failed.txt"
        shell: "touch {output}; exit 3"
""")
#: Many times: a reaper that polls for any child takes one now and then (1 in 20 here).
STATUS = """
import subprocess

statuses = {subprocess.run(["sh", "-c", "exit 3"]).returncode for _ in range(60)}
with open(snakemake.output[0], "w") as f:
    f.write(" ".join(map(str, sorted(statuses))))
"""


def test_a_failing_shell_rule_on_a_server_still_fails(make_workflow, one_server):
    """No reaper takes an exit status: the rule's `exit 3` fails it (its output,
    already written, would otherwise stand), and a context job's subprocesses see 3."""
    workdir = make_workflow(toy_files(FAILING, {"scripts/status.py": STATUS}))
    run = context_run(workdir, "--context-scheduler-file", str(one_server), "--keep-going")
    assert run.returncode != 0, run.output
    assert "Error in rule failed" in run.output, run.output
    assert not (workdir / "failed.txt").exists()
    assert (workdir / "status.txt").read_text() == "3"


HELPER_LOADER = """
import subprocess

def load(value=1):
    helper = subprocess.Popen(["sleep", "307"], start_new_session=True)
    return {"value": value, "helper": helper.pid}
"""
USE_HELPER = """
from snakemake_executor_context import load_context

with open(snakemake.output[0], "w") as f:
    f.write(str(load_context(snakemake)["helper"]))
"""
WITH_HELPER = textwrap.dedent("""
    rule use:
        output: "helper.pid"
        resources: context="toy"
        script: "scripts/use.py"
""")


def test_what_a_contexts_loader_starts_lives_as_long_as_the_context(make_workflow, one_server):
    """Not the leftover of the job that loaded it: ended when the context is evicted
    (here at once: a context-agnostic run drops it at its job's end)."""
    workdir = make_workflow(
        toy_files(WITH_HELPER, {"loader.py": HELPER_LOADER, "scripts/use.py": USE_HELPER})
    )
    attach = ("--context-scheduler-file", str(one_server))
    context_run(workdir, *attach).check()
    (helper,) = _pids(workdir / "helper.pid")
    try:
        assert pid_alive(helper)
        context_run(workdir, *attach, "--context-tuning", "agnostic", "--forcerun", "use").check()
        assert _pids(workdir / "helper.pid") == [helper]  # the same context, reused
        _wait(lambda: not pid_alive(helper), 10, f"the helper {helper} still runs")
    finally:
        subprocess.run(["kill", str(helper)], check=False, capture_output=True)


POOLS = textwrap.dedent("""
    rule all:
        input: "a.txt", "b.txt"

    rule pool:
        output: "{x}.txt"
        resources: context="toy"
        script: "scripts/pool.py"
""")
POOL = """
import multiprocessing

if __name__ == "__main__":
    with multiprocessing.get_context("forkserver").Pool(1) as pool:
        result = pool.map(abs, [-3])
    with open(snakemake.output[0], "w") as f:
        f.write(str(result))
"""


def test_the_interpreters_forkserver_is_not_a_jobs_leftover(make_workflow, one_server):
    """The first job's pool starts multiprocessing's forkserver, which the server's
    interpreter keeps for the next job's pool: ended and reaped, the next job would
    fail (ChildProcessError) when it asks whether it still runs."""
    workdir = make_workflow(toy_files(POOLS, {"scripts/pool.py": POOL}))
    context_run(workdir, "--context-scheduler-file", str(one_server), "--jobs", "1").check()
    assert (workdir / "a.txt").read_text() == (workdir / "b.txt").read_text() == "[3]"


KILLED = textwrap.dedent("""
    rule ctx:
        output: "done.txt"
        resources: context="toy"
        script: "scripts/daemon.py"
""")
#: First attempt: start a daemon, say where, and wait to be killed; the rerun ends.
DAEMON = """
import os, subprocess, time

if not os.path.exists("running.txt"):
    daemon = subprocess.Popen(["sleep", "305"], start_new_session=True)
    with open("running.tmp", "w") as f:
        f.write(f"{os.getpid()} {daemon.pid}")
    os.rename("running.tmp", "running.txt")
    time.sleep(300)
with open(snakemake.output[0], "w") as f:
    f.write("done")
"""


def _kill_the_server_under_its_daemon(
    workdir: Path, scheduler_file: Path, *args: str
) -> subprocess.Popen:
    """Run the workflow; once its job's daemon runs, SIGKILL the job's server and
    wait until the daemon is gone. Returns the run's process, still running."""
    process = subprocess.Popen(
        [
            str(BIN / "snakemake"),
            *("--executor", "context", "--jobs", "1"),
            *("--context-scheduler-file", str(scheduler_file)),
            *args,
        ],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    running = workdir / "running.txt"
    try:
        _wait(lambda: running.exists() or process.poll() is not None, 120, "no job ran")
        assert running.exists(), process.communicate()[0]
        server, daemon = _pids(running)
        assert pid_alive(daemon)
        subprocess.run(["kill", "-KILL", str(server)], check=True)
        _wait(lambda: not pid_alive(daemon), 30, f"the daemon {daemon} still runs")
    except BaseException:
        process.kill()
        raise
    return process


def test_a_server_killed_while_its_jobs_daemon_runs_leaves_nothing(make_workflow, one_server):
    workdir = make_workflow(toy_files(KILLED, {"scripts/daemon.py": DAEMON}))
    process = _kill_the_server_under_its_daemon(workdir, one_server)
    try:
        output, _ = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, output  # the job ran again on the new server
    (_, daemon) = _pids(workdir / "running.txt")
    log = one_server.with_suffix(".log").read_text()
    assert "server cpu0: ended" in log and f"{daemon} (sleep 305)" in log, log[-3000:]


def _start_a_daemon() -> tuple[int, int]:
    """Run in a server: start a daemon there; (the server's pid, the daemon's)."""
    daemon = subprocess.Popen(["sleep", "308"], start_new_session=True)
    return os.getpid(), daemon.pid


def test_a_pilots_nanny_ends_what_its_killed_server_left(tmp_path):
    """A pilot's worker is Dask's own `dask worker` with the pilot's preloads (here
    without a batch system): its nanny is the subreaper that ends what the server
    started (a task stands for a job: the server's mark is on all it starts)."""
    from distributed import Client

    preloads = ("--preload", "snakemake_executor_context.server.pilot")
    preloads += ("--preload-nanny", "snakemake_executor_context.strays.nannysweep")
    with (
        plain_dask_cluster(tmp_path, *preloads) as scheduler_file,
        Client(scheduler_file=str(scheduler_file), timeout=30) as client,
    ):
        server, daemon = client.submit(_start_a_daemon, pure=False).result(timeout=60)
        try:
            assert pid_alive(daemon)
            os.kill(server, signal.SIGKILL)
            _wait(lambda: not pid_alive(daemon), 30, f"the daemon {daemon} still runs")
            # The new server is up before the cluster stops (a nanny closed while it
            # starts one does not end).
            _wait(lambda: _servers(client) - {server}, 60, "no new server")
        finally:
            subprocess.run(["kill", str(daemon)], check=False, capture_output=True)


def _servers(client: Any) -> set[int]:
    try:
        return set(client.run(os.getpid, wait=True).values())
    except Exception:
        return set()


LOADER_OF_SLOTS = TOY_LOADER.replace(
    "def load(value=1):",
    "from snakemake_executor_context import declare_job_memory\n\ndef load(value=1):\n"
    "    declare_job_memory(10_000_000)",
)
TOGETHER = textwrap.dedent("""
    rule all:
        input: "a.pid", "b.pid"

    rule ctx:
        output: "{x}.pid"
        resources: context="toy"
        script: "scripts/together.py"
""")
#: Each starts a daemon, then waits until the other has started its own.
TOGETHER_SCRIPT = """
import os, subprocess, time

me, other = snakemake.wildcards.x, {"a": "b", "b": "a"}[snakemake.wildcards.x]
daemon = subprocess.Popen(["sleep", "306"], start_new_session=True)
open(f"{me}.started", "w").close()
deadline = time.time() + 60
while not os.path.exists(f"{other}.started") and time.time() < deadline:
    time.sleep(0.02)
with open(snakemake.output[0], "w") as f:
    f.write(str(daemon.pid))
"""


def test_what_jobs_in_slots_leave_together_is_named_in_each_ones_story(make_workflow):
    """Two in-process jobs at once on one server: whose daemon is whose cannot be
    told, so both are ended once the last one ends, and both stories name them."""
    workdir = make_workflow(
        toy_files(TOGETHER, {"loader.py": LOADER_OF_SLOTS, "scripts/together.py": TOGETHER_SCRIPT})
    )
    context_run(workdir, "--context-servers", "1", "--context-slots", "2").check()
    daemons = sorted(_pids(workdir / "a.pid") + _pids(workdir / "b.pid"))
    for job in ("ctx(x=a)", "ctx(x=b)"):
        told = subprocess.run(
            [str(BIN / "snakemake-context"), "story", job],
            cwd=workdir,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert told.returncode == 0, told.stderr
        line = next(line for line in told.stdout.splitlines() if "leftovers" in line)
        assert "The 2 in-process jobs that ran together left 2 process(es)" in line, line
        assert all(f"{pid} (sleep 306)" in line for pid in daemons), line
