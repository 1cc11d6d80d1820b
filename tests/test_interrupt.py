"""Ctrl-C: Snakemake exits promptly and cleanly, and leaves nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time

import psutil
import pytest

from .conftest import BIN, HEADER, TOY_LOADER

pytestmark = pytest.mark.slow

SLOW_SCRIPT = """
import time
from snakemake_executor_context import load_context

load_context(snakemake)
with open(snakemake.output[0], "w") as f:
    f.write("partial")
    f.flush()
    time.sleep(120)
"""


def test_sigint_to_the_process_group(make_workflow):
    workdir = make_workflow(
        {
            "Snakefile": HEADER
            + textwrap.dedent("""
            rule all:
                input: "ctx/0.txt", "ctx/1.txt", "plain.txt"

            rule slow:
                output: "ctx/{i}.txt"
                resources: context="toy"
                script: "scripts/slow.py"

            rule plain:
                output: "plain.txt"
                shell: "echo partial > {output}; sleep 120"
        """),
            "loader.py": TOY_LOADER,
            "scripts/slow.py": SLOW_SCRIPT,
        }
    )
    # Like a terminal: snakemake leads its own process group, which gets the SIGINT.
    process = subprocess.Popen(
        [str(BIN / "snakemake"), "--executor", "context", "--jobs", "3", "--context-servers", "3"],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    outputs = [workdir / "ctx/0.txt", workdir / "ctx/1.txt", workdir / "plain.txt"]
    deadline = time.monotonic() + 120
    while not all(path.exists() for path in outputs):
        assert process.poll() is None, process.communicate()[0]
        assert time.monotonic() < deadline, "jobs did not start"
        time.sleep(0.2)
    time.sleep(0.5)
    started_by_run = psutil.Process(process.pid).children(recursive=True)
    assert len(started_by_run) >= 5  # cluster, 3 servers, the plain job's processes

    interrupted = time.monotonic()
    os.killpg(process.pid, signal.SIGINT)
    output, _ = process.communicate(timeout=60)
    took = time.monotonic() - interrupted

    print(f"snakemake exited {took:.1f} s after SIGINT")
    assert took < 30, output
    assert "Traceback" not in output, output
    _, alive = psutil.wait_procs(started_by_run, timeout=5)
    assert not alive, [p.info if hasattr(p, "info") else p for p in alive]
    assert not any(path.exists() for path in outputs), output
    assert "Terminating processes on user request" in output


LOOPING_SCRIPT = """
import time
from snakemake_executor_context import load_context

load_context(snakemake)
with open(snakemake.output[0], "w") as f:
    f.write("partial")
    f.flush()
    for _ in range(1200):  # Python code between short native calls, like a scoring loop
        time.sleep(0.1)
"""


def test_sigint_with_an_attached_cluster_stops_jobs_and_keeps_servers(
    make_workflow, scheduler_file
):
    workdir = make_workflow(
        {
            "Snakefile": HEADER
            + textwrap.dedent("""
            rule all:
                input: "ctx/0.txt", "ctx/1.txt"

            rule slow:
                output: "ctx/{i}.txt"
                resources: context="toy"
                script: "scripts/slow.py"
        """),
            "loader.py": TOY_LOADER,
            "scripts/slow.py": LOOPING_SCRIPT,
        }
    )
    servers_before = {p.pid for p in _servers(scheduler_file)}
    process = subprocess.Popen(
        [
            str(BIN / "snakemake"),
            "--executor",
            "context",
            "--jobs",
            "2",
            "--context-scheduler-file",
            str(scheduler_file),
        ],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    outputs = [workdir / "ctx/0.txt", workdir / "ctx/1.txt"]
    deadline = time.monotonic() + 120
    while not all(path.exists() for path in outputs):
        assert process.poll() is None, process.communicate()[0]
        assert time.monotonic() < deadline, "jobs did not start"
        time.sleep(0.2)
    interrupted = time.monotonic()
    os.killpg(process.pid, signal.SIGINT)
    output, _ = process.communicate(timeout=60)
    took = time.monotonic() - interrupted
    assert took < 30, output
    assert "Traceback" not in output, output
    assert not any(path.exists() for path in outputs)
    # The jobs stopped inside the servers, which stay up with their contexts.
    assert {p.pid for p in _servers(scheduler_file)} == servers_before
    logs = list((workdir / ".snakemake/context/logs/slow").glob("*.log"))
    assert len(logs) == 2 and all("cancelled on" in p.read_text() for p in logs)


def _servers(scheduler_file) -> list[psutil.Process]:
    import json

    pid = json.loads(scheduler_file.with_suffix(".pid").read_text())["pid"]
    return [p for p in psutil.Process(pid).children(recursive=True)]
