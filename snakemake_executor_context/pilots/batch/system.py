"""What every batch system answers for a pilot: the protocol its module implements.

A :class:`BatchSystem` knows its dask-jobqueue class, the walltime forms it reads
and how it writes one, how its jobs ask for GPUs, the keyword arguments and
directives of a pilot's job, how to read a job's final state and how to check a
job before any is submitted. It works on a :class:`PilotJob`, the project's
request in plain values, so that this package imports nothing of the cluster's.
"""

from __future__ import annotations

import shutil
import subprocess
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from ...errors import SettingError

__all__ = ["BatchSystem", "PilotJob", "WalltimeForm", "clock", "mebibytes", "run_command"]


@dataclass(frozen=True)
class WalltimeForm:
    """One way a batch system writes a walltime (read by :mod:`.walltime`)."""

    #: The whole text, one group per field.
    pattern: str
    #: How the documentation names it ("MM:SS").
    name: str
    #: The groups' units in order: "d", "h", "m" or "s".
    fields: tuple[str, ...]


@dataclass(frozen=True)
class PilotJob:
    """What one pilot job asks of its batch system, in the project's words."""

    queue: str | None
    account: str | None
    qos: str | None
    #: The walltime as the user wrote it, and the seconds this system reads in it.
    walltime: str
    walltime_seconds: int
    gpus: int
    gpu_type: str | None
    cores: int
    memory: str
    disk: str
    #: The user's own directives, as the batch system spells them.
    extra_directives: tuple[str, ...]


class BatchSystem(ABC):
    """A batch system pilots can be submitted to (one module of this package each)."""

    #: Its name on the command line (``--backend``).
    name: ClassVar[str]
    #: Its name in messages.
    title: ClassVar[str]
    #: The dask-jobqueue cluster class that submits its jobs.
    jobqueue_class: ClassVar[str]
    #: The walltime forms it reads, tried in order.
    walltime_forms: ClassVar[tuple[WalltimeForm, ...]]
    #: Whether it enforces a walltime in whole minutes, rounded up.
    whole_minutes: ClassVar[bool] = False
    #: The command its pool reads a departed pilot's state with (:meth:`end_state`).
    status_command: ClassVar[str] = ""

    @abstractmethod
    def write_walltime(self, job: PilotJob) -> str:
        """The walltime as this system's dask-jobqueue keyword wants it."""

    @abstractmethod
    def gpu_request(self, job: PilotJob) -> tuple[list[str], dict[str, Any]]:
        """How the job asks for its GPUs: directives, and dask-jobqueue keywords."""

    @abstractmethod
    def job_keywords(self, job: PilotJob) -> dict[str, Any]:
        """dask-jobqueue's keyword arguments of this system (queue, account, walltime...)."""

    def own_directives(self, job: PilotJob) -> list[str]:
        """Directives this system's pilots always carry (after the GPUs' ones)."""
        return []

    def job_arguments(self, job: PilotJob) -> dict[str, Any]:
        """The job's keyword arguments that depend on this system, its directives in
        ``job_extra_directives`` (GPUs', its own, then the user's)."""
        directives, gpu_keywords = self.gpu_request(job)
        directives += self.own_directives(job)
        return {
            **self.job_keywords(job),
            **gpu_keywords,
            "job_extra_directives": directives + list(job.extra_directives),
        }

    def end_state(self, job_id: str) -> str | None:
        """A finished job's state in SLURM's words (``COMPLETED``, ``PREEMPTED``...);
        None while it runs or when the system cannot say. Systems not read yet say
        None: their pilots end as "unknown" (and count as preemptions)."""
        return None

    def commands(self) -> tuple[str, ...]:
        """The client commands its pool runs: dask-jobqueue's submit and cancel
        commands, then its status command, if any."""
        import dask_jobqueue

        job = getattr(dask_jobqueue, self.jobqueue_class).job_cls
        found = (job.submit_command.split()[0], job.cancel_command.split()[0])
        return found + ((self.status_command,) if self.status_command else ())

    def check_commands(self) -> None:
        """Refuse, in one line naming the setting and the commands, a pool whose client
        commands are not on PATH: before any cluster starts (dask-jobqueue's first
        submission would fail in a traceback in the cluster's log, the run waiting)."""
        missing = [command for command in self.commands() if shutil.which(command) is None]
        if missing:
            them = "the command " if len(missing) == 1 else "the commands "
            verb = " is" if len(missing) == 1 else " are"
            raise SettingError(
                f"--context-pilots backend={self.name} (up: --backend {self.name}): "
                f"{them}{', '.join(missing)}{verb} not on PATH ({self.title}'s pool runs "
                f"{', '.join(self.commands())}). Fix: run where {self.title}'s client "
                "commands work (a login or submit host), with them on PATH."
            )

    def check_submission(self, job_arguments: dict[str, Any]) -> None:
        """Refuse, in one line, a pilot job this system would never run (before any is
        submitted); systems without such a check accept every job."""
        return None


def clock(seconds: int) -> str:
    """Seconds as ``HH:MM:SS``, hours past 24 kept in the hours.

    >>> clock(93600 + 70)
    '26:01:10'
    """
    total = int(seconds)
    return f"{total // 3600:02d}:{total // 60 % 60:02d}:{total % 60:02d}"


def mebibytes(memory: str) -> int:
    """A size ("16GB") in whole MiB, at least 1."""
    from dask.utils import parse_bytes

    return max(1, parse_bytes(memory) // 2**20)


def run_command(command: list[str], timeout: float) -> tuple[int, str]:
    """A batch client's exit status and output (-1 and nothing when it cannot run)."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return -1, ""
    return done.returncode, done.stdout
