"""What a server's jobs leave running: ended at their end, and named (how they are
found and ended: :mod:`..strays.processes`; the server is a child subreaper, so what a job
detaches stays below it).

- A plain job's processes carry its mark (:func:`plain_environment`): once the job
  has ended, every process that still carries it is ended, and named in its log.
- In-process jobs share the server's environment, so their processes are told apart
  by when they started. A *span* is a stretch of time in which at least one
  in-process job runs (:class:`JobSpans`); when the last one ends, what started below
  the server during the span is ended, except a plain job's and the server's own
  (:data:`..strays.processes.OWN`). With one job in the span (always, with one slot) it is
  named in that job's log; with several, nobody can tell whose it was: it is named in
  the server's log and in the story of every job of the span. A job in another slot
  never loses its children: nothing is ended while an in-process job runs.
- What a context's loader starts belongs to the context (:func:`context_processes`)
  and is ended when the context is evicted (:func:`end_context_processes`).
- A process started with ``SNAKEMAKE_CONTEXT_KEEP=1`` in its environment is left
  running on purpose, and named; it lives until its server ends.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..defaults import JOB_MARK_VARIABLE, KEEP_VARIABLE, LEFTOVER_GRACE_SECONDS
from ..fleet import events as ev
from ..jobspec import ContextJobSpec, JobResult
from .decisions import Leftovers, ProcessFacts, describe, job_leftovers, span_leftovers
from .processes import (
    OWN,
    TaskWatch,
    end_leftovers,
    has_ended_child,
    is_subreaper,
    read_processes,
    ticks_now,
)

__all__ = [
    "JobSpans",
    "Sweep",
    "context_processes",
    "end_context_processes",
    "end_plain_leftovers",
    "plain_environment",
    "tell_job",
]

logger = logging.getLogger(__name__)


@dataclass
class Sweep:
    """What one sweep found, what it ended, and the jobs it is about."""

    found: Leftovers
    ended: list[ProcessFacts] = field(default_factory=list)
    jobs: list[ContextJobSpec] = field(default_factory=list)

    def lines(self, whom: str, where: str) -> list[str]:
        """One line for what was ended, one for what was kept on purpose."""
        lines = []
        if self.ended:
            lines.append(
                f"{whom} left {len(self.ended)} process(es) running on {where}; ended "
                f"them: {describe(self.ended)}"
            )
        if self.found.kept:
            lines.append(
                f"{whom} left {len(self.found.kept)} process(es) running on {where} on "
                f"purpose ({KEEP_VARIABLE}=1), kept until the server ends: "
                f"{describe(self.found.kept)}"
            )
        return lines


def _mark(key: str) -> str:
    return f"{os.getpid()}:{key}"


def plain_environment(key: str, environment: dict[str, str]) -> dict[str, str]:
    """A plain job's environment, marked: every process it starts inherits the mark."""
    return {**environment, JOB_MARK_VARIABLE: _mark(key)}


def end_plain_leftovers(key: str) -> Sweep:
    """End what plain job ``key`` left running (call once it has ended)."""
    # Below this server when it is a subreaper (nothing escapes it), else anywhere.
    found = job_leftovers(read_processes(os.getpid() if is_subreaper() else None), _mark(key))
    return Sweep(found, end_leftovers(found.end, LEFTOVER_GRACE_SECONDS))


def tell_job(result: JobResult, lines: list[str]) -> None:
    """Name what a job left at the end of its log and in its warnings (the run's
    output and the server's log)."""
    if not lines:
        return
    result.extra.setdefault("warnings", []).extend(lines)
    if result.log_path:
        try:
            with open(result.log_path, "a") as log:
                log.write("".join(f"\n[snakemake-context] {line}" for line in lines) + "\n")
        except OSError as error:
            logger.warning("could not write to %s: %s", result.log_path, error)


