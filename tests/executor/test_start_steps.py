"""What starts the embedded cluster, and what must not.

Snakemake commands that end before an executor exists (``--help``, ``--dry-run``,
``--lint``, a Snakefile that does not parse, a DAG that cannot be built) start no
cluster and leave nothing behind; a run's own Snakemake process imports what its
client needs and nothing the cluster or the servers need.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import BIN, context_run
from tests.e2e.test_execution import _cluster_processes

MISSING_INPUT = """
rule all:
    input: "never-made.txt"
"""


def _family_of(mark: str) -> list[psutil.Process]:
    """Processes whose command line holds ``mark``, and their descendants."""
    family = []
    for process in psutil.process_iter(["cmdline"]):
        if mark in " ".join(process.info["cmdline"] or ()):
            try:
                family += [process, *process.children(recursive=True)]
            except psutil.Error:
                continue
    return family


@pytest.mark.parametrize(
    ("case", "args"),
    [
        ("help", ["--help"]),
        ("dry-run", ["--dry-run"]),
        ("lint", ["--lint"]),
        ("syntax error", []),
        ("missing input", []),
    ],
)
def test_commands_that_end_before_the_executor_start_no_cluster(workflow, case, args):
    workdir = workflow("reuse")
    if case == "syntax error":
        (workdir / "Snakefile").write_text("rule all:\n    input: (\n")
    if case == "missing input":
        (workdir / "Snakefile").write_text(MISSING_INPUT)
    run = context_run(workdir, *args, "--config", "count=2", env={"TOY_LOAD_SECONDS": "0"})
    if case == "lint":  # it exits 1 when it has something to say
        assert "Lints for rule use" in run.output, run.output
    else:
        assert (run.returncode != 0) == (case in ("syntax error", "missing input")), run.output
    if case == "dry-run":
        assert "This was a dry-run" in run.output, run.output
    assert not (workdir / ".snakemake" / "context").exists(), sorted(workdir.rglob("*"))
    assert not (workdir / "out").exists()
    assert not _cluster_processes(workdir)
    assert "Traceback" not in run.output or case == "syntax error", run.output


# Run in place of the `snakemake` script: the modules its process held at its exit.
MODULES_AT_EXIT = """
import atexit, runpy, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write("\\n".join(sorted(sys.modules))))
sys.argv[0] = sys.argv[1]
del sys.argv[1]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_runs_own_process_imports_neither_the_servers_nor_postgresql(workflow, tmp_path):
    workdir = workflow("reuse")
    listing = tmp_path / "modules.txt"
    command = [sys.executable, "-c", MODULES_AT_EXIT, str(listing), str(BIN / "snakemake")]
    command += ["--executor", "context", "--jobs", "2", "--context-servers", "2"]
    command += ["--config", "count=2", "sleep=0"]
    done = subprocess.run(
        command, cwd=workdir, capture_output=True, text=True, timeout=300,
        env={**os.environ, "TOY_LOAD_SECONDS": "0"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(list((workdir / "out").iterdir())) == 2
    modules = set(listing.read_text().split())
    assert "distributed" in modules and "snakemake_executor_context.server.calls" in modules
    # The servers' modules are imported where they run; PostgreSQL's dialect only for a
    # catalog there.
    unwanted = {
        "snakemake_executor_context.server.plugin",
        "snakemake_executor_context.server.server",
    }
    unwanted.add("sqlalchemy.dialects.postgresql")
    assert not modules & unwanted, modules & unwanted


def test_a_ctrl_c_while_this_process_imports_during_the_start_kills_the_cluster(tmp_path):
    """The run's own imports happen while its cluster starts (``meanwhile``); a Ctrl-C
    in them stops the start, and the cluster process and what it began are gone."""
    from snakemake_executor_context.cluster.process import LocalClusterProcess

    scheduler_file = tmp_path / "cluster" / "scheduler.json"
    began: list[psutil.Process] = []

    def interrupted() -> None:
        deadline = time.monotonic() + 30
        while len(began) < 3 and time.monotonic() < deadline:  # the forkserver is up
            time.sleep(0.05)
            began[:] = _family_of(str(tmp_path))
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        LocalClusterProcess.start(
            scheduler_file, servers=1, memory_budget="1GB", timeout=60, meanwhile=interrupted
        )
    assert len(began) >= 3, began  # the cluster, its resource tracker and forkserver
    _, alive = psutil.wait_procs(began, timeout=10)
    assert not alive, alive
