"""Limits on a job: the rule's ``runtime``, and the server's memory cap.

A job with a limit runs in a thread of its own while the task's thread watches it:
when its runtime has passed, or the memory watchdog saw the server (with its child
processes) above the cap, the job is cancelled (JobCancelled in its thread, or its
process tree killed); a job that does not stop within :data:`STOP_GRACE_SECONDS`
fails at once, naming the limit, and the server restarts (its nanny starts a fresh
process) once the executor has the result. Dask's own memory thresholds stay off.
No ``RLIMIT_AS``: CUDA reserves huge address ranges.

``SNAKEMAKE_CONTEXT_TIME_SCALE`` (test-only, default 1) multiplies every runtime.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..jobspec import ContextJobSpec, JobResult, PlainJobSpec

if TYPE_CHECKING:
    from .server import ContextServer

__all__ = [
    "MEMORY_CAP_VARIABLE",
    "RECYCLE_VARIABLE",
    "SAMPLE_SECONDS",
    "STOP_GRACE_SECONDS",
    "TIME_SCALE_VARIABLE",
    "MemoryWatchdog",
    "ServerLimits",
    "limit_seconds",
    "memory_cap",
    "memory_message",
    "process_tree_rss",
    "run_limited",
    "time_scale",
]

logger = logging.getLogger(__name__)

#: Test-only: a factor on every runtime limit (0.01 makes a minute 0.6 s).
TIME_SCALE_VARIABLE = "SNAKEMAKE_CONTEXT_TIME_SCALE"
#: The server's memory cap ("8GB"; unset, "0" or "none": no cap). Set by the
#: executor's --context-memory-cap for its embedded cluster; export it before
#: `snakemake-context up` for a persistent one.
MEMORY_CAP_VARIABLE = "SNAKEMAKE_CONTEXT_MEMORY_CAP"
#: Restart a server after this many jobs left threads running (default 3; 0: never).
RECYCLE_VARIABLE = "SNAKEMAKE_CONTEXT_RECYCLE_AFTER_LEAKS"
#: Seconds a cancelled job has to stop before its server restarts.
STOP_GRACE_SECONDS = 5.0
#: Seconds between two samples of the memory watchdog.
SAMPLE_SECONDS = 0.5


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


def memory_cap(text: str | None = None) -> int | None:
    """The memory cap in bytes from a size ("8GB"), or None for none. Raises
    ValueError naming the value when it is not a size."""
    text = os.environ.get(MEMORY_CAP_VARIABLE, "") if text is None else text
    text = text.strip()
    if not text or text.lower() in ("0", "none", "off", "no"):
        return None
    from dask.utils import parse_bytes

    try:
        cap = int(parse_bytes(text))
    except (ValueError, TypeError):
        raise ValueError(
            f"memory cap {text!r} is not a size; give one like '8GB' or 'none'"
        ) from None
    if cap <= 0:
        raise ValueError(f"memory cap {text!r} must be positive")
    return cap


def process_tree_rss(pid: int | None = None) -> int:
    """Resident bytes of a process and all its descendants."""
    import psutil

    root = psutil.Process(pid)
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total


class MemoryWatchdog:
    """Samples the server's RSS (children included) every :data:`SAMPLE_SECONDS`;
    above ``cap`` it calls ``exceeded(rss)``."""

    def __init__(
        self,
        cap: int,
        exceeded: Callable[[int], None],
        measure: Callable[[], int] = process_tree_rss,
    ) -> None:
        self.cap = cap
        self._exceeded = exceeded
        self._measure = measure
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name="snakemake-context-memory-watchdog", daemon=True
        )
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            try:
                rss = self._measure()
            except Exception as error:
                logger.debug("memory sample failed: %r", error)
                continue
            if rss > self.cap:
                self._exceeded(rss)

    def stop(self) -> None:
        """Stop sampling."""
        self._stop.set()


@dataclass(frozen=True)
class ServerLimits:
    """A server's memory cap (bytes, or None) and how many leaking jobs restart it."""

    memory_cap: int | None
    recycle_after: int

    @classmethod
    def of(cls, cap: str, recycle_after_leaks: int) -> ServerLimits:
        """From the server's config; "" and -1 read the environment (see the module)."""
        try:
            parsed = memory_cap(cap or None)
        except ValueError as error:
            logger.warning("no memory cap: %s", error)
            parsed = None
        if recycle_after_leaks < 0:
            try:
                recycle_after_leaks = max(0, int(os.environ.get(RECYCLE_VARIABLE, "3")))
            except ValueError:
                recycle_after_leaks = 3
        return cls(parsed, recycle_after_leaks)

    def memory_message(self, rss: int) -> str:
        """Why the watchdog stops a job."""
        assert self.memory_cap is not None
        return memory_message(self.memory_cap, rss)


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB"


def memory_message(cap: int, rss: int) -> str:
    """Why the watchdog stopped a job."""
    return (
        f"the server's memory cap of {_gib(cap)} (--context-memory-cap): the server "
        f"and its child processes used {_gib(rss)}. Fix: raise the cap, or make the "
        "job need less memory"
    )


def run_limited(server: ContextServer, spec: ContextJobSpec | PlainJobSpec) -> JobResult:
    """Run a job under its runtime and the server's memory cap (see the module)."""
    seconds = limit_seconds(spec.runtime_minutes)
    box: list[JobResult] = []
    done = threading.Event()

    def body() -> None:
        try:
            box.append(server.run(spec))
        finally:
            done.set()

    thread = threading.Thread(target=body, name=f"snakemake-context job {spec.key}", daemon=True)
    started = time.monotonic()
    thread.start()
    reason = None
    while not done.wait(0.1):
        running = server.running_job(spec.key)
        if running is not None and running.limit:
            reason = running.limit
        elif seconds is not None and time.monotonic() - started > seconds:
            rule = getattr(spec, "rule", "") or spec.title
            reason = (
                f"its runtime limit of {spec.runtime_minutes:g} min (the `runtime` "
                f"resource of rule '{rule}'{_scaled()}). Fix: raise the rule's runtime, "
                "or make the job faster"
            )
        if reason:
            break
    if reason is None:
        return box[0]
    message = f"{spec.title}: stopped by {reason}"
    running = server.running_job(spec.key)
    if running is not None:
        running.limit = running.limit or reason
        running.request_cancel()
    if done.wait(STOP_GRACE_SECONDS):
        result = box[0]
        result.ok, result.cancelled = False, False
        result.message = f"{message}."
        cap = server.limits.memory_cap
        if cap is not None and "memory cap" in reason and process_tree_rss() > cap:
            server.restart_after(spec.key, f"memory still above the cap after stopping {spec.key}")
        return result
    logger.warning("%s did not stop within %g s: restarting", spec.title, STOP_GRACE_SECONDS)
    server.restart_after(spec.key, f"{spec.title} did not stop after {reason}")
    now = time.time()
    return JobResult(
        key=spec.key,
        ok=False,
        server=server.identity,
        started=now - (time.monotonic() - started),
        finished=now,
        message=(
            f"{message}. It did not stop within "
            f"{STOP_GRACE_SECONDS:g} s of being cancelled, so {server.identity.describe()} "
            "restarts (its loaded contexts go with it)."
        ),
        log_path=os.path.join(spec.workdir, spec.log_path),
    )


def _scaled() -> str:
    scale = time_scale()
    return "" if scale == 1 else f", scaled by {TIME_SCALE_VARIABLE}={scale:g}"
