"""What the dispatch state machine (:mod:`.machine`) takes and returns.

Stimuli are what happened (a job is ready, an attempt ended, an event of the fleet,
Dask's list of workers, a tick, Ctrl-C); commands are what the executor must do
(submit, cancel, stop, report, record, log, poll). Every stimulus carries ``now``
(wall-clock seconds), so the machine never reads a clock. Plain data only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ContextExecutorError
from ..fleet import events as ev
from ..fleet.keys import attempt_log, attempt_number
from ..fleet.outcome import Outcome
from ..fleet.placement import PlacementStep
from ..fleet.resources import Requirements
from ..terminal import printable, shortened

__all__ = [
    "AttemptEnded",
    "CachesProbed",
    "Cancel",
    "CancelAll",
    "Command",
    "DagPlanned",
    "FleetEvent",
    "JobReady",
    "JobTicket",
    "Log",
    "Poll",
    "PoolFailed",
    "ProbeCaches",
    "Record",
    "ReportError",
    "ReportSuccess",
    "SchedulerLost",
    "ServersPolled",
    "Stimulus",
    "StopQueued",
    "StopRunning",
    "Stopped",
    "Submit",
    "Tick",
]


@dataclass(frozen=True)
class JobTicket:
    """What dispatch knows of one Snakemake job (built by :mod:`..executor.jobbuild`)."""

    #: The job key (:func:`..fleet.keys.job_key`); attempts add their number to it.
    key: str
    #: "rule 'score'" or "group 'g'", for messages.
    label: str
    #: "Rule 'score' (shard=3)" or "Group 'g'", for messages.
    title: str
    #: The rule's name ("group <id>" for a group job), as the catalog stores it.
    rule: str
    jobid: str = ""
    snakemake_attempt: int = 1
    wildcards: Mapping[str, str] = field(default_factory=dict)
    #: "context", "plain", "group" (with a context member) or "invalid".
    kind: str = "plain"
    requirements: Requirements = field(default_factory=Requirements)
    #: The job's Dask resources (:func:`..fleet.resources.job_resources`).
    wanted: Mapping[str, float] = field(default_factory=dict)
    #: The context's identity and name (None for a plain job).
    identity: str | None = None
    context: str | None = None
    #: False: its context cannot serve two jobs at once (each takes a whole server).
    shareable: bool = True
    priority: int = 0
    #: When Snakemake handed the job to the executor.
    submitted: float = 0.0
    #: The first attempt's log (relative to the workflow directory); later attempts
    #: keep their own (:func:`..fleet.keys.attempt_log`).
    log_path: str = ""
    #: Its output files, for the catalog (:attr:`..fleet.events.JobDispatched.outputs`).
    outputs: tuple[str, ...] = ()
    #: A group's members, each a job of its own for the catalog and the run's demand.
    members: tuple[JobTicket, ...] = ()
    #: How many of the jobs Snakemake planned it is (a group: all of its jobs).
    jobs: int = 1

    def unplaced_label(self) -> str:
        """How a job no server can run is named: a group by its widest member (whose
        rule the fix changes), as a group's members share one server."""
        if not self.members:
            return self.label
        need = max(self.members, key=lambda t: (t.requirements.gpu, t.requirements.mem_mb or 0))
        return (
            f"{need.label} in {self.label} (a group's members run on one server, which "
            "needs its widest member's resources, not their sum)"
        )

    def dispatched(
        self, run_id: str, key: str, address: str | None, step: str, now: float
    ) -> ev.JobDispatched:
        """The catalog's record of attempt ``key`` going to ``address`` (its log: the
        attempt's own, :func:`~..fleet.keys.attempt_log`)."""
        return ev.JobDispatched(
            at=now,
            run_id=run_id,
            key=key,
            jobid=self.jobid,
            attempt=self.snakemake_attempt,
            rule=self.rule,
            wildcards=dict(self.wildcards),
            job_kind=self.kind,
            # A group's context is its members' (its time is theirs, counted once).
            context=None if self.members else self.identity,
            context_name=None if self.members else self.context,
            target=address,
            submitted=self.submitted,
            reason=step,
            log=attempt_log(self.log_path, attempt_number(key)),
            outputs=list(self.outputs),
        )

    def story(
        self, run_id: str, attempt: str | None, what: str, detail: str, now: float
    ) -> ev.JobStory:
        """The catalog's record of a decision about the job (see :mod:`.storylog`)."""
        return ev.JobStory(
            at=now,
            run_id=run_id,
            key=attempt or self.key,
            jobid=self.jobid,
            rule=self.rule,
            what=what,
            detail=detail,
        )

    def reported(
        self,
        run_id: str,
        key: str,
        outcome: ev.JobOutcome,
        message: str | None,
        *,
        counted: bool = True,
    ) -> ev.JobReported:
        """The catalog's record of the job's outcome, as reported to Snakemake
        (``counted`` False: a group's member, which its group's report counts)."""
        return ev.JobReported(
            run_id=run_id,
            key=key,
            jobid=self.jobid,
            rule=self.rule,
            outcome=outcome,
            message=(message or "")[:4000] or None,
            outputs=list(self.outputs),
            jobs=self.jobs if counted else 0,
        )


# -- stimuli ---------------------------------------------------------------------------


@dataclass(frozen=True)
class JobReady:
    """Snakemake handed the executor a job (``error``: why it cannot be made a task)."""

    ticket: JobTicket
    now: float
    error: ContextExecutorError | None = None


