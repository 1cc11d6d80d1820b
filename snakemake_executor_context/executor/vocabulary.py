"""What the dispatch state machine (:mod:`.dispatch`) takes and returns.

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
from ..fleet.placement import PlacementStep
from ..fleet.resources import Requirements
from ..fleet.state import FleetState

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
    "Learned",
    "Log",
    "Poll",
    "ProbeCaches",
    "Record",
    "ReportError",
    "ReportSuccess",
    "ServersPolled",
    "Stimulus",
    "StopRunning",
    "Submit",
    "Tick",
]


@dataclass(frozen=True)
class JobTicket:
    """What dispatch knows of one Snakemake job (built by :mod:`.jobbuild`)."""

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
    #: "context", "plain" or "invalid".
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

    def dispatched(
        self, run_id: str, key: str, address: str | None, step: str, now: float
    ) -> ev.JobDispatched:
        """The catalog's record of attempt ``key`` going to ``address``."""
        return ev.JobDispatched(
            at=now,
            run_id=run_id,
            key=key,
            jobid=self.jobid,
            attempt=self.snakemake_attempt,
            rule=self.rule,
            wildcards=dict(self.wildcards),
            job_kind=self.kind,
            context=self.identity,
            context_name=self.context,
            target=address,
            submitted=self.submitted,
            reason=step,
        )

    def reported(
        self, run_id: str, key: str, outcome: ev.JobOutcome, message: str | None
    ) -> ev.JobReported:
        """The catalog's record of the job's outcome, as reported to Snakemake."""
        return ev.JobReported(
            run_id=run_id,
            key=key,
            jobid=self.jobid,
            rule=self.rule,
            outcome=outcome,
            message=(message or "")[:4000] or None,
        )


@dataclass(frozen=True)
class Learned:
    """What an attempt's result says about its server (for the fleet state and the
    catalog)."""

    address: str | None
    started: float = 0.0
    finished: float = 0.0
    items: int = 0
    load_seconds: float = 0.0
    loaded: tuple[str, ...] = ()
    reused: tuple[str, ...] = ()
    evicted: tuple[str, ...] = ()
    conversions: int = 0
    reload_seconds: float | None = None

    @property
    def job_seconds(self) -> float:
        """The job's time on its server, loads excluded."""
        return max(0.0, self.finished - self.started - self.load_seconds)

    def teach(self, fleet: FleetState, identity: str | None, *, ok: bool) -> None:
        """Tell the fleet state what the result says about its server."""
        if self.address is None:
            return
        fleet.learn(
            self.address,
            identity=identity,
            started=self.started,
            loaded=self.loaded,
            reused=self.reused,
            evicted=self.evicted,
            job_seconds=self.job_seconds if ok else None,
            load_seconds=self.load_seconds,
            conversions=self.conversions,
            reload_seconds=self.reload_seconds,
        )

    def finished_event(
        self, run_id: str, ended: AttemptEnded, identity: str | None, gpu_model: str
    ) -> ev.JobFinished:
        """The attempt's end as its server would have sent it (when that event has
        not come before the result)."""
        return ev.JobFinished(
            at=ended.now,
            run_id=run_id,
            key=ended.key,
            address=self.address or "",
            ok=ended.ok,
            cancelled=ended.cancelled,
            started=self.started,
            finished=self.finished,
            items=self.items,
            load_seconds=self.load_seconds,
            loaded=list(self.loaded),
            context=identity,
            gpu_model=gpu_model,
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
    """An attempt's result arrived (the authoritative end of the attempt)."""

    key: str
    now: float
    ok: bool
    cancelled: bool = False
    message: str | None = None
    aux_logs: tuple[str, ...] = ()
    #: None when the task produced no result (it erred or was cancelled in Dask).
    learned: Learned | None = None
    gpu_model: str = ""


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
)


# -- commands --------------------------------------------------------------------------


@dataclass(frozen=True)
class Submit:
    """Submit attempt ``key`` of a job to server ``address`` (None: Dask chooses)."""

    key: str
    ticket: JobTicket
    address: str | None
    step: PlacementStep


@dataclass(frozen=True)
class Cancel:
    """Drop attempt ``key`` in Dask (its server is gone, or the job was given up)."""

    key: str


@dataclass(frozen=True)
class StopRunning:
    """Stop these attempts where they run (the run is cancelled)."""

    keys: tuple[str, ...]


@dataclass(frozen=True)
class ReportSuccess:
    """Tell Snakemake the job succeeded."""

    ticket: JobTicket


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


@dataclass(frozen=True)
class Record:
    """Send an event to the catalog."""

    event: ev.Event


@dataclass(frozen=True)
class Log:
    """Write a line to Snakemake's log (``level``: debug, info or warning)."""

    level: str
    message: str


@dataclass(frozen=True)
class Poll:
    """Look at attempt ``key``'s Dask future: its event came, its result did not."""

    key: str


@dataclass(frozen=True)
class ProbeCaches:
    """Ask every server's cache probes again (a conversion may have filled a cache)."""


Command = (
    Submit | Cancel | StopRunning | ReportSuccess | ReportError | Record | Log | Poll | ProbeCaches
)
