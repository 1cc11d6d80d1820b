"""The server's one-decision policies, pure: each takes the facts and returns what to do;
the server (:class:`.server.ContextServer`) asks and obeys, and leaves by one way out.

**Graceful drain** (:func:`plan_drain`): which running jobs a server finishes after
SIGTERM (a batch system's preemption notice, e.g. SLURM's ``--signal=B:TERM@N``, or its
``scancel``) and which it hands back. A job is finished when its expected remaining
time fits the grace period (:func:`..fleet.losses.finishes_in_grace`: the mean time of
that context's jobs on this server, minus what the job ran; unknown means hand back).
The server carries it out (:meth:`.server.ContextServer.drain`): it takes no new job,
says so (:class:`..fleet.events.ServerDraining`, which the hub turns into a preemption:
the jobs handed back cost their preemption budget, never a retry), waits for the jobs
it finishes until the executor has their results, and leaves. Its nanny may start it
again (the embedded cluster, ``up``); a batch system's node simply goes.

**Black holes** (:func:`gpu_failure`): which failed job's error makes its server
unusable. After a CUDA-fatal error (an illegal memory access, an Xid, an uncorrectable
ECC error) every later job on that GPU would fail, so such an error recycles the server
(:meth:`.server.ContextServer.recycle`): it takes no new job, waits until its failed
job's result has been taken, says why and exits, and its nanny starts a fresh process.
A CUDA out-of-memory error is an exception, not a death: the allocator's cache is
freed and the error counted. Which failures are the server's, not the job's
(:func:`server_fault`), is what the hub's black-hole rule counts
(:class:`..fleet.losses.FailureStreaks`): a script's own exception fails the same on
any server and drains none.

**Limits** (:func:`broken_limit`): the rule's ``runtime``, the server's memory cap, and
which of them a running job broke. A job with a limit runs in a thread of its own
while the task's thread watches it (:meth:`.jobs.ServerJobs.run_bounded`): when its
runtime has passed, or the memory watchdog (:mod:`.memwatch`) saw the server (with its
child processes) above the cap, the job is cancelled (JobCancelled in its thread, or
its process tree killed); a job that does not stop within :data:`STOP_GRACE_SECONDS`
fails at once, naming the limit, and the server restarts (its nanny starts a fresh
process) once the executor has the result. Dask's own memory thresholds stay off. No
``RLIMIT_AS``: CUDA reserves huge address ranges. The cap and the restart count come
from the environment the servers inherit (:data:`~..defaults.MEMORY_CAP_VARIABLE`,
:data:`~..defaults.RECYCLE_VARIABLE`), and :data:`~..defaults.TIME_SCALE_VARIABLE`
(test-only, default 1) multiplies every runtime.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..defaults import MEMORY_CAP_VARIABLE, RECYCLE_VARIABLE, TIME_SCALE_VARIABLE
from ..errors import ContextLoadError
from ..fleet.losses import finishes_in_grace
from ..settings.table import environment_value, executor_flag
from ..terminal import error_text, format_bytes

__all__ = [
    "CUDA_FATAL",
    "CUDA_OOM",
    "DRAINED_EXIT",
    "RECYCLE_GRACE",
    "STOP_GRACE_SECONDS",
    "ServerLimits",
    "broken_limit",
    "gpu_failure",
    "limit_seconds",
    "memory_message",
    "plan_drain",
    "server_fault",
    "time_scale",
]


# Graceful drain.

#: Exit code of a drained server.
DRAINED_EXIT = 0


def plan_drain(
    running: Mapping[str, tuple[str | None, float]],
    mean_seconds: Callable[[str | None], float | None],
    now: float,
    grace: float,
) -> tuple[list[str], list[str]]:
    """(finishing, handed back) among ``running`` (key -> (context identity, start));
    ``mean_seconds(identity)`` is this server's mean job time of that context."""
    finishing: list[str] = []
    handed_back: list[str] = []
    for key, (identity, started) in running.items():
        fits = finishes_in_grace(mean_seconds(identity), now - started, grace)
        (finishing if fits else handed_back).append(key)
    return finishing, handed_back


# Black holes.

