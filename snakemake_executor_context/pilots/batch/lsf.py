"""LSF's side of pilots: their job's directives and walltime.

Facts this relies on:

- GPUs are asked for with ``-gpu "num=N[:gmodel=TYPE]"``.
- ``-W`` reads ``[HH:]MM`` (a lone number is minutes); ``HH:MM:SS``, which no other
  reading can be confused with, is taken too, rounded up to LSF's whole minutes.
- dask-jobqueue submits with ``bsub < script`` (``use_stdin``): ``bsub script`` would
  not read the script's ``#BSUB`` lines.
- Job states are not read yet: a pilot's end is "unknown".
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from .system import BatchSystem, PilotJob, WalltimeForm

__all__ = ["Lsf"]


class Lsf(BatchSystem):
    """IBM Spectrum LSF (``bsub``)."""

    name: ClassVar[str] = "lsf"
    title: ClassVar[str] = "LSF"
    jobqueue_class: ClassVar[str] = "LSFCluster"
    walltime_forms: ClassVar[tuple[WalltimeForm, ...]] = (
        WalltimeForm(r"(\d+)", "MM", ("m",)),
        WalltimeForm(r"(\d+):(\d+)", "HH:MM", ("h", "m")),
        WalltimeForm(r"(\d+):(\d+):(\d+)", "HH:MM:SS", ("h", "m", "s")),
    )
    whole_minutes: ClassVar[bool] = True

    def write_walltime(self, job: PilotJob) -> str:
        """``HH:MM``, rounded up to a whole minute."""
        minutes = math.ceil(job.walltime_seconds / 60)
        return f"{minutes // 60:02d}:{minutes % 60:02d}"

    def gpu_request(self, job: PilotJob) -> tuple[list[str], dict[str, Any]]:
        """A ``-gpu`` directive."""
        if job.gpus <= 0:
            return [], {}
        spec = f"num={job.gpus}" + (f":gmodel={job.gpu_type}" if job.gpu_type else "")
        return [f'-gpu "{spec}"'], {}

    def job_keywords(self, job: PilotJob) -> dict[str, Any]:
        """Queue, project, walltime and cores."""
        return {
            "queue": job.queue,
            "project": job.account,
            "walltime": self.write_walltime(job),
            "ncpus": job.cores,
            "use_stdin": True,
        }
