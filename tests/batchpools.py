"""What the tests on a real batch system share (``tests/pilots/test_batch_scenarios.py``,
``test_slurm.py``): the skip that CI turns into a failure, the daemons'
pid files, waiting for the queue, a pool of pilots started with ``snakemake-context
up``, and each system's queue and accounting read as the tests read them."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from tests.conftest import BIN


def skip_unless_required(reason: str, required_by: str) -> None:
    """Skip with ``reason``, or fail where the environment variable ``required_by`` is
    1 (CI sets it: there the batch system must be there)."""
    if os.environ.get(required_by) == "1":
        pytest.fail(f"{reason}, and {required_by}=1")
    pytest.skip(reason)


def running(pidfile: str, comm: str) -> bool:
    """Whether the process a daemon's pid file names is alive and is ``comm``."""
    try:
        pid = int(Path(pidfile).read_text().strip())
        return Path(f"/proc/{pid}/comm").read_text().strip() == comm
    except (OSError, ValueError):
        return False


def wait(predicate: Callable[[], object], timeout: float, what: str) -> object:
    """``predicate``'s first true value, polled every 0.5 s for ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def pilot_pool(
    tmp_path: Path,
    backend: str,
    fixed: Sequence[str],
    pilots: Callable[[], list],
    leave_seconds: float,
) -> Iterator[Callable[..., Path]]:
    """A pool fixture's body: ``up(*options)`` starts `snakemake-context up --backend
    <backend>` with ``fixed`` and ``options``; every pool started is stopped after, and
    the fixture waits for its pilots (``pilots()``) to leave the queue."""
    started: list[Path] = []

    def up(*options: str) -> Path:
        scheduler_file = tmp_path / f"pool{len(started)}" / "scheduler.json"
        result = subprocess.run(
            [
                str(BIN / "snakemake-context"),
                "up",
                "--scheduler-file",
                str(scheduler_file),
                "--backend",
                backend,
                "--pilot-memory",
                "1GB",
                "--walltime",
                "00:20:00",
                "--pilot-log-dir",
                str(tmp_path / "pilot-logs"),
                *fixed,
                *options,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        started.append(scheduler_file)
        return scheduler_file

    try:
        yield up
    finally:
        for scheduler_file in started:
            subprocess.run(
                [str(BIN / "snakemake-context"), "down", "--scheduler-file", str(scheduler_file)],
                capture_output=True,
                timeout=60,
            )
        wait(lambda: not pilots(), leave_seconds, "the pilots to leave the queue")


def pool_books(scheduler_file: Path) -> dict:
    """The pool's books, as `snakemake-context status --json` reports them."""
    out = subprocess.run(
        [
            str(BIN / "snakemake-context"),
            "status",
            "--json",
            "--scheduler-file",
            str(scheduler_file),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout).get("pool") or {}


def batch_system(
    name: str, scripts: Path, pidfile: str, comm: str, required_by: str, queued: Callable[[], list]
) -> Iterator[None]:
    """A session fixture's body: ``<scripts>/<name>-up.sh`` installs and starts the
    batch system where it can (root, Debian's packages), or it skips with the reason
    (a failure where ``required_by`` is 1). Started once per test process and shared by
    every test that uses it (they run in one process: the ``xdist_group`` of
    ``tests/conftest.py``); at the end, what it started stops, once ``queued()`` (the
    pilots in its queue) is empty: a daemon stopped with a job still ending would bring
    that job back, a ghost, on its next start."""
    label, submit, packages = {
        "slurm": ("SLURM", "sbatch", "slurm-wlm"),
        "sge": ("Grid Engine", "qsub", "gridengine packages"),
    }[name]
    if os.geteuid() != 0:
        skip_unless_required(f"a single-node {label} needs root to start its daemons", required_by)
    if shutil.which("apt-get") is None and shutil.which(submit) is None:
        skip_unless_required(
            f"no {label} and no apt-get to install Debian's {packages}", required_by
        )
    was_running = running(pidfile, comm)
    started = subprocess.run(
        ["bash", str(scripts / f"{name}-up.sh")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, f"{name.upper()}_SMOKE": "0"},
    )
    if started.returncode != 0:
        skip_unless_required(
            f"{label} did not start: {started.stdout[-1500:]}{started.stderr[-1500:]}", required_by
        )
    try:
        yield
    finally:
        if not was_running:
            with contextlib.suppress(AssertionError):
                wait(lambda: not queued(), 120, f"{label}'s queue to empty")
            subprocess.run(
                ["bash", str(scripts / f"{name}-down.sh")], capture_output=True, timeout=120
            )


# SLURM's queue, and a workflow of its two fake GPU types.


#: Rules of both fake GPU types (slurm-up.sh: fakea, fakeb): each job writes its
#: CUDA_VISIBLE_DEVICES and SLURM job id.
SLURM_GPU_MODELS = """
rule all:
    input: expand("out/{kind}-{i}.txt", kind=["a", "b"], i=range(2))

rule on_a:
    output: "out/a-{i}.txt"
    resources: gpu=1, gpu_model="fakea"
    shell: "echo $CUDA_VISIBLE_DEVICES $SLURM_JOB_ID > {output}"

rule on_b:
    output: "out/b-{i}.txt"
    resources: gpu=1, gpu_model="fakeb"
    shell: "echo $CUDA_VISIBLE_DEVICES $SLURM_JOB_ID > {output}"
"""


def _slurm_queue() -> list[dict[str, str]]:
    out = subprocess.run(
        ["squeue", "-h", "-o", "%i|%j|%T|%b"], capture_output=True, text=True, check=True
    ).stdout
    return [
        dict(zip(("id", "name", "state", "gres"), line.split("|"), strict=True))
        for line in out.splitlines()
        if line.strip()
    ]


def slurm_pilots() -> list[dict[str, str]]:
    """The pilots in SLURM's queue: id, name, state, GPUs."""
    return [job for job in _slurm_queue() if job["name"] == "snakemake-context"]


# Grid Engine's queue and accounting.

#: Where the execution daemon keeps the script of each job it runs (in a directory
#: named after the host, as the daemon resolved it).
SGE_SPOOLED_SCRIPTS = Path("/var/spool/gridengine/execd")
#: What every pool here asks of Grid Engine (the fixture's queue and project), and a
#: prologue line only bash runs (the queue's shell is /bin/sh).
SGE_POOL = (
    "--queue",
    "gpu.q",
    "--account",
    "ctxproj",
    "--gpu-type",
    "sgefake",
    "--prologue",
    '[[ -n "$BASH_VERSION" ]] || exit 3',
)


def _sge_qstat() -> list[dict[str, str]]:
    """Every job in the queue: number, full name, state (plain qstat cuts names)."""
    out = subprocess.run(
        ["qstat", "-u", "*", "-xml"], capture_output=True, text=True, check=True
    ).stdout
    return [
        {
            "id": job.findtext("JB_job_number", ""),
            "name": job.findtext("JB_name", ""),
            "state": job.findtext("state", ""),
        }
        for job in ET.fromstring(out).iter("job_list")
    ]


def sge_pilots() -> list[dict[str, str]]:
    """The pilots in Grid Engine's queue: id, name, state."""
    return [job for job in _sge_qstat() if job["name"] == "snakemake-context"]


def sge_qstat_j(job_id: str) -> dict[str, str]:
    """What qmaster holds of a job (``qstat -j``): its requests as it accepted them."""
    out = subprocess.run(["qstat", "-j", job_id], capture_output=True, text=True).stdout
    return {
        key.strip(): value.strip()
        for key, _, value in (line.partition(":") for line in out.splitlines())
        if value
    }


def sge_qacct(job_id: str) -> dict[str, str]:
    """The newest accounting record of a job number."""
    out = subprocess.run(["qacct", "-j", job_id], capture_output=True, text=True).stdout
    last = re.split(r"^=+\s*$", out, flags=re.MULTILINE)[-1]
    return {
        key: value.strip()
        for key, _, value in (line.partition(" ") for line in last.splitlines())
        if key
    }
