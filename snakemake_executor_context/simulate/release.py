"""Snakemake's side of a simulated run: which jobs are ready, and their release.

Snakemake hands a remote executor at most ``--jobs`` jobs at a time, no more than
``--max-jobs-per-timespan`` a second, and its own process spends time on each
(selecting, submitting, hearing the report back: serial work, measured here); local
rules (and plain jobs run locally) it runs itself, on its local cores. A job becomes
ready when every job it depends on has been reported ok; after a failure nothing new
is released (Snakemake without ``--keep-going``).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from typing import Protocol

from .clock import Clock
from .workload import SimJob, Workload

__all__ = ["Release"]


class _Host(Protocol):
    clock: Clock

    def hand_over(self, job: SimJob) -> None: ...


class Release:
    """The jobs' dependencies, the ready ones, and what Snakemake has handed over."""

    def __init__(
        self,
        host: _Host,
        workload: Workload,
        *,
        jobs: int,
        job_seconds: float,
        per_second: float,
        local_cores: int,
        local_seconds: Callable[[SimJob], float],
        locally: Callable[[SimJob], bool],
    ) -> None:
        self.host, self.clock = host, host.clock
        self.limit, self.job_seconds = max(1, jobs), job_seconds
        self.per_second, self.local_cores = per_second, max(1, local_cores)
        self.local_seconds, self.locally = local_seconds, locally
        self.jobs = {job.jobid: job for job in workload.jobs}
        self._order = {job.jobid: n for n, job in enumerate(workload.jobs)}
        self._waiting = {job.jobid: len(set(job.deps)) for job in workload.jobs}
        self._dependents: dict[str, list[str]] = {}
        for job in workload.jobs:
            for dep in set(job.deps):
                self._dependents.setdefault(dep, []).append(job.jobid)
        self._ready: list[tuple[int, int, str]] = []
        self._local: deque[SimJob] = deque()
        self._handed: deque[float] = deque()
        self.active = self.local_running = 0
        self.done = self.failed = 0
        self._busy_until = 0.0
        self._handing = False
        #: When the last job ended (reported, or ran locally).
        self.last_end = 0.0

    @property
    def finished(self) -> bool:
        """Nothing runs and nothing more will be released."""
        idle = self.active == 0 and self.local_running == 0 and not self._handing
        return idle and (self.failed > 0 or self.done == len(self.jobs))

    def start(self) -> None:
        """Release the jobs that depend on nothing."""
        for jobid, count in self._waiting.items():
            if count == 0:
                self._make_ready(self.jobs[jobid])
        self._release()

    def ended(self, jobid: str, ok: bool) -> None:
        """The executor reported a job (or a local one ended)."""
        job = self.jobs[jobid]
        if self.locally(job):
            self.local_running -= 1
        else:
            self.active -= 1
        self.last_end = self.clock.now
        if not ok:
            self.failed += 1
            return
        self.done += 1
        for dependent in self._dependents.get(jobid, ()):
            self._waiting[dependent] -= 1
            if self._waiting[dependent] == 0:
                self._make_ready(self.jobs[dependent])
        self._release()

    def _make_ready(self, job: SimJob) -> None:
        if self.locally(job):
            self._local.append(job)
        else:
            heapq.heappush(self._ready, (-job.priority, self._order[job.jobid], job.jobid))

    def _release(self) -> None:
        if self.failed:
            return
        while self._local and self.local_running < self.local_cores:
            job = self._local.popleft()
            self.local_running += 1
            self.clock.after(self.local_seconds(job), self.ended, job.jobid, True)
        if self._ready and self.active < self.limit and not self._handing:
            self._handing = True
            self._hand_next()

    def _hand_next(self) -> None:
        """Hand over one ready job: Snakemake's own time for it first, within its rate."""
        if not self._ready or self.active >= self.limit or self.failed:
            self._handing = False
            return
        now = self.clock.now
        while self._handed and self._handed[0] <= now - 1.0:
            self._handed.popleft()
        if len(self._handed) >= self.per_second:
            self.clock.at(self._handed[0] + 1.0, self._hand_next)
            return
        _, _, jobid = heapq.heappop(self._ready)
        self.active += 1
        self._handed.append(now)
        at = max(now, self._busy_until) + self.job_seconds
        self._busy_until = at
        self.clock.at(at, self._handed_over, self.jobs[jobid])

    def _handed_over(self, job: SimJob) -> None:
        self.host.hand_over(job)
        self._hand_next()
