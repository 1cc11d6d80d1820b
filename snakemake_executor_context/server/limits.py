"""Limits on a job, the decisions: the rule's ``runtime``, the server's memory cap,
and which of them a running job broke.

A job with a limit runs in a thread of its own while the task's thread watches it
(:meth:`.jobs.ServerJobs.run_bounded`): when its runtime has passed, or the
memory watchdog (:mod:`.memwatch`) saw the server (with its child processes) above
the cap, the job is cancelled (JobCancelled in its thread, or its process tree
killed); a job that does not stop within :data:`STOP_GRACE_SECONDS` fails at once,
naming the limit, and the server restarts (its nanny starts a fresh process) once the
executor has the result. Dask's own memory thresholds stay off. No ``RLIMIT_AS``:
CUDA reserves huge address ranges.

The cap and the restart count come from the environment the servers inherit
(:data:`~..defaults.MEMORY_CAP_VARIABLE`, :data:`~..defaults.RECYCLE_VARIABLE`), and
:data:`~..defaults.TIME_SCALE_VARIABLE` (test-only, default 1) multiplies every runtime.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ..defaults import MEMORY_CAP_VARIABLE, RECYCLE_VARIABLE, TIME_SCALE_VARIABLE
from ..settings.table import environment_value, executor_flag
from ..terminal import format_bytes

__all__ = [
    "STOP_GRACE_SECONDS",
    "ServerLimits",
    "broken_limit",
    "limit_seconds",
    "memory_message",
    "time_scale",
]

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
