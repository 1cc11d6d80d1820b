"""HTCondor's side of pilots: their submit file's entries.

Facts this relies on:

- HTCondor has no walltime: a running pilot is removed by ``periodic_remove`` once it
  has run that long. Only the unambiguous ``HH:MM:SS`` and ``D-HH:MM:SS`` are read.
- GPUs are ``request_gpus``; a GPU type is a ``require_gpus`` expression on the
  device's name. An account is an ``accounting_group``.
- A submit file's entries are ``key = value``: the user's directives are written so,
  and override the pilot's own; ``disk`` is required.
- Job states are not read yet: a pilot's end is "unknown".
"""

from __future__ import annotations

from typing import Any, ClassVar

from .system import BatchSystem, PilotJob, WalltimeForm

__all__ = ["HTCondor"]


class HTCondor(BatchSystem):
    """HTCondor (``condor_submit``)."""

    name: ClassVar[str] = "htcondor"
    title: ClassVar[str] = "HTCondor"
    jobqueue_class: ClassVar[str] = "HTCondorCluster"
    walltime_forms: ClassVar[tuple[WalltimeForm, ...]] = (
        WalltimeForm(r"(\d+):(\d+):(\d+)", "HH:MM:SS", ("h", "m", "s")),
        WalltimeForm(r"(\d+)-(\d+):(\d+):(\d+)", "D-HH:MM:SS", ("d", "h", "m", "s")),
    )

    def write_walltime(self, job: PilotJob) -> str:
        """Seconds, as ``periodic_remove`` compares a job's running time."""
        return str(job.walltime_seconds)

    def gpu_request(self, job: PilotJob) -> tuple[list[str], dict[str, Any]]:
        """``request_gpus`` and ``require_gpus`` entries."""
        if job.gpus <= 0:
            return [], {}
        entries = [f"request_gpus = {job.gpus}"]
        if job.gpu_type:
            entries.append(f'require_gpus = DeviceName == "{job.gpu_type}"')
        return entries, {}

    def job_keywords(self, job: PilotJob) -> dict[str, Any]:
        """The scratch disk (HTCondor requires one)."""
        return {"disk": job.disk}

    def job_arguments(self, job: PilotJob) -> dict[str, Any]:
        """The disk, and the submit file's entries: the walltime's ``periodic_remove``,
        the GPUs', the account's group, then the user's (which override them)."""
        removal = (
            "periodic_remove = (JobStatus == 2) && "
            f"(time() - EnteredCurrentStatus > {self.write_walltime(job)})"
        )
        gpu_entries, _ = self.gpu_request(job)
        account = [f"accounting_group = {job.account}"] if job.account else []
        entries: dict[str, str] = {}
        for line in [removal, *gpu_entries, *account, *job.extra_directives]:
            key, _, value = line.partition("=")
            entries[key.strip()] = value.strip()
        return {**self.job_keywords(job), "job_extra_directives": entries}
