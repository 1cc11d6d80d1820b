"""PBS Pro's side of pilots: their job's resources and walltime.

Facts this relies on:

- GPUs are asked for in a chunk, with the chunk's cores and memory:
  ``select=1:ncpus=C:ngpus=N:mem=Mmb`` (a GPU model as ``:gpu_model=TYPE``, where the
  site defines that resource).
- ``-l walltime`` reads ``[[HH:]MM:]SS``: a lone number is seconds.
- Job states are not read yet: a pilot's end is "unknown".
"""

from __future__ import annotations

from typing import Any, ClassVar

from .system import BatchSystem, PilotJob, WalltimeForm, clock, mebibytes

__all__ = ["Pbs"]


class Pbs(BatchSystem):
    """PBS Pro (``qsub``)."""

    name: ClassVar[str] = "pbs"
    title: ClassVar[str] = "PBS"
    jobqueue_class: ClassVar[str] = "PBSCluster"
    walltime_forms: ClassVar[tuple[WalltimeForm, ...]] = (
        WalltimeForm(r"(\d+)", "SS", ("s",)),
        WalltimeForm(r"(\d+):(\d+)", "MM:SS", ("m", "s")),
        WalltimeForm(r"(\d+):(\d+):(\d+)", "HH:MM:SS", ("h", "m", "s")),
    )

    def write_walltime(self, job: PilotJob) -> str:
        """``HH:MM:SS``."""
        return clock(job.walltime_seconds)

    def gpu_request(self, job: PilotJob) -> tuple[list[str], dict[str, Any]]:
        """A ``select`` chunk in dask-jobqueue's ``resource_spec``."""
        if job.gpus <= 0:
            return [], {}
        chunk = f"select=1:ncpus={job.cores}:ngpus={job.gpus}:mem={mebibytes(job.memory)}mb"
        if job.gpu_type:
            chunk += f":gpu_model={job.gpu_type}"
        return [], {"resource_spec": chunk}

    def job_keywords(self, job: PilotJob) -> dict[str, Any]:
        """Queue, account and walltime."""
        return {"queue": job.queue, "account": job.account, "walltime": self.write_walltime(job)}
