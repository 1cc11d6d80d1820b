"""A pool's batch-system commands: looked up before any cluster starts, and a failed
submission while the run goes on ends the run in one line (security issue 66: a run
with ``backend=slurm`` and no ``sbatch`` on PATH waited in silence past 200 s, its only
trace a 30-line traceback in the cluster's log)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from snakemake_executor_context.pilots.batch.registry import BACKENDS
from tests.conftest import BIN, snakemake

#: A rule a pilot would run.
ONE_GPU_RULE = 'rule all:\n    output: "a.txt"\n    resources: gpu=1\n    shell: "touch {output}"\n'


def _line(output: str, *parts: str) -> str:
    """The one line of ``output`` holding every one of ``parts``."""
    found = [line for line in output.splitlines() if all(part in line for part in parts)]
    assert len(found) == 1, output
    return found[0]


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_up_refuses_a_backend_whose_commands_are_not_on_path(tmp_path: Path, backend: str) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    scheduler_file = tmp_path / "scheduler.json"
    sge = ["--directive", "-pe smp 1"] if backend == "sge" else []
    up = [str(BIN / "snakemake-context"), "up", "--scheduler-file", str(scheduler_file)]
    done = subprocess.run(
        [*up, "--backend", backend, *sge],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": str(empty)},
    )
    assert done.returncode == 1 and done.stdout == "", done.stdout + done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    submit = BACKENDS[backend].commands()[0]
    _line(done.stderr, f"backend={backend}", submit, "not on PATH", "Fix:")
    assert not scheduler_file.exists()


def test_a_run_without_sbatch_is_refused_at_start_naming_it(make_workflow, tmp_path: Path) -> None:
    workdir = make_workflow({"Snakefile": ONE_GPU_RULE})
    empty = tmp_path / "bin"
    empty.mkdir()
    started = time.monotonic()
    run = snakemake(
        workdir,
        *["--executor", "context", "--jobs", "1", "--context-pilots", "backend=slurm"],
        timeout=120,
        env={"PATH": str(empty)},
    )
    assert run.returncode != 0, run.output
    line = _line(run.output, "--context-pilots backend=slurm", "sbatch", "not on PATH")
    assert "Fix:" in line
    assert time.monotonic() - started < 60
    assert not (workdir / "a.txt").exists()
    assert not list((workdir / ".snakemake" / "context").glob("cluster/*.json"))


def test_a_failed_submission_is_one_line_naming_the_command_and_what_it_said() -> None:
    """dask-jobqueue's own errors (its RuntimeError lists the exit code, stdout and
    stderr; a command that cannot run raises an OSError), read into one line."""
    import asyncio

    from dask_jobqueue.core import Job

    from snakemake_executor_context.pilots.jobqueue import submission_failed

    said = "echo 'Submitted?'; printf '\\nsbatch: error: Invalid account\\nmore\\n' >&2; exit 1"
    for command, line in [
        (["sh", "-c", said], "sbatch failed (exit 1): sbatch: error: Invalid account"),
        (["/nonexistent/sbatch"], "sbatch could not run: [Errno 2] No such file or directory"),
    ]:
        with pytest.raises(Exception) as raised:
            asyncio.run(Job._call(command))
        found = submission_failed("sbatch --parsable", raised.value)
        assert found.startswith(line) and "\n" not in found, found


def test_a_run_whose_sbatch_fails_ends_in_one_line_naming_it(make_workflow, tmp_path: Path) -> None:
    """A real run against a pool whose sbatch exits 1 with a message: it ends, non-zero,
    within seconds, naming sbatch and the first line it said (it waited in silence)."""
    import os

    from tests.conftest import fake_commands

    workdir = make_workflow({"Snakefile": ONE_GPU_RULE})
    bin_dir = fake_commands(tmp_path / "bin", "exit 0\n", ["scancel", "scontrol"])
    said = "sbatch: error: Batch job submission failed: Invalid account or account/partition"
    fake_commands(bin_dir, f"echo '{said}' >&2\necho 'more' >&2\nexit 1\n", ["sbatch"])
    started = time.monotonic()
    run = snakemake(
        workdir,
        *["--executor", "context", "--jobs", "1", "--context-pilots", "backend=slurm"],
        timeout=120,
        env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"},
    )
    took = time.monotonic() - started
    assert run.returncode != 0, run.output
    line = _line(run.output, "Context executor: the pilots cannot be submitted", said)
    assert "sbatch failed (exit 1)" in line and "Fix:" in line
    assert took < 60, (took, run.output)
    assert not (workdir / "a.txt").exists()
