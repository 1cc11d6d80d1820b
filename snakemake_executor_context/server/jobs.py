"""The jobs a server runs: each one in-process or as a plain job, under its limits
(the watch loop: :mod:`.policy` says which limit a job broke), and what its end means
for the server (a leaking or CUDA-fatal job makes it recycle: the server's one way
out, passed in as ``recycle``)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from distributed.protocol import dumps as dumps_message
from distributed.protocol.pickle import dumps as dumps_pickle

from ..fleet import events as ev
from ..fleet.outcome import Outcome, ServerIdentity
from ..jobspec import ContextJobSpec, GroupJobSpec, JobResult, PlainJobSpec
from ..strays.jobsweep import JobSpans
from ..strays.processgroups import GroupRecord
from ..terminal import error_text
from .cache import ContextCache, free_gpu_cache
from .contextjob import run_context
from .groupjob import run_group
from .inventory import ServerStats
from .memwatch import process_tree_rss
from .plain import run_plain_job
from .policy import STOP_GRACE_SECONDS, ServerLimits, broken_limit, gpu_failure, memory_message
from .running import RunningJob
from .slots.serverslots import ServerSlots

__all__ = ["ServerJobs"]

Spec = ContextJobSpec | PlainJobSpec | GroupJobSpec

logger = logging.getLogger(__name__)


class ServerJobs:
    """The jobs running on one server, and how they ran."""

    def __init__(
        self,
        *,
        identity: ServerIdentity,
        cache: ContextCache,
        slots: ServerSlots,
        groups: GroupRecord,
        stats: ServerStats,
        limits: ServerLimits,
        gpu_model: str,
        threads_per_slot: int,
        emit: Callable[..., None],
        recycle: Callable[[str, str], None],
        draining: Callable[[], bool],
        abandoned: Callable[[str], bool] = lambda key: False,
    ) -> None:
        self.identity = identity
        self.cache, self.slots, self.groups, self.stats = cache, slots, groups, stats
        self.limits, self.gpu_model, self.threads_per_slot = limits, gpu_model, threads_per_slot
        self.emit, self.recycle, self.draining = emit, recycle, draining
        self.abandoned = abandoned
        self._lock = threading.RLock()
        self._running: dict[str, RunningJob] = {}
        self._durations: dict[str | None, tuple[int, float]] = {}
        self.leaky_jobs = 0
        #: What its in-process jobs leave running is ended (:mod:`..strays.jobsweep`).
        self.spans = JobSpans(identity.describe(), emit)

    def run_bounded(self, spec: Spec) -> JobResult:
        """Run one job under its limits (runtime, memory cap), if it has any: in a
        thread of its own, watched from this one (see :mod:`.policy`). A group has
        none of its own: each member runs under its own (:meth:`_member`)."""
        if isinstance(spec, GroupJobSpec):
            return self._caught(spec)
        return self._bounded(spec, lambda: self._caught(spec))

    def _bounded(
        self, spec: ContextJobSpec | PlainJobSpec, work: Callable[[], JobResult]
    ) -> JobResult:
        """``work``'s result, run under the job's limits (see :meth:`run_bounded`)."""
        if spec.runtime_minutes is None and self.limits.memory_cap is None:
            return work()
        box: list[JobResult] = []
        done = threading.Event()

        def body() -> None:
            try:
                box.append(work())
            finally:
                done.set()

        thread = threading.Thread(target=body, name=f"snakemake-context job {spec.key}")
        thread.daemon = True
        started = time.monotonic()
        thread.start()
        reason = None
        while reason is None and not done.wait(0.1):
            running = self.running_job(spec.key)
            reason = broken_limit(
                rule=spec.rule or spec.title,
                runtime_minutes=spec.runtime_minutes,
                elapsed=time.monotonic() - started,
                flagged=running.limit if running is not None else None,
            )
        if reason is None:
            return box[0]
        return self._stop_for_limit(spec, reason, done, box, started)

    def _caught(self, spec: Spec) -> JobResult:
        """:meth:`run`, with what it raises (the plugin's fault, not the job's) turned
        into the job's failure, naming the job: never a bare error in Dask."""
        started = time.time()
        try:
            return self.run(spec)
        except BaseException as error:
            logger.error("%s raised on this server", spec.title, exc_info=error)
            return self._failed(spec, started, error_text(error), fault="the server raised")

    def _failed(self, spec: Spec, started: float, what: str, fault: str = "") -> JobResult:
        """The failed result of a job that ended without one of its own (``fault``:
        why that was its server's, as :attr:`.Outcome.fault`)."""
        outcome = Outcome(
            spec.key,
            self.identity,
            started=started,
            finished=time.time(),
            context=_identity(spec),
            fault=fault,
        )
        log_path = os.path.join(spec.workdir, spec.log_path)
        message = f"{spec.title}: failed on {self.identity.describe()}: {what} (log: {log_path})."
        return JobResult(outcome, message=message, log_path=log_path)

    def _sendable(self, spec: Spec, result: JobResult) -> JobResult:
        """The result, or its failure if Dask could not send it or its end's event
        (an unpicklable value in ``extra``, an int beyond msgpack's): Dask turns the
        one into a nameless error, and the other closes the server's connections."""
        try:
            dumps_pickle(result)
            dumps_message(ev.encode([result.outcome.finished_event(spec.run_id)]))
        except Exception as error:
            what = f"its result cannot be sent back ({error_text(error)})"
            return self._failed(spec, result.outcome.started, what)
        return result

    def _stop_for_limit(
        self,
        spec: ContextJobSpec | PlainJobSpec,
        reason: str,
        done: threading.Event,
        box: list[JobResult],
        started: float,
    ) -> JobResult:
        message = f"{spec.title}: stopped by {reason}"
        running = self.running_job(spec.key)
        if running is not None:
            running.limit = running.limit or reason
            running.request_cancel()
        if done.wait(STOP_GRACE_SECONDS):
            result = box[0]
            result.end(f"{message}.", ok=False, cancelled=False)
            cap = self.limits.memory_cap
            if cap is not None and "memory cap" in reason and process_tree_rss() > cap:
                self.recycle(spec.key, f"memory still above the cap after stopping {spec.key}")
            return result
        logger.warning("%s did not stop within %g s: restarting", spec.title, STOP_GRACE_SECONDS)
        self.recycle(spec.key, f"{spec.title} did not stop after {reason}")
        now = time.time()
        outcome = Outcome(
            spec.key, self.identity, started=now - (time.monotonic() - started), finished=now
        )
        return JobResult(
            outcome,
            message=(
                f"{message}. It did not stop within {STOP_GRACE_SECONDS:g} s of being "
                f"cancelled, so {self.identity.describe()} restarts (its loaded contexts "
                "go with it)."
            ),
            log_path=os.path.join(spec.workdir, spec.log_path),
        )

    def running_job(self, key: str) -> RunningJob | None:
        """The running job of that key, if it runs here."""
        with self._lock:
            return self._running.get(key)

    def memory_exceeded(self, rss: int) -> None:
        """The memory watchdog saw the server above its cap: every job stops."""
        cap = self.limits.memory_cap
        with self._lock:
            jobs = [job for job in self._running.values() if not job.limit]
        for job in jobs:
            job.limit = memory_message(cap or 0, rss)

    def run(self, spec: Spec) -> JobResult:
        """Run one job (or group) and report its outcome; never raises for a job's
        own failure."""
        identity = _identity(spec)
        while self.draining():  # never started here: placed again once the server is gone
            time.sleep(1.0)
        running = self._enter(spec.key, identity)
        self.emit(
            ev.JobStarted(
                run_id=spec.run_id, key=spec.key, address=self.identity.address, context=identity
            )
        )
        trace = self.cache.track()
        try:
            if isinstance(spec, GroupJobSpec):
                width = max(1, self.slots.slots)
                result = run_group(spec, running, self._member, self.identity, width)
            else:
                result = self._one(spec, running)
            result.end(
                evicted=tuple(trace.evicted),
                conversions=trace.conversions,
                reload_seconds=trace.reload_seconds,
                # A group's time is its members': measured from each of them.
                context=None if isinstance(spec, GroupJobSpec) else identity,
                gpu_model=self.gpu_model,
            )
            result = self._sendable(spec, result)
            if self.abandoned(spec.key):
                # Handed back as the server leaves (a lost gang): the attempt is lost
                # with the server and runs again, so its result must never reach the
                # executor, and it stays in the record of what ran at the exit.
                logger.warning("%s handed back: its result is dropped", spec.key)
                threading.Event().wait()
        finally:
            self.cache.stop_tracking()
            self._leave(running)
        # Ahead of its result, with what its tick had queued (:mod:`.outbox`).
        self.emit(result.outcome.finished_event(spec.run_id), now=True)
        if not isinstance(spec, GroupJobSpec):  # a group's members were counted each
            self._after(spec.key, result)
        return result

    def _enter(self, key: str, identity: str | None, *, recorded: bool = True) -> RunningJob:
        """Register a running job; ``recorded``: also in the file that blames a crash
        on it (a group's members are not: the crash is the group's, its one attempt)."""
        running = RunningJob(
            key, threading.get_ident(), identity=identity, started=time.time(), recorded=recorded
        )
        with self._lock:
            self._running[key] = running
            if recorded:
                self.groups.started(key)
        return running

    def _leave(self, running: RunningJob) -> None:
        running.leave_phase()
        with self._lock:
            self._running.pop(running.key, None)
            if running.recorded:
                self.groups.finished(running.key)
        running.done.set()

    def _one(self, spec: ContextJobSpec | PlainJobSpec, running: RunningJob) -> JobResult:
        if isinstance(spec, ContextJobSpec):
            return run_context(
                spec,
                running,
                cache=self.cache,
                slots=self.slots,
                identity=self.identity,
                threads_per_slot=self.threads_per_slot,
                spans=self.spans,
            )
        return run_plain_job(spec, self.identity, running, self.groups)

    def _member(self, spec: ContextJobSpec | PlainJobSpec, group: RunningJob) -> JobResult | None:
        """Run one member of a running group under its own limits, as a job of its
        own (None: the group was cancelled first); cancelling the group cancels it."""
        running = self._enter(spec.key, _identity(spec), recorded=False)
        if not group.adopt(running):
            self._leave(running)
            return None

        def work() -> JobResult:
            running.thread_id = threading.get_ident()  # where a cancellation must land
            started = time.time()
            try:
                result = self._one(spec, running)
                result.end(context=_identity(spec), gpu_model=self.gpu_model)
            except BaseException as error:
                logger.error("%s raised on this server", spec.title, exc_info=error)
                result = self._failed(spec, started, error_text(error))
            finally:
                self._leave(running)
            return result

        result = self._bounded(spec, work)
        self._after(spec.key, result)
        return result

    def _after(self, key: str, result: JobResult) -> None:
        """Count the job; what it leaked, and how it failed, may end the server."""
        outcome = result.outcome
        lost = self.slots.group.take_unrestorable()
        if lost:
            reason = f"{key} changed what cannot be put back: {'; '.join(lost)}"
            result.extra.setdefault("warnings", []).append(
                f"{self.identity.describe()} restarts: {reason}."
            )
            self.recycle(key, reason)
        for warning in result.extra.get("warnings", ()):
            logger.warning("%s", warning)
        if result.extra.get("leaks", {}).get("threads"):
            self.leaky_jobs += 1
            if self.limits.recycle_after and self.leaky_jobs >= self.limits.recycle_after:
                result.extra.setdefault("warnings", []).append(
                    f"{self.identity.describe()} restarts: {self.leaky_jobs} jobs left "
                    "threads running (--context-tuning recycle_after_leaks)."
                )
                self.recycle(key, f"{self.leaky_jobs} jobs left threads running")
        self.stats.jobs += 1
        if outcome.ok:
            count, total = self._durations.get(outcome.context, (0, 0.0))
            seconds = outcome.finished - outcome.started
            self._durations[outcome.context] = (count + 1, total + seconds)
        if outcome.cancelled:
            self.stats.jobs_cancelled += 1
        elif not outcome.ok:
            self.stats.jobs_failed += 1
            failure = gpu_failure(result.message or "")
            if failure == "fatal":
                text = (result.message or "").strip().splitlines()[0][:200]
                self.recycle(key, f"recycled after a CUDA-fatal error: {text}")
            elif failure == "oom":
                self.stats.cuda_ooms += 1
                free_gpu_cache()

    def cancel(self, keys: list[str], grace: float = 10.0) -> dict[str, str]:
        """Stop the named jobs if they run here: 'stopped', 'running' (stuck) or absent."""
        with self._lock:
            targets = {key: self._running[key] for key in keys if key in self._running}
        for job in targets.values():
            job.request_cancel()
        deadline = time.monotonic() + grace
        outcome = {}
        for key, job in targets.items():
            finished = job.done.wait(max(0.0, deadline - time.monotonic()))
            outcome[key] = "stopped" if finished else "running"
        return outcome

    def running(self) -> dict[str, RunningJob]:
        """The jobs running now, by key."""
        with self._lock:
            return dict(self._running)

    def mean_job_seconds(self, identity: str | None) -> float | None:
        """The mean time of this server's successful jobs of that context (None:
        none yet; ``identity`` None: plain jobs)."""
        count, total = self._durations.get(identity, (0, 0.0))
        return total / count if count else None


def _identity(spec: Spec) -> str | None:
    """The context a job runs against (None: a plain job); a group's is its first
    context member's (the one it was placed for)."""
    if isinstance(spec, GroupJobSpec):
        return next((_identity(m) for m in spec.members if isinstance(m, ContextJobSpec)), None)
    return spec.declaration.identity if isinstance(spec, ContextJobSpec) else None
