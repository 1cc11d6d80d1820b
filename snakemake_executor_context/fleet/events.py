"""What happens in the fleet, as plain dataclasses that travel through Dask.

Servers, the scheduler plugin and executors describe every state change as one of
these events. They go to the scheduler with ``log_event`` on :data:`TOPIC` (as lists
of plain dicts, :func:`encode`, since Dask's event channel takes msgpack values
only), reach every subscribed executor, and end up in the catalog through its one
writer. What only the catalog needs (a run's records, a pool's pilots) goes on
:data:`RECORD_TOPIC`, which no executor follows. The in-memory fleet state that
placement reads (:mod:`.state`) is maintained from the same events.

Standard library only: servers and the scheduler import this module.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from enum import Enum, StrEnum
from typing import Any, ClassVar

from .losses import LossCause, classify
from .pilotbook import PilotRecord

__all__ = [
    "RECORD_TOPIC",
    "TOPIC",
    "AttemptsLost",
    "CacheEntryDamaged",
    "CatalogWarning",
    "ContextEvicted",
    "ContextLoadFailed",
    "ContextLoading",
    "ContextReady",
    "ContextShared",
    "ContextTransferred",
    "Event",
    "GangAssembled",
    "GangFormed",
    "JobDispatched",
    "JobFinished",
    "JobOutcome",
    "JobReported",
    "JobStarted",
    "JobStory",
    "LostJob",
    "PilotBooked",
    "RunFinished",
    "RunHeartbeat",
    "RunStarted",
    "ServerDescribed",
    "ServerDraining",
    "ServerJoined",
    "ServerKillInjected",
    "ServerLeft",
    "ServerRestarting",
    "decode",
    "encode",
]

#: The Dask event topic every event of this plugin is logged under.
TOPIC = "snakemake-context"
#: The topic of records only the scheduler's hub takes (its view and the catalog's
#: writer): a run's dispatches, reports and stories, a pool's pilots. No executor
#: subscribes to it, so what a run sends never comes back to it.
RECORD_TOPIC = "snakemake-context-record"

_KINDS: dict[str, type[Event]] = {}


@dataclass(kw_only=True)
class Event:
    """Base of every event: ``at`` is the wall-clock time it happened."""

    kind: ClassVar[str] = "event"
    at: float = field(default_factory=time.time)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _KINDS[cls.kind] = cls

    def to_wire(self) -> dict[str, Any]:
        """A plain dict (msgpack-able), tagged with the event's kind."""
        out: dict[str, Any] = {"kind": self.kind}
        for item in fields(self):
            value = getattr(self, item.name)
            out[item.name] = value.value if isinstance(value, Enum) else value
        return out


# -- runs ----------------------------------------------------------------------------


@dataclass(kw_only=True)
class RunStarted(Event):
    """A Snakemake run started (sent by its executor)."""

    kind: ClassVar[str] = "run-started"
    run_id: str
    workdir: str = ""
    host: str = ""
    pid: int = 0
    cluster: str = ""
    #: Jobs Snakemake plans to run (its DAG's needrun jobs), if known.
    jobs_total: int | None = None
    versions: dict[str, str] = field(default_factory=dict)


@dataclass(kw_only=True)
class RunHeartbeat(Event):
    """A run is still alive (sent every few seconds)."""

    kind: ClassVar[str] = "run-heartbeat"
    run_id: str


@dataclass(kw_only=True)
class RunFinished(Event):
    """A run ended."""

    kind: ClassVar[str] = "run-finished"
    run_id: str
    ok: bool | None = None
    #: Cancelled (Ctrl-C) or told to stop (SIGTERM) before its jobs were done.
    interrupted: bool = False


@dataclass(kw_only=True)
class CatalogWarning(Event):
    """The catalog's writer on the scheduler (the hub's) says something a run's log
    must show: it cannot write, it writes elsewhere, it took over a lease. Recorded
    nowhere: the runs following the fleet log it."""

    kind: ClassVar[str] = "catalog-warning"
    message: str


# -- servers -------------------------------------------------------------------------


@dataclass(kw_only=True)
class ServerJoined(Event):
    """A Dask worker joined (sent by the scheduler plugin)."""

    kind: ClassVar[str] = "server-joined"
    address: str
    name: str = ""
    host: str = ""
    slots: int = 1
    memory_bytes: int = 0
    resources: dict[str, float] = field(default_factory=dict)


