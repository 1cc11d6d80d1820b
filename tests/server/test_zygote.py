"""A server's zygote: which job commands it takes, a real Snakemake run from it, and
Ctrl-C stopping the jobs it forked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from importlib.metadata import version
from pathlib import Path

import psutil
import pytest

from snakemake_executor_context.server.zygote import Zygote, parse_command
from tests.conftest import BIN, default_sigint

PY = sys.executable


def test_it_takes_snakemake_job_commands_with_exported_variables():
    command = (
        f"export A='1' B='x y' && {PY} -m snakemake "
        "--snakefile /w/Snakefile --target-jobs 'echo:i=3'"
    )
    assert parse_command(command) == (
        {"A": "1", "B": "x y"},
        ["--snakefile", "/w/Snakefile", "--target-jobs", "echo:i=3"],
    )
    assert parse_command(f"{PY} -m snakemake --cores all") == ({}, ["--cores", "all"])


@pytest.mark.parametrize(
    "command",
    [
        f"module load x && {PY} -m snakemake --cores all",  # a --precommand
        "/other/python -m snakemake --cores all",  # another Python
        f"{PY} -m snakemake --cores all && touch done",  # a suffix
        f"{PY} -c 'print(1)'",
        "export A && true",
        "'unbalanced",
    ],
)
def test_other_commands_run_as_a_fresh_process(command):
    assert parse_command(command) is None


@pytest.mark.slow
def test_a_forked_job_runs_snakemake_in_its_directory_with_its_environment(tmp_path):
    (tmp_path / "Snakefile").write_text(
        'rule all:\n    output: "out.txt"\n    shell: "echo $GREETING > {output}"\n'
    )
    zygote = Zygote()
    env = {**os.environ, "GREETING": "hello"}
    assert zygote.usable(env)
    log = tmp_path / "job.log"
    job = zygote.start(["--cores", "1", "--quiet", "all"], str(tmp_path), env, str(log))
    assert job.pid > 0 and job.wait() == 0, log.read_text()
    assert (tmp_path / "out.txt").read_text() == "hello\n"

    failing = zygote.start(["--cores", "1", "nothing.txt"], str(tmp_path), env, str(log))
    assert failing.wait() == 1
    assert "MissingRuleException" in log.read_text() or "nothing.txt" in log.read_text()
    assert not zygote.usable({**env, "PYTHONPATH": "/elsewhere"})

    versions = zygote.start(["--version"], str(tmp_path), env, str(log))
    assert versions.wait() == 0 and version("snakemake") in log.read_text()


def _sleepers(marker: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if marker in " ".join(process.info["cmdline"] or []):
            found.append(process)
    return found


def _interrupt_when_running(workdir: Path, marker: str, *args: str) -> str:
    """Start snakemake, wait for the job's sleep, SIGINT its process group; its output."""
    process = subprocess.Popen(
        [str(BIN / "snakemake"), "--executor", "context", "--jobs", "2", *args],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=default_sigint,
    )
    deadline = time.monotonic() + 120
    while not _sleepers(marker):
        assert process.poll() is None, process.communicate()[0]
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGINT)
    return process.communicate(timeout=60)[0]


@pytest.mark.slow
def test_ctrl_c_stops_a_group_job_forked_on_the_embedded_cluster(make_workflow):
    marker = "sleep 97.25"
    workdir = make_workflow(
        {
            "Snakefile": textwrap.dedent(f"""
            rule all:
                input: "b.txt"

            rule a:
                output: "a.txt"
                group: 0
                shell: "echo a > {{output}}"

            rule b:
                input: "a.txt"
                output: "b.txt"
                group: 0
                shell: "{marker}; cp {{input}} {{output}}"
            """)
        }
    )
    output = _interrupt_when_running(workdir, marker)
    _, alive = psutil.wait_procs(_sleepers(marker), timeout=10)
    assert not alive, output
    assert not (workdir / "b.txt").exists()


@pytest.mark.slow
def test_ctrl_c_stops_a_plain_job_on_an_attached_cluster(make_workflow, scheduler_file):
    marker = "sleep 97.5"
    workdir = make_workflow(
        {
            "Snakefile": textwrap.dedent(f"""
            rule all:
                input: "a.txt"

            rule a:
                output: "a.txt"
                shell: "echo partial > {{output}}; {marker}"
            """)
        }
    )
    output = _interrupt_when_running(
        workdir, marker, "--context-scheduler-file", str(scheduler_file)
    )
    _, alive = psutil.wait_procs(_sleepers(marker), timeout=15)
    assert not alive, output
    assert not (workdir / "a.txt").exists(), output