@dataclass(frozen=True)
class AttemptEnded:
    """An attempt's result arrived (the authoritative end of the attempt), or its
    task ended without one (it erred, or was cancelled in Dask: ``outcome`` None)."""

    key: str
    now: float
    #: What the attempt did on its server, as the server sealed it.
    outcome: Outcome | None = None
    message: str | None = None
    aux_logs: tuple[str, ...] = ()
    #: Cancelled in Dask (an attempt without an outcome).
    dask_cancelled: bool = False
    #: A group's: how each member that ran ended (its outcome, its failure's message).
    members: tuple[tuple[Outcome, str | None], ...] = ()

    @property
    def ok(self) -> bool:
        """Whether the attempt succeeded."""
        return self.outcome is not None and self.outcome.ok

    @property
    def cancelled(self) -> bool:
        """Whether it was stopped on request (on its server, or in Dask)."""
        return self.outcome.cancelled if self.outcome is not None else self.dask_cancelled


@dataclass(frozen=True)
class FleetEvent:
    """An event of the fleet, as the scheduler published it."""

    event: ev.Event
    now: float


@dataclass(frozen=True)
class ServersPolled:
    """Dask's list of workers (address -> name, resources, slots), at a fleet check."""

    workers: Mapping[str, Mapping[str, Any]]
    now: float


@dataclass(frozen=True)
class Tick:
    """Time passed (a fleet check)."""

    now: float


@dataclass(frozen=True)
class CancelAll:
    """Snakemake cancels the run (Ctrl-C): queued jobs are dropped, running ones
    stopped."""

    now: float


@dataclass(frozen=True)
class SchedulerLost:
    """The cluster's scheduler is gone (``why``: what is known of its end)."""

    why: str
    now: float


@dataclass(frozen=True)
class PoolFailed:
    """The run's pool of pilots could not submit one (``why``: the command and what it
    said): no job waiting for a pilot would ever start, so the queued ones fail now."""

    why: str
    now: float


@dataclass(frozen=True)
class StopQueued:
    """Snakemake stops once its running jobs end (SIGTERM): drop the queued ones."""

    why: str
    now: float


@dataclass(frozen=True)
class Stopped:
    """The attempts of a :class:`StopRunning` are stopped where they ran (the run's
    cluster killed, or each job stopped or its server restarted): those whose end has
    not come back end now, cancelled."""

    keys: tuple[str, ...]
    now: float


@dataclass(frozen=True)
class DagPlanned:
    """The jobs of the run's DAG that will reach the executor: Snakemake job id ->
    the context identity each needs (None: none, or not known before it runs)."""

    jobs: Mapping[str, str | None]
    now: float


@dataclass(frozen=True)
class CachesProbed:
    """Which declared contexts each server's local cache holds (address ->
    identities), as the loaders' cache probes answered."""

    found: Mapping[str, tuple[str, ...]]
    now: float


Stimulus = (
    JobReady
    | AttemptEnded
    | FleetEvent
    | ServersPolled
    | Tick
    | CancelAll
    | DagPlanned
    | CachesProbed
    | SchedulerLost
    | PoolFailed
    | StopQueued
    | Stopped
)


# -- commands --------------------------------------------------------------------------
# Every command carries the id of the stimulus that led to it (``stimulus``, set by
# :meth:`.machine.Dispatch.handle`; its story, :mod:`.storylog`).


@dataclass(frozen=True)
class Submit:
    """Submit attempt ``key`` of a job to server ``address`` (None: Dask chooses)."""

    key: str
    ticket: JobTicket
    address: str | None
    step: PlacementStep
    stimulus: str = field(default="", compare=False)


@dataclass(frozen=True)
class Cancel:
    """Drop attempt ``key`` in Dask (its server is gone, or the job was given up)."""

    key: str
    stimulus: str = field(default="", compare=False)


@dataclass(frozen=True)
class StopRunning:
    """Stop these attempts where they run (the run is cancelled)."""

    keys: tuple[str, ...]
    stimulus: str = field(default="", compare=False)


@dataclass(frozen=True)
class ReportSuccess:
    """Tell Snakemake the job succeeded."""

    ticket: JobTicket
    stimulus: str = field(default="", compare=False)


@dataclass(frozen=True)
class ReportError:
    """Tell Snakemake the job failed, with this message and these logs. ``error`` is
    the plugin's own failure, when it is one (an invalid job, or
    :class:`~..errors.NoServerError` when no server can run it); None when the job
    itself failed on its server."""

    ticket: JobTicket
    message: str
    aux_logs: tuple[str, ...] = ()
    error: ContextExecutorError | None = field(default=None, compare=False)
    stimulus: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        # Snakemake prints it: names and wildcards in it reach the terminal escaped,
        # and a long one only in part (the job's log has it whole).
        message = shortened(self.message, self.aux_logs[0]) if self.aux_logs else self.message
        object.__setattr__(self, "message", printable(message))


@dataclass(frozen=True)
class Record:
    """Send an event to the catalog."""

    event: ev.Event
    stimulus: str = field(default="", compare=False)


@dataclass(frozen=True)
class Log:
    """Write a line to Snakemake's log (``level``: debug, info or warning); its text
    is kept with its control characters escaped (:func:`..terminal.printable`)."""

    level: str
    message: str
    stimulus: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "message", printable(self.message))


@dataclass(frozen=True)
class Poll:
    """Look at attempt ``key``'s Dask future: its event came, its result did not."""

    key: str
    stimulus: str = field(default="", compare=False)


@dataclass(frozen=True)
class ProbeCaches:
    """Ask every server's cache probes again (a conversion may have filled a cache)."""

    stimulus: str = field(default="", compare=False)


Command = (
    Submit | Cancel | StopRunning | ReportSuccess | ReportError | Record | Log | Poll | ProbeCaches
)
