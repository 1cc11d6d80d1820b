"""SLURM's side of pilots: their job's directives, and a job's end as SLURM tells it.

Facts this relies on:

- GPUs are asked for with ``--gres=gpu[:type]:N``; SLURM hands the job
  ``CUDA_VISIBLE_DEVICES``. ``scancel`` sends SIGTERM, then SIGKILL after ``KillWait``.
- ``--time`` reads ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM`` and
  ``D-HH:MM:SS``; seconds round up to whole minutes; 0 means no limit.
- A finished job stays in ``scontrol show job`` for ``MinJobAge`` (300 s by default);
  clusters with accounting also answer ``sacct``; a cluster without slurmdbd but with
  ``JobCompType=jobcomp/filetxt`` answers ``sacct -c``.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from .system import BatchSystem, PilotJob, WalltimeForm, run_command

__all__ = ["FINAL_STATES", "Slurm"]

#: The job states SLURM ends a job in.
FINAL_STATES = frozenset(
    {
        "PREEMPTED",
        "CANCELLED",
        "NODE_FAIL",
        "BOOT_FAIL",
        "DEADLINE",
        "TIMEOUT",
        "REVOKED",
        "FAILED",
        "OUT_OF_MEMORY",
        "COMPLETED",
    }
)


class Slurm(BatchSystem):
    """SLURM (``sbatch``)."""

    name: ClassVar[str] = "slurm"
    title: ClassVar[str] = "SLURM"
    jobqueue_class: ClassVar[str] = "SLURMCluster"
    walltime_forms: ClassVar[tuple[WalltimeForm, ...]] = (
        WalltimeForm(r"(\d+)", "MM", ("m",)),
        WalltimeForm(r"(\d+):(\d+)", "MM:SS", ("m", "s")),
        WalltimeForm(r"(\d+):(\d+):(\d+)", "HH:MM:SS", ("h", "m", "s")),
        WalltimeForm(r"(\d+)-(\d+)", "D-HH", ("d", "h")),
        WalltimeForm(r"(\d+)-(\d+):(\d+)", "D-HH:MM", ("d", "h", "m")),
        WalltimeForm(r"(\d+)-(\d+):(\d+):(\d+)", "D-HH:MM:SS", ("d", "h", "m", "s")),
    )
    whole_minutes: ClassVar[bool] = True
    status_command: ClassVar[str] = "scontrol"

    def write_walltime(self, job: PilotJob) -> str:
        """As the user wrote it: ``--time`` reads every form it was read in."""
        return job.walltime

    def gpu_request(self, job: PilotJob) -> tuple[list[str], dict[str, Any]]:
        """A ``--gres`` directive."""
        if job.gpus <= 0:
            return [], {}
        kind = f"{job.gpu_type}:" if job.gpu_type else ""
        return [f"--gres=gpu:{kind}{job.gpus}"], {}

    def own_directives(self, job: PilotJob) -> list[str]:
        """The quality of service, if any (dask-jobqueue has no keyword for it)."""
        return [f"--qos={job.qos}"] if job.qos else []

    def job_keywords(self, job: PilotJob) -> dict[str, Any]:
        """Partition, account and walltime."""
        return {"queue": job.queue, "account": job.account, "walltime": self.write_walltime(job)}

    def end_state(self, job_id: str) -> str | None:
        """From ``scontrol``, ``sacct`` or ``sacct -c``: the first final state found."""
        if not job_id:
            return None
        found = re.search(r"JobState=(\S+)", _answer(["scontrol", "show", "job", "-o", job_id]))
        states = [found.group(1)] if found else []
        states += _answer(["sacct", "-n", "-X", "-P", "-o", "State", "-j", job_id]).split()
        completions = _answer(["sacct", "-c", "-n", "-P", "-o", "jobid,state", "-j", job_id])
        for line in completions.splitlines():
            jobid, _, state = line.partition("|")
            if jobid.strip() == job_id:
                states.append(state.strip())
        for state in states:
            # "CANCELLED by 1000", "COMPLETED+": the state is the first word.
            word = state.split()[0].rstrip("+").upper() if state.split() else ""
            if word in FINAL_STATES:
                return word
        return None


def _answer(command: list[str]) -> str:
    """A client's output, or nothing when it failed."""
    code, out = run_command(command, timeout=10)
    return out if code == 0 else ""
