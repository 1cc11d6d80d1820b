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
