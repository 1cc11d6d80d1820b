"""Grid Engine's side of pilots: what a pilot's job asks of it, a check of that job with
``qsub`` before any pilot is submitted, and a pilot's end as ``qstat``/``qacct`` tell it.

Facts this relies on, measured on Son of Grid Engine 8.1.9 (Debian's packages, the
single-node cluster of ``tests/sge/sge-up.sh``):

- A queue in ``posix_compliant`` shell start mode (the default) runs a job script with
  the queue's ``shell`` (``/bin/sh``), ignoring its ``#!`` line: pilots ask for bash
  with ``-S /bin/bash`` (prologue lines such as ``source venv/bin/activate`` need it).
- GPUs are a consumable complex, ``-l gpu=N`` booked against a host's
  ``complex_values``; Grid Engine only counts them and sets no ``CUDA_VISIBLE_DEVICES``.
- ``h_rt`` is ``H:MM:SS`` (hours may exceed 24) or seconds; ``D:HH:MM:SS`` is "not a
  time value".
- A job gets one slot; more need a parallel environment whose name is the site's
  (``-pe smp 8``).
- ``mem_free`` is a load value: the scheduler places a job where that much memory is
  free, and kills nothing (``h_vmem`` is an address-space limit that CUDA processes
  exceed). ``qsub -w v`` checks a job against an empty cluster, without load values:
  there a ``mem_free`` request reads "job requests unknown resource (mem_free)".
- ``qsub -w v`` submits nothing and names the first reason a job could never run:
  "cannot run at host ... because it offers only hc:gpu=4", "the requested project
  ... does not exist", "unknown queue", "unknown resource", "not a time value".
- ``qdel`` of a running job kills it with SIGKILL (no SIGTERM first, unless the queue's
  ``terminate_method`` says so). Once a job has left ``qstat``, ``qacct -j`` shows
  ``failed 100 : assumedly after job`` and ``exit_status 137`` for it; for a job over
  its ``h_rt``, ``failed 37 : qmaster enforced h_rt, h_cpu, or h_vmem limit``; for a
  job that could not start, ``failed`` 1-36; otherwise ``failed 0`` and the job
  script's own exit status. Job numbers restart when a cell is recreated, so
  ``qacct -j N`` may list older jobs of the same number first.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import paths
from ..errors import ClusterError

__all__ = [
    "GPU_COMPLEX",
    "check_submission",
    "end_state",
    "qacct_end_state",
    "sge_directives",
    "sge_h_rt",
]

#: The consumable complex pilots ask for GPUs with (``-l gpu=N``).
GPU_COMPLEX = "gpu"

#: What ``qsub -w v`` says of a load value it cannot check on an empty cluster.
_LOAD_VALUE_UNKNOWN = "job requests unknown resource ("


def sge_h_rt(seconds: float) -> str:
    """A walltime as Grid Engine's ``h_rt`` reads it: ``HH:MM:SS``, hours past 24.

    >>> sge_h_rt(93600 + 70)
    '26:01:10'
    """
    total = int(seconds)
    return f"{total // 3600:02d}:{total // 60 % 60:02d}:{total % 60:02d}"


def _memory_directive(memory: str) -> str:
    from dask.utils import parse_bytes

    return f"-l mem_free={max(1, parse_bytes(memory) // 2**20)}M"


def sge_directives(cores: int, memory: str, extra_directives: Sequence[str]) -> list[str]:
    """A pilot's own directives beside dask-jobqueue's (queue, project, ``-l gpu``,
    ``-l h_rt``): bash, and the pilot's memory where it is free."""
    extra = " ".join(extra_directives)
    if cores > 1 and not re.search(r"(^|\s)-pe\s", extra):
        raise ClusterError(
            f"--context-pilot-cores {cores} on Grid Engine needs a parallel "
            "environment, whose name is your site's: add --context-pilot-directives "
            f"'-pe smp {cores}' (up: --directive), or use one core per pilot."
        )
    found = [] if re.search(r"(^|\s)-S\s", extra) else ["-S /bin/bash"]
    return [*found, _memory_directive(memory)]