#: Error texts after which the CUDA context (and so the server) is unusable.
CUDA_FATAL = re.compile(
    r"illegal memory access|illegal instruction was encountered|unspecified launch "
    r"failure|uncorrectable ECC|ECC error|\bXid\b|device-side assert|misaligned address|"
    r"CUDA error: unknown error|CUBLAS_STATUS_EXECUTION_FAILED",
    re.IGNORECASE,
)
#: Error texts of a CUDA allocation failure (recoverable).
CUDA_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError: CUDA", re.IGNORECASE)
#: Seconds a recycling server waits for the jobs running beside the one that made it
#: recycle (slots) before it exits.
RECYCLE_GRACE = 60.0


def gpu_failure(text: str) -> str | None:
    """'fatal', 'oom' or None for a failed job's message."""
    if CUDA_FATAL.search(text):
        return "fatal"
    if CUDA_OOM.search(text):
        return "oom"
    return None


#: Errnos of a disk the server writes to that is full or failing, not of a job's path.
_DISK_ERRNOS = {
    errno.ENOSPC,
    errno.EDQUOT,
    errno.EIO,
    errno.EROFS,
    errno.ESTALE,
    errno.ENODEV,
    errno.ENXIO,
}


def server_fault(error: BaseException) -> str:
    """Why a failed job's error is its server's fault ('' when it is the job's own):
    a context that would not load, a CUDA-fatal error, a full or failing disk (an
    ``OSError`` of :data:`_DISK_ERRNOS`, also as the cause a library wrapped)."""
    if isinstance(error, ContextLoadError):
        return "its context failed to load"
    if CUDA_FATAL.search(error_text(error)):  # its own __str__ may raise
        return "a CUDA-fatal error"
    link: BaseException | None = error
    seen: set[int] = set()
    while link is not None and id(link) not in seen:  # a chain may loop
        if isinstance(link, OSError) and link.errno in _DISK_ERRNOS:
            return f"a full or failing disk (OSError {errno.errorcode[link.errno]})"
        seen.add(id(link))
        link = link.__cause__ or link.__context__
    return ""


# Limits.

#: Seconds a cancelled job has to stop before its server restarts.
STOP_GRACE_SECONDS = 5.0


def time_scale() -> float:
    """The test-only factor on runtimes (default 1)."""
    try:
        scale = float(os.environ.get(TIME_SCALE_VARIABLE, "1"))
    except ValueError:
        return 1.0
    return scale if scale > 0 else 1.0


def limit_seconds(minutes: float | None) -> float | None:
    """A runtime in minutes (Snakemake's unit) as seconds, scaled; None: no limit."""
    return None if minutes is None else minutes * 60.0 * time_scale()


@dataclass(frozen=True)
class ServerLimits:
    """A server's memory cap (bytes, or None) and how many leaking jobs restart it."""

    memory_cap: int | None
    recycle_after: int

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> ServerLimits:
        """The limits the servers' environment sets (default :data:`os.environ`), read
        as the start checks read them (a bad value, refused there: SettingError, one
        line; unset: no cap, and a restart after 3 leaking jobs)."""
        cap = environment_value(MEMORY_CAP_VARIABLE, environ)
        recycle_after = environment_value(RECYCLE_VARIABLE, environ)
        return cls(cap or None, 3 if recycle_after is None else recycle_after)


def memory_message(cap: int, rss: int) -> str:
    """Why the watchdog stopped a job. The servers inherit the cap through
    :data:`~..defaults.MEMORY_CAP_VARIABLE`, set by the executor's flag for its
    embedded cluster or exported for ``snakemake-context up``: both are named."""
    return (
        f"the server's memory cap of {format_bytes(cap)} ({executor_flag('server_memory')}, or "
        f"{MEMORY_CAP_VARIABLE}): the server and its child processes used "
        f"{format_bytes(rss)}. Fix: raise the cap, or make the job need less memory"
    )


def broken_limit(
    *, rule: str, runtime_minutes: float | None, elapsed: float, flagged: str | None
) -> str | None:
    """Which limit a running job broke, if any: the one the memory watchdog flagged
    (``flagged``), else its runtime once ``elapsed`` seconds have passed it."""
    if flagged:
        return flagged
    seconds = limit_seconds(runtime_minutes)
    if seconds is None or elapsed <= seconds:
        return None
    scale = time_scale()
    scaled = "" if scale == 1 else f", scaled by {TIME_SCALE_VARIABLE}={scale:g}"
    return (
        f"its runtime limit of {runtime_minutes:g} min (the `runtime` resource of rule "
        f"'{rule}'{scaled}). Fix: raise the rule's runtime, or make the job faster"
    )