@dataclass(kw_only=True)
class ServerDescribed(Event):
    """A context server describes itself: process, memory budget and its GPU record
    as NVML reports it (``None`` on a CPU server)."""

    kind: ClassVar[str] = "server-described"
    address: str
    name: str = ""
    host: str = ""
    pid: int = 0
    memory_bytes: int = 0
    memory_budget: int = 0
    gpu: dict[str, Any] | None = None
    #: When the server retires (a pilot before its walltime); None: never planned.
    retires_at: float | None = None
    #: A pilot's: when its batch job started, as its job script saw it (None: not a
    #: pilot, or not known).
    allocated_at: float | None = None
    #: Where its survival is counted (:func:`.survival.survival_group`): the label its
    #: cluster gave its servers (``--server-group``), a pilot's partition (its batch
    #: queue) and pool (its kind of pilot); '' where none is known.
    group: str = ""
    partition: str = ""
    pool: str = ""


@dataclass(kw_only=True)
class LostJob:
    """A job that was running on a server when it left."""

    key: str
    run_id: str = ""
    started: float | None = None

    def to_wire(self) -> dict[str, Any]:
        """A plain dict."""
        return {"key": self.key, "run_id": self.run_id, "started": self.started}


@dataclass(kw_only=True)
class ServerLeft(Event):
    """A server left the fleet; ``lost`` are the jobs it was running (sent by the
    scheduler plugin)."""

    kind: ClassVar[str] = "server-left"
    address: str
    reason: str = ""
    #: Whether Dask expected it (a clean close or retirement) or lost it.
    expected: bool = False
    lost: list[dict[str, Any]] = field(default_factory=list)
    #: The server's name, and what is known of why it left (:mod:`.losses`): its
    #: process's exit code (negative: the signal) as its nanny saw it, the signal an
    #: injector announced, whether Dask removed it for missing heartbeats, whether
    #: it left after a drain.
    name: str = ""
    exit_code: int | None = None
    injected: int | None = None
    heartbeat: bool = False
    #: Why it drained ('SIGTERM', 'recycled: ...'); empty: it did not. Whether what
    #: made it drain was a crash (see :class:`ServerDraining`).
    drained: str = ""
    drained_crash: bool = False
    #: The attempts its process ran when it died, by its own record (None: unknown).
    running: list[str] | None = None
    restarted: str = ""  # why the plugin itself restarted it ('': it did not)

    def lost_jobs(self) -> list[LostJob]:
        """``lost`` as :class:`LostJob` records."""
        return [LostJob(**item) for item in self.lost]

    def cause(self) -> LossCause:
        """The loss, classified (preemption, crash or closed)."""
        known = (
            "expected",
            "exit_code",
            "injected",
            "heartbeat",
            "drained",
            "drained_crash",
            "restarted",
        )
        return classify(**{name: getattr(self, name) for name in known})


@dataclass(kw_only=True)
class AttemptsLost(Event):
    """Attempts of a run that a server's :class:`ServerLeft` did not list as lost
    (the hub saw no start, the dead process's record missed them), told by the run's
    dispatch machine, which knows what it placed there: the catalog records them lost
    with that server's loss."""

    kind: ClassVar[str] = "attempts-lost"
    run_id: str
    address: str
    reason: str = ""
    lost: list[dict[str, Any]] = field(default_factory=list)

    def lost_jobs(self) -> list[LostJob]:
        """``lost`` as :class:`LostJob` records."""
        return [LostJob(**item) for item in self.lost]


@dataclass(kw_only=True)
class ServerDraining(Event):
    """A server got SIGTERM (a preemption notice): it takes no new job, finishes
    ``finishing`` if they fit its grace period, hands ``handed_back`` back, and
    exits."""

    kind: ClassVar[str] = "server-draining"
    address: str
    name: str = ""
    #: Why: 'SIGTERM', or 'recycled: CUDA-fatal error ...' (:mod:`..server.policy`).
    why: str = "SIGTERM"
    #: Whether what made it leave was a crash (a rank of a gang that died by itself,
    #: or of a SIGKILL nobody announced): its jobs' crash budgets pay, not their
    #: preemption budgets.
    crashed: bool = False
    grace: float = 0.0
    finishing: list[str] = field(default_factory=list)
    handed_back: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class ServerKillInjected(Event):
    """A preemption injector is about to send ``signal`` to a server's process
    (sent before the kill, so the loss is classified as injected)."""

    kind: ClassVar[str] = "server-kill-injected"
    address: str
    name: str = ""
    pid: int = 0
    signal: int = 9


@dataclass(kw_only=True)
class ServerRestarting(Event):
    """The plugin is about to restart a server (``why``), announced so that its end is
    recorded as that restart, not as a crash or a loss."""

    kind: ClassVar[str] = "server-restarting"
    address: str
    name: str = ""
    why: str = ""