class JobSpans:
    """The server's in-process jobs, by span (see the module docstring)."""

    def __init__(self, where: str, emit: Callable[..., None]) -> None:
        self._where = where
        self._emit = emit
        self._lock = threading.Lock()
        self._running: set[str] = set()
        self._span: list[ContextJobSpec] = []
        self._since = 0
        self._watch: TaskWatch | None = None

    def enter(self, spec: ContextJobSpec) -> None:
        """An in-process job starts (before its context loads and its script runs)."""
        with self._lock:
            if not self._running:
                # Before the span's start, so what it proves holds for the span. One
                # that proved the last span kept its pidfd open: the same descriptors
                # stay open from job to job (their reading is cheap when they do).
                if self._watch is None:
                    self._watch = TaskWatch()
                self._since, self._span = ticks_now(), []
            self._running.add(spec.key)
            self._span.append(spec)

    def leave(self, spec: ContextJobSpec) -> Sweep | None:
        """An in-process job ended: if it was the span's last, end what the span left.
        A span that started no process (most: :class:`.TaskWatch`) and left no ended
        child to reap has left nothing, which is known without reading a process."""
        with self._lock:
            self._running.discard(spec.key)
            if self._running:
                return None
            quiet = self._watch is not None and self._watch.none_since()
            if not quiet and self._watch is not None:
                self._watch.close()
                self._watch = None
            if quiet and not has_ended_child():
                self._span = []
                return None
            with OWN.starting():
                owned = OWN.identities()
                facts = read_processes(os.getpid(), owned)
            helpers = _interpreter_helpers()
            spared = {fact.identity for fact in facts if fact.pid in helpers}
            found = span_leftovers(facts, self._since, owned, os.getpid(), spared)
            jobs, self._span = self._span, []
        if not found:
            return None
        return Sweep(found, end_leftovers(found.end, LEFTOVER_GRACE_SECONDS), jobs)

    def tell(self, sweep: Sweep, result: JobResult) -> None:
        """Name what the span left: in the job's log if it was the span's one job,
        else in the server's log and the story of each of its jobs."""
        if [job.key for job in sweep.jobs] == [result.key]:
            tell_job(result, sweep.lines("The job", self._where))
            return
        whom = f"The {len(sweep.jobs)} in-process jobs that ran together"
        for line in sweep.lines(whom, self._where):
            logger.warning("%s (%s)", line, ", ".join(job.key for job in sweep.jobs))
            self._emit(
                *(
                    ev.JobStory(
                        run_id=job.run_id,
                        key=job.key,
                        jobid=str(job.jobid),
                        rule=job.rule,
                        what="leftovers",
                        detail=line,
                    )
                    for job in sweep.jobs
                )
            )


def _interpreter_helpers() -> set[int]:
    """multiprocessing's forkserver and resource tracker, if a job started them: the
    interpreter keeps them for every later job (which would fail to start a pool if
    the forkserver it knows had been ended and reaped)."""
    pids = set()
    forkserver = sys.modules.get("multiprocessing.forkserver")
    tracker = sys.modules.get("multiprocessing.resource_tracker")
    for owner, attribute in ((forkserver, "_forkserver"), (tracker, "_resource_tracker")):
        helper = getattr(owner, attribute, None)
        pid = getattr(helper, "_forkserver_pid", None) or getattr(helper, "_pid", None)
        if isinstance(pid, int):
            pids.add(pid)
    return pids


@contextmanager
def context_processes(identity: str) -> Iterator[None]:
    """Processes started while a context loads belong to it (if the load succeeds;
    a failed load's are its job's leftovers)."""
    since = ticks_now()
    yield
    OWN.claim(since, identity)


def end_context_processes(identity: str) -> None:
    """A context is evicted: end what its loader started, if its ``close()`` did not."""
    own = OWN.release(identity)
    ended = end_leftovers(own, LEFTOVER_GRACE_SECONDS) if own else []
    if ended:
        logger.warning("context %s evicted: ended its processes %s", identity, describe(ended))