def check_submission(job_kwargs: dict[str, Any], memory: str) -> None:
    """Ask Grid Engine whether it could ever run the pilot job of these dask-jobqueue
    arguments (``qsub -w v``: against an empty cluster, nothing submitted); raise one
    line naming what it refuses."""
    import shutil

    from dask_jobqueue.sge import SGEJob

    qsub = shutil.which("qsub")
    if qsub is None:
        raise ClusterError(
            "--context-backend sge: qsub is not on PATH. Fix: run where Grid Engine's "
            "client commands work (a login or submit host), with SGE_ROOT set."
        )
    # The pilot's mem_free request is a load value: an empty cluster has none.
    left_out = _memory_directive(memory)
    kwargs = {k: v for k, v in job_kwargs.items() if k not in ("security", "interface")}
    kwargs["job_extra_directives"] = [d for d in kwargs["job_extra_directives"] if d != left_out]
    kwargs["log_directory"] = None
    script = SGEJob(scheduler="tls://127.0.0.1:1", name="check", **kwargs).job_script()
    with tempfile.TemporaryDirectory(dir=paths.private_temporary_directory()) as directory:
        path = Path(directory) / "pilot.sh"
        path.write_text(script)
        try:
            done = subprocess.run(
                [qsub, "-w", "v", str(path)],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=directory,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            raise ClusterError(f"--context-backend sge: qsub -w v failed: {error}") from None
    said = " ".join((done.stdout + " " + done.stderr).split())
    if done.returncode == 0 or _LOAD_VALUE_UNKNOWN in said:
        return
    raise ClusterError(
        f"Grid Engine would never run this pool's pilots ({_requests(script)}): "
        f"{_reason(said)} (qsub -w v). Fix: "
        "--context-pilot-gpus, --context-pilot-queue, --context-pilot-account, "
        "--context-pilot-walltime or --context-pilot-directives (up: --pilot-gpus, "
        "--queue, --account, --walltime, --directive)."
    )


def _requests(script: str) -> str:
    """What a job script asks of the scheduler (not its name, directory or logs)."""
    lines = [line.removeprefix("#$ ") for line in script.splitlines() if line.startswith("#$ -")]
    kept = [line for line in lines if line.split()[0] not in ("-N", "-cwd", "-j", "-e", "-o")]
    return " ".join(kept)


def _reason(said: str) -> str:
    """qsub's reason, without the number of a job it never submitted.

    >>> _reason('Unable to run job: Job 50 (-l gpu=8) cannot run at host "vm" because '
    ...         'it offers only hc:gpu=4.000000 verification: no suitable queues Exiting.')
    'cannot run at host "vm" because it offers only hc:gpu=4.000000'
    """
    reason = said.removeprefix("Unable to run job: ").removesuffix(" Exiting.")
    reason = reason.removesuffix(" verification: no suitable queues")
    return re.sub(r"^Job \d+ (\([^)]*\) )?", "", reason)


def qacct_end_state(text: str) -> str | None:
    """A finished job's state in SLURM's words, from ``qacct -j N``'s output: its last
    record (the newest job of that number). None when there is none."""
    records = [r for r in re.split(r"^=+\s*$", text, flags=re.MULTILINE) if r.strip()]
    if not records:
        return None
    fields: dict[str, str] = {}
    for line in records[-1].splitlines():
        key, _, value = line.strip().partition(" ")
        fields[key] = value.strip()
    failed = re.match(r"\d+", fields.get("failed", ""))
    status = re.match(r"\d+", fields.get("exit_status", ""))
    if failed is None or status is None:
        return None
    code = int(failed.group())
    if code == 100:
        return "CANCELLED"  # killed from outside once running: qdel, or a signal
    if code == 37:
        return "TIMEOUT"
    if code != 0:
        return "FAILED"  # it could not start (failed 1-36) or was lost otherwise
    return "COMPLETED" if int(status.group()) == 0 else "FAILED"


def _run(command: list[str]) -> tuple[int, str]:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return -1, ""
    return done.returncode, done.stdout


def end_state(job_id: str) -> str | None:
    """A pilot's final state once its job has left Grid Engine's queue (None before,
    or when ``qacct`` cannot say)."""
    code, _ = _run(["qstat", "-j", job_id])
    if code == 0:  # still known to qmaster: pending, running or being deleted
        return None
    code, out = _run(["qacct", "-j", job_id])
    return qacct_end_state(out) if code == 0 else None
