"""Grid Engine's side of pilots: what a pilot's job asks of it, a check of that job with
``qsub`` before any pilot is submitted, and a pilot's end as ``qstat``/``qacct`` tell it.

Facts this relies on, measured on Son of Grid Engine 8.1.9 (Debian's packages, the
single-node cluster of ``tests/sge/sge-up.sh``):

- A queue in ``posix_compliant`` shell start mode (the default) runs a job script with
  the queue's ``shell`` (``/bin/sh``), ignoring its ``#!`` line: pilots ask for bash
  with ``-S /bin/bash`` (prologue lines such as ``source venv/bin/activate`` need it).
- GPUs are a consumable complex, ``-l gpu=N`` booked against a host's
  ``complex_values``; Grid Engine only counts them and sets no ``CUDA_VISIBLE_DEVICES``.
- ``h_rt`` is ``H:M:S`` (hours may exceed 24, a field may be empty: ``1::1``) or
  seconds; ``D:HH:MM:SS`` is "not a time value". Pilots write ``HH:MM:SS``.
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
from typing import Any, ClassVar

from ... import paths
from ...errors import ClusterError
from .system import BatchSystem, PilotJob, WalltimeForm, clock, mebibytes, run_command

__all__ = ["GPU_COMPLEX", "Sge", "qacct_end_state", "sge_directives"]

#: The consumable complex pilots ask for GPUs with (``-l gpu=N``).
GPU_COMPLEX = "gpu"

#: What ``qsub -w v`` says of a load value it cannot check on an empty cluster.
_LOAD_VALUE_UNKNOWN = "job requests unknown resource ("


def _memory_directive(memory: str) -> str:
    return f"-l mem_free={mebibytes(memory)}M"


def sge_directives(cores: int, memory: str, extra_directives: Sequence[str]) -> list[str]:
    """A pilot's own directives beside dask-jobqueue's (queue, project, ``-l gpu``,
    ``-l h_rt``): bash, and the pilot's memory where it is free."""
    extra = " ".join(extra_directives)
    if cores > 1 and not re.search(r"(^|\s)-pe\s", extra):
        raise ClusterError(
            f"--context-pilots cores={cores} on Grid Engine needs a parallel "
            "environment, whose name is your site's: add --context-pilots "
            f"'directive=-pe smp {cores}' (up: --directive), or use one core per pilot."
        )
    found = [] if re.search(r"(^|\s)-S\s", extra) else ["-S /bin/bash"]
    return [*found, _memory_directive(memory)]


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


class Sge(BatchSystem):
    """Grid Engine (``qsub``; Son of Grid Engine measured)."""

    name: ClassVar[str] = "sge"
    title: ClassVar[str] = "SGE"
    jobqueue_class: ClassVar[str] = "SGECluster"
    walltime_forms: ClassVar[tuple[WalltimeForm, ...]] = (
        WalltimeForm(r"([1-9]\d*)", "seconds", ("s",)),
        WalltimeForm(r"(\d*):(\d*):(\d*)", "H:M:S", ("h", "m", "s")),
    )
    status_command: ClassVar[str] = "qstat"

    def write_walltime(self, job: PilotJob) -> str:
        """``h_rt`` as ``HH:MM:SS``, hours past 24 kept in the hours."""
        return clock(job.walltime_seconds)

    def gpu_request(self, job: PilotJob) -> tuple[list[str], dict[str, Any]]:
        """The consumable, in dask-jobqueue's ``resource_spec`` (``-l gpu=N``)."""
        return ([], {"resource_spec": f"{GPU_COMPLEX}={job.gpus}"}) if job.gpus > 0 else ([], {})

    def own_directives(self, job: PilotJob) -> list[str]:
        """Bash and the memory (:func:`sge_directives`)."""
        return sge_directives(job.cores, job.memory, job.extra_directives)

    def job_keywords(self, job: PilotJob) -> dict[str, Any]:
        """Queue, project and ``h_rt``."""
        return {"queue": job.queue, "project": job.account, "walltime": self.write_walltime(job)}

    def check_submission(self, job_arguments: dict[str, Any]) -> None:
        """Ask Grid Engine whether it could ever run the pilot job of these dask-jobqueue
        arguments (``qsub -w v``: against an empty cluster, nothing submitted); raise one
        line naming what it refuses."""
        import shutil

        from dask_jobqueue.sge import SGEJob

        qsub = shutil.which("qsub") or "qsub"  # on PATH: check_commands came first
        # The pilot's mem_free request is a load value: an empty cluster has none.
        left_out = _memory_directive(job_arguments["memory"])
        kwargs = {k: v for k, v in job_arguments.items() if k not in ("security", "interface")}
        directives = [d for d in kwargs["job_extra_directives"] if d != left_out]
        kwargs["job_extra_directives"] = directives
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
                raise ClusterError(
                    f"--context-pilots backend=sge: qsub -w v failed: {error}"
                ) from None
        said = " ".join((done.stdout + " " + done.stderr).split())
        if done.returncode == 0 or _LOAD_VALUE_UNKNOWN in said:
            return
        raise ClusterError(
            f"Grid Engine would never run this pool's pilots ({_requests(script)}): "
            f"{_reason(said)} (qsub -w v). Fix: "
            "--context-pilots gpus, queue, account, walltime or directive (up: --pilot-gpus, "
            "--queue, --account, --walltime, --directive)."
        )

    def end_state(self, job_id: str) -> str | None:
        """A pilot's final state once its job has left Grid Engine's queue (None before,
        or when ``qacct`` cannot say)."""
        if not job_id:
            return None
        code, _ = run_command(["qstat", "-j", job_id], timeout=30)
        if code == 0:  # still known to qmaster: pending, running or being deleted
            return None
        code, out = run_command(["qacct", "-j", job_id], timeout=30)
        return qacct_end_state(out) if code == 0 else None