# -- contexts ------------------------------------------------------------------------


@dataclass(kw_only=True)
class ContextLoading(Event):
    """A server started to load a context."""

    kind: ClassVar[str] = "context-loading"
    address: str
    identity: str
    name: str = ""
    loader: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    #: The loader's cache probe: were the weights on local disk (None: no probe)?
    from_cache: bool | None = None


@dataclass(kw_only=True)
class ContextReady(Event):
    """A server finished loading a context."""

    kind: ClassVar[str] = "context-ready"
    address: str
    identity: str
    load_seconds: float = 0.0
    bytes: int = 0
    gpu_model: str = ""
    #: Conversions the load did (weights converted into a local cache), and how long
    #: the load took after the last one: a load from the converted cache.
    conversions: int = 0
    reload_seconds: float | None = None
    #: Seconds of the load spent fetching the context's template from peers (None: it
    #: fetched nothing; the rest of the load read the local cache it filled).
    peer_seconds: float | None = None
    #: The loader's cache probe before the load (None: no probe).
    from_cache: bool | None = None


@dataclass(kw_only=True)
class GangAssembled(Event):
    """Servers on several nodes became one server (pilots started as a gang,
    ``--context-pilots nodes=n``): the ``leader`` runs the jobs and offers every
    member's GPUs; the ``members`` run nothing themselves, only their share of the
    ranks of the leader's gangs. Sent by the hub; it holds until one of them leaves
    (they all leave then, and start again as new servers)."""

    kind: ClassVar[str] = "gang-assembled"
    leader: str
    #: The other servers, and for the leader and each member (in that order) its
    #: node and its devices.
    members: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    devices: list[int] = field(default_factory=list)


@dataclass(kw_only=True)
class GangFormed(Event):
    """A context that spans several processes (a gang: one rank per device, in one
    ``torch.distributed`` group) finished loading on a server: its members. It is
    whole until its ContextEvicted, or its server's ServerLeft (a rank that dies
    takes its server's contexts with it)."""

    kind: ClassVar[str] = "gang-formed"
    address: str
    identity: str
    name: str = ""
    backend: str = ""
    #: One entry per rank, in rank order.
    devices: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    rank_bytes: list[int] = field(default_factory=list)


@dataclass(kw_only=True)
class ContextTransferred(Event):
    """A server fetched (or tried to fetch) a context's template, its files, from a
    peer that holds it (peer-to-peer transfer, :mod:`..server.peers.receiver`)."""

    kind: ClassVar[str] = "context-transferred"
    #: The receiver.
    address: str
    identity: str
    #: The holder it read from ("" when none could serve it).
    peer: str = ""
    bytes: int = 0
    seconds: float = 0.0
    #: "ok", or one line: why this holder's transfer ended early (the receiver goes on
    #: from another holder, or from the source).
    outcome: str = "ok"


@dataclass(kw_only=True)
class CacheEntryDamaged(Event):
    """A server found an entry of its node's model cache damaged (its files differ
    from the manifest recorded when they were written, :mod:`..modelcache.cachecheck`) and moved
    it aside: the load that needed it went to a peer or the source."""

    kind: ClassVar[str] = "cache-entry-damaged"
    address: str
    #: The context whose load found it ("" when a peer's report did: a holder's).
    identity: str = ""
    entry: str = ""
    #: Where it went ("" when another process of the node had moved it).
    aside: str = ""
    #: One line: which file differs, and how.
    problem: str = ""


@dataclass(kw_only=True)
class ContextShared(Event):
    """A server runs up to ``jobs`` jobs of a context at once (slots; what its memory
    holds once a job's working memory is declared or measured)."""

    kind: ClassVar[str] = "context-shared"
    address: str
    identity: str
    jobs: int = 1


@dataclass(kw_only=True)
class ContextEvicted(Event):
    """A server evicted a context (memory budget)."""

    kind: ClassVar[str] = "context-evicted"
    address: str
    identity: str


@dataclass(kw_only=True)
class ContextLoadFailed(Event):
    """A server's load of a context raised."""

    kind: ClassVar[str] = "context-load-failed"
    address: str
    identity: str
    error: str = ""


# -- jobs ----------------------------------------------------------------------------


