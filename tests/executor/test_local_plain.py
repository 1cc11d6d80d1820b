"""Plain jobs run in Snakemake's own process on the embedded cluster: a mixed workflow
gives what ``--executor local`` gives, and no signal leaves a job's process behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from snakemake_executor_context.executor.localjobs import WATCH_SECONDS
from tests.conftest import BIN, context_run, default_sigint, snakemake, toy_files
from tests.e2e.test_execution import _cluster_processes

pytestmark = pytest.mark.slow

MIXED = toy_files(
    """
    rule all:
        input: expand("final/{i}.txt", i=range(3)), "grouped/b.txt", "retried.txt"

    rule ctx:
        output: "ctx/{i}.txt"
        resources: context="toy"
        script: "scripts/ctx.py"

    rule sh:
        input: "ctx/{i}.txt"
        output: temp("sh/{i}.txt")
        log: "logs/sh/{i}.log"
        benchmark: "bench/sh/{i}.tsv"
        shell: "cat {input} > {output}; echo done {wildcards.i} > {log}"

    rule py:
        input: "sh/{i}.txt", "run.txt"
        output: "final/{i}.txt"
        script: "scripts/plain.py"

    rule runner:
        output: "run.txt"
        run:
            with open(output[0], "w") as f:
                f.write(f"run {rule}\\n")

    rule ga:
        input: "run.txt"
        output: "grouped/a.txt"
        group: 0
        shell: "cp {input} {output}"

    rule gb:
        input: "grouped/a.txt"
        output: "grouped/b.txt"
        group: 0
        shell: "cat {input} {input} > {output}"

    rule retry:
        output: "retried.txt"
        log: "logs/retry.log"
        retries: 2
        shell: "if [ -e attempt ]; then echo ok > {output}; else touch attempt; exit 1; fi"
    """,
    {
        "scripts/ctx.py": textwrap.dedent("""
        from snakemake_executor_context import load_context

        obj = load_context(snakemake)
        with open(snakemake.output[0], "w") as f:
            f.write(f"{obj['value']} {snakemake.wildcards.i}\\n")
    """),
        "scripts/plain.py": textwrap.dedent("""
        with open(snakemake.output[0], "w") as f:
            f.write("plain " + open(snakemake.input[0]).read() + open(snakemake.input[1]).read())
    """),
    },
)


def _files(workdir: Path) -> dict[str, bytes]:
    """Every file the run left, by path (not Snakemake's own directory, nor Python's
    bytecode of the loader, whose header holds its source's mtime; benchmark files
    hold times, so only their header)."""
    found = {}
    for path in sorted(workdir.rglob("*")):
        relative = path.relative_to(workdir).as_posix()
        if path.is_file() and not relative.startswith((".snakemake/", "__pycache__/")):
            data = path.read_bytes()
            found[relative] = data.splitlines()[0] if relative.startswith("bench/") else data
    return found


def test_a_mixed_workflow_matches_local_on_the_embedded_cluster(make_workflow):
    local = make_workflow(MIXED, "local")
    snakemake(local, "--executor", "local", "--cores", "2").check()
    embedded = make_workflow(MIXED, "embedded")
    run = context_run(embedded, "--context-servers", "2").check()

    assert _files(embedded) == _files(local)
    assert not (embedded / "sh").exists() or not any((embedded / "sh").iterdir())  # temp
    assert "plain rules run locally: py, retry, sh." in run.output
    (summary,) = run.summaries()
    assert len(summary["jobs"]) == 5, summary  # 3 context jobs, the group, the run: job


def test_a_mixed_workflow_matches_local_on_an_attached_cluster(make_workflow, scheduler_file):
    local = make_workflow(MIXED, "local")
    snakemake(local, "--executor", "local", "--cores", "2").check()
    attached = make_workflow(MIXED, "attached")
    run = context_run(attached, "--context-scheduler-file", str(scheduler_file)).check()

    assert _files(attached) == _files(local)
    assert "plain rules run locally" not in run.output  # servers run them by default


SLOW_RUN = {
    "Snakefile": textwrap.dedent("""
    rule all:
        input: "a.txt"

    rule slow:
        output: "{x}.txt"
        run:
            import time

            open(output[0], "w").write("partial")
            time.sleep(120)
    """)
}


def _slow_run_started(workdir: Path) -> subprocess.Popen:
    """`snakemake --executor context` of :data:`SLOW_RUN` in its own session, once its
    job has written its partial output."""
    process = subprocess.Popen(
        [str(BIN / "snakemake"), "--executor", "context", "--jobs", "2"],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=default_sigint,
    )
    deadline = time.monotonic() + 120
    while not (workdir / "a.txt").exists():
        assert process.poll() is None, process.communicate()[0]
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError("the job did not start")
        time.sleep(0.2)
    return process


def test_ctrl_c_stops_a_run_job_at_once(make_workflow):
    """A `run:` job stays on the servers: in a thread of Snakemake's process its Python
    could not be stopped, and Snakemake would wait for it to end."""
    workdir = make_workflow(SLOW_RUN)
    process = _slow_run_started(workdir)
    os.killpg(process.pid, signal.SIGINT)
    output, _ = process.communicate(timeout=60)  # not the run: block's 120 s
    assert process.returncode != 0
    assert not (workdir / "a.txt").exists(), output


SLOW_PLAIN = {
    "Snakefile": textwrap.dedent("""
    rule all:
        input: "a.txt", "b.txt"

    rule slow:
        output: "{x}.txt"
        shell: "echo partial > {output}; sleep 120; echo never"
    """)
}


def _name(process: psutil.Process) -> str | None:
    """A process's name; None once it is gone (the cluster's start runs short ones)."""
    try:
        return process.name()
    except psutil.Error:
        return None


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_a_signal_to_snakemake_leaves_no_local_job_process(make_workflow, how):
    workdir = make_workflow(SLOW_PLAIN)
    process = subprocess.Popen(
        [str(BIN / "snakemake"), "--executor", "context", "--jobs", "2"],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=default_sigint,
    )
    outputs = [workdir / "a.txt", workdir / "b.txt"]
    deadline = time.monotonic() + 120
    while not all(path.exists() for path in outputs):
        assert process.poll() is None, process.communicate()[0]
        assert time.monotonic() < deadline, "jobs did not start"
        time.sleep(0.2)
    # Both jobs run locally, below Snakemake: their shells start `sleep` after writing,
    # and the watchdog has had a snapshot of them (one every WATCH_SECONDS).
    while True:
        started = psutil.Process(process.pid).children(recursive=True)
        sleeping = [p for p in started if _name(p) == "sleep"]
        shells = [p for p in started if _name(p) == "bash"]
        if len(sleeping) == 2 and all(
            time.time() - p.create_time() > 2 * WATCH_SECONDS for p in shells
        ):
            break
        assert time.monotonic() < deadline, started
        time.sleep(0.1)

    os.kill(process.pid, getattr(signal, how))  # Snakemake's PID only, not its group
    output, _ = process.communicate(timeout=60)

    _, alive = psutil.wait_procs(sleeping, timeout=10)
    assert not alive, (alive, output)
    # The embedded cluster stops itself once Snakemake is gone (slower under load).
    _, alive = psutil.wait_procs(started, timeout=30)
    assert not alive, (alive, output)
    if how != "SIGKILL":
        assert process.returncode != 0
        assert not any(path.exists() for path in outputs), output


def test_a_process_a_job_leaves_running_on_purpose_survives_a_normal_end(make_workflow):
    workdir = make_workflow(
        {
            "Snakefile": textwrap.dedent("""
            rule daemon:
                output: "started.txt"
                shell: "nohup sleep 41.25 > /dev/null 2>&1 & echo $! > {output}; sleep 1"
            """)
        }
    )
    context_run(workdir).check()
    time.sleep(1.5)  # longer than the watchdog's snapshot period
    daemon = psutil.Process(int((workdir / "started.txt").read_text()))
    try:
        assert daemon.is_running() and "41.25" in " ".join(daemon.cmdline())
    finally:
        daemon.kill()


def test_ctrl_c_during_the_status_check_removes_the_partial_output(make_workflow):
    """Snakemake empties its list of active jobs while the executor checks them; a
    Ctrl-C then hands the executor no jobs. The scheduler is stopped (SIGSTOP) so that
    the check's next call to it waits, and Ctrl-C comes during that wait: the run:
    job's partial output is still removed (it was kept before the executor used its
    own list)."""
    workdir = make_workflow(SLOW_RUN)
    process = _slow_run_started(workdir)
    scheduler = None
    try:
        (scheduler,) = _cluster_processes(workdir)
        scheduler.suspend()
        # The executor checks the fleet every 2 s: within 3 s its check is waiting on
        # the stopped scheduler, with Snakemake's list of active jobs empty.
        time.sleep(3)
        assert process.poll() is None, process.communicate()[0]
        os.killpg(process.pid, signal.SIGINT)
        time.sleep(1)
        with contextlib.suppress(psutil.NoSuchProcess):  # the run's end may kill it first
            scheduler.resume()
        output, _ = process.communicate(timeout=90)
    finally:
        if scheduler is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                scheduler.resume()
        if process.poll() is None:
            process.kill()
    assert process.returncode != 0
    assert not (workdir / "a.txt").exists(), output
