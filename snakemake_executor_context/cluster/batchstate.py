"""A pilot's final state as its batch system tells it (runs in the cluster process).

SLURM keeps a finished job in ``scontrol show job`` for ``MinJobAge`` (300 s by
default); clusters with accounting also answer ``sacct``; a cluster without slurmdbd
but with ``JobCompType=jobcomp/filetxt`` answers ``sacct -c``. Grid Engine's ``qacct``
answers once a job has left ``qstat`` (:func:`.sge.end_state`, in SLURM's words). The
other batch systems are not read yet: their pilots end as "unknown" (and count as
preemptions).
"""

from __future__ import annotations

import re
import subprocess

__all__ = ["batch_state"]

_FINAL = {
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


def _run(command: list[str]) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout if done.returncode == 0 else ""


def batch_state(backend: str, job_id: str) -> str | None:
    """The final state of a pilot's batch job (None while it has none, or unknown)."""
    if backend == "sge" and job_id:
        from .sge import end_state

        return end_state(job_id)
    if backend != "slurm" or not job_id:
        return None
    found = re.search(r"JobState=(\S+)", _run(["scontrol", "show", "job", "-o", job_id]))
    states = [found.group(1)] if found else []
    states += _run(["sacct", "-n", "-X", "-P", "-o", "State", "-j", job_id]).split()
    for line in _run(["sacct", "-c", "-n", "-P", "-o", "jobid,state", "-j", job_id]).splitlines():
        jobid, _, state = line.partition("|")
        if jobid.strip() == job_id:
            states.append(state.strip())
    for state in states:
        if state.split()[0].rstrip("+").upper() in _FINAL:
            return state.split()[0].rstrip("+").upper()
    return None