@dataclass(kw_only=True)
class JobDispatched(Event):
    """An executor handed a job to Dask (``target``: the server placement chose)."""

    kind: ClassVar[str] = "job-dispatched"
    run_id: str
    key: str
    #: Snakemake's job id (a number, or a UUID for a group job).
    jobid: str = ""
    attempt: int = 1
    rule: str = ""
    wildcards: dict[str, str] = field(default_factory=dict)
    job_kind: str = "context"
    context: str | None = None
    context_name: str | None = None
    target: str | None = None
    #: When Snakemake handed the job to the executor.
    submitted: float | None = None
    reason: str = ""
    #: The attempt's log, relative to the workflow directory.
    log: str = ""
    #: The dispatch machine's stimulus that placed it (its story).
    stimulus: str = ""
    #: The job's output files (a group's: its jobs'), as Snakemake names them, relative
    #: to the run's workdir unless absolute: ``snakemake-context story PATH`` finds
    #: the job by one.
    outputs: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class JobStarted(Event):
    """A server started a job."""

    kind: ClassVar[str] = "job-started"
    run_id: str = ""
    key: str
    address: str
    context: str | None = None


@dataclass(kw_only=True)
class JobFinished(Event):
    """A server finished a job (its own view: ok, times, items, loads)."""

    kind: ClassVar[str] = "job-finished"
    run_id: str = ""
    key: str
    address: str
    ok: bool = True
    cancelled: bool = False
    #: As :attr:`.outcome.Outcome.fault`: why a failure was its server's.
    fault: str = ""
    started: float = 0.0
    finished: float = 0.0
    items: int = 0
    load_seconds: float = 0.0
    loaded: list[str] = field(default_factory=list)
    context: str | None = None
    gpu_model: str = ""
    #: Calls of batched functions (forward batches) the job led, by size ("8": 12).
    batches: dict[str, int] = field(default_factory=dict)


class JobOutcome(StrEnum):
    """How a job ended, as its executor reported it to Snakemake (stored as is)."""

    OK = "ok"
    FAILED = "failed"
    #: Stopped on request (Ctrl-C): not a failure.
    CANCELLED = "cancelled"
    #: No server of the fleet could run it.
    UNRUNNABLE = "unrunnable"
    #: It could not be turned into a task (an undeclared context, a bad resource).
    INVALID = "invalid"


@dataclass(kw_only=True)
class JobReported(Event):
    """An executor reported a job's outcome to Snakemake."""

    kind: ClassVar[str] = "job-reported"
    run_id: str
    key: str
    jobid: str = ""
    rule: str = ""
    #: A :class:`JobOutcome` value.
    outcome: str = JobOutcome.OK
    message: str | None = None
    #: The dispatch machine's stimulus that reported it (its story).
    stimulus: str = ""
    #: As :attr:`JobDispatched.outputs` (a job reported unrunnable was never dispatched).
    outputs: list[str] = field(default_factory=list)
    #: How many of the jobs Snakemake planned it counts for in its run's totals: a
    #: group's, all of them (its members' own reports count none).
    jobs: int = 1


@dataclass(kw_only=True)
class JobStory(Event):
    """A decision of an executor about a job that neither its dispatch nor its report
    records: a loss and the budget it was charged to, a requeue, a result fenced off,
    a cancellation, a wait for a server (``snakemake-context story`` reads them)."""

    kind: ClassVar[str] = "job-story"
    run_id: str
    #: The attempt the decision is about (or the job's key, before any attempt).
    key: str
    jobid: str = ""
    rule: str = ""
    what: str
    detail: str = ""
    stimulus: str = ""


# -- pools ---------------------------------------------------------------------------


@dataclass(kw_only=True)
class PilotBooked(Event, PilotRecord):
    """A pool's record of one pilot changed (sent by the pool, in the cluster process):
    the fields of :class:`~.pilotbook.PilotRecord`, as they are now."""

    kind: ClassVar[str] = "pilot-booked"

    @classmethod
    def of(cls, record: PilotRecord) -> PilotBooked:
        """The event for ``record`` as it is now."""
        return cls(**record.to_wire())


# -- wire ----------------------------------------------------------------------------


def encode(events: Iterable[Event]) -> list[dict[str, Any]]:
    """Events as a list of plain dicts, for ``log_event``."""
    return [event.to_wire() for event in events]


def decode(message: Any) -> Iterator[Event]:
    """The events of one ``log_event`` message (a dict or a list of dicts).

    Unknown kinds and malformed items are skipped: a newer server may send more.
    """
    items = message if isinstance(message, (list, tuple)) else [message]
    for item in items:
        if not isinstance(item, dict):
            continue
        cls = _KINDS.get(str(item.get("kind")))
        if cls is None:
            continue
        names = {f.name for f in fields(cls)}
        try:
            yield cls(**{k: v for k, v in item.items() if k in names})
        except TypeError:
            continue
