"""What a simulation is told: the times of jobs and loads, the fleet, its pilots and
its preemptions. Plain data; the simulator (:mod:`.engine`) reads it, the catalog
(:mod:`.measured`) and the command line (:mod:`.simcommand`) fill it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..defaults import DRAIN_GRACE_SECONDS
from ..fleet.loads import LoadKind
from ..fleet.losses import Budgets
from .hazard import Hazard
from .simdefaults import (
    LIFETIME_STAGGER,
    LOADS_PER_SOURCE,
    MAX_PILOTS,
    MIN_PILOTS,
    PEER_TRANSFERS,
    PILOT_IDLE_TIMEOUT,
    PILOT_WALLTIME,
    RETIRE_MARGIN,
    SLOTS,
)

__all__ = [
    "ANY_MODEL",
    "ContextModel",
    "Fleet",
    "JobTimes",
    "Options",
    "PoolSpec",
    "Preemption",
    "ServerKind",
    "Storage",
]

#: The GPU model of a time that holds on every model (scaled by a model's slowdown).
ANY_MODEL = "*"


@dataclass
class ContextModel:
    """One context: its size, and what each kind of load costs beyond moving bytes
    (state creation on the GPU, imports; for a conversion, the conversion too). A
    load from the source reads the bytes (at the shared filesystem's bandwidth, in a
    turn where the pool limits them), then spends these seconds outside the turn."""

    name: str
    identity: str
    nbytes: int = 0
    load: dict[LoadKind, float] = field(default_factory=dict)
    #: Its first load on a node converts (a GGUF dequantised into the local cache).
    converts: bool = False
    #: A load leaves the weights on local disk: later loads there are from the cache.
    caches: bool = True
    #: False: one job at a time holds the whole server.
    shareable: bool = True
    #: Working memory per job (0: not declared; a server then runs one job of it at a
    #: time until one is measured, as the real slot gate does).
    job_bytes: int = 0

    def fixed(self, kind: LoadKind) -> float | None:
        """Seconds of a load of this kind beyond moving bytes (None: not known). A
        load from a peer without a time of its own costs what a cached load costs."""
        if kind in self.load:
            return self.load[kind]
        if kind == LoadKind.PEER:
            return self.load.get(LoadKind.CACHE)
        if kind == LoadKind.SOURCE and not self.converts:
            return self.load.get(LoadKind.CONVERSION)
        return None


@dataclass
class Storage:
    """Where weights come from, in bytes per second (0: the move is not modelled,
    the load's measured seconds include it; a read from the source not modelled takes
    no time, so a turn at the source is held for none)."""

    #: The shared filesystem: every read from the source at the same moment shares it.
    shared_bandwidth: float = 0.0
    local_bandwidth: float = 0.0
    peer_bandwidth: float = 0.0
    #: Whether a server fetches a context's template a peer holds from that peer
    #: (the paper's peer-to-peer transfer, as the plugin's servers do:
    #: ``server/peers/receiver.py``), and how many transfers each holder serves at once
    #: (the plugin's default, :mod:`.simdefaults`).
    peer: bool = False
    peer_transfers: int = PEER_TRANSFERS


@dataclass
class JobTimes:
    """Seconds a job takes on its server, from its rule, GPU model and items."""

    #: (rule, GPU model or ``*``) -> seconds per item.
    item: dict[tuple[str, str], float] = field(default_factory=dict)
    #: rule -> seconds per job beyond its items.
    fixed: dict[str, float] = field(default_factory=dict)
    #: GPU model -> its time over the ``*`` time (2.0: twice as slow).
    slowdown: dict[str, float] = field(default_factory=dict)
    #: Jobs running at once on one server -> their throughput over one job alone
    #: (slots sharing forward passes through the batcher); 1 where absent.
    slot_gain: dict[int, float] = field(default_factory=dict)
    #: Coefficient of variation of a job's time (lognormal; 0: every job as given).
    cv: float = 0.0
    #: Local rules (and plain jobs run locally) -> seconds.
    local: dict[str, float] = field(default_factory=dict)

    def per_item(self, rule: str, model: str) -> float | None:
        """Seconds per item of a rule on a GPU model: its own, else the ``*`` time
        times the model's slowdown; None: not known (a time measured on one model is
        never taken for another's)."""
        own = self.item.get((rule, model))
        if own is not None:
            return own
        anywhere = self.item.get((rule, ANY_MODEL))
        if anywhere is not None:
            return anywhere * self.slowdown.get(model, 1.0)
        return None

    def seconds(self, rule: str, model: str, items: int) -> float | None:
        """A job's seconds alone on its server, loads excluded."""
        per = self.per_item(rule, model)
        if per is None:
            return None
        return self.fixed.get(rule, 0.0) + per * max(1, items)

    def gain(self, running: int) -> float:
        """Throughput of ``running`` jobs at once over one alone."""
        if running <= 1:
            return 1.0
        known = [k for k in self.slot_gain if k <= running]
        return self.slot_gain[max(known)] if known else 1.0


@dataclass
class ServerKind:
    """Servers of one GPU model (a fixed fleet's, or a kind of pilot)."""

    gpu_model: str
    count: int
    slots: int = SLOTS
    #: The memory the server may fill with contexts (bytes; 0: no limit).
    budget: int = 0
    #: Where preemptions are counted ('' : the GPU model).
    partition: str = ""

    @property
    def where(self) -> str:
        """Its partition's name."""
        return self.partition or self.gpu_model


@dataclass
class PoolSpec:
    """A pool of pilots sized by the run's demand (the real pool's policy)."""

    minimum: int = MIN_PILOTS
    maximum: int = MAX_PILOTS
    #: Mean seconds a pilot waits in the batch queue, and how the wait is drawn
    #: ("fixed", or "exp": exponential, memoryless).
    queue_wait: float = 0.0
    queue_draw: str = "exp"
    #: Seconds from a pilot's start to its server's registration (charged, "allocated_before").
    startup: float = 3.0
    #: The plugin's defaults (:mod:`.simdefaults`): a pilot retires ``retire_margin``
    #: before its walltime, up to ``stagger`` earlier at random.
    walltime: float = PILOT_WALLTIME
    retire_margin: float = RETIRE_MARGIN
    stagger: float = LIFETIME_STAGGER
    idle_timeout: float = PILOT_IDLE_TIMEOUT
    #: Servers reading one context from its source at once (0: no limit): a turn
    #: covers the read of its bytes alone (the plugin's default, :mod:`.simdefaults`).
    loads_per_source: int = LOADS_PER_SOURCE
    #: Seconds between two of the pool's decisions (Dask's Adaptive: 1 s).
    interval: float = 1.0
    #: Pilots registered when the run starts (a persistent pool's kept pilots).
    ready: int = 0


@dataclass
class Fleet:
    """The servers: a fixed fleet (``kinds`` with their counts), or a pool of
    pilots of those kinds (each kind's count: how many of them the cluster can give)."""

    kinds: list[ServerKind]
    pool: PoolSpec | None = None
    #: Seconds from the run's start to the fixed fleet's servers joining.
    join_at: float = 1.0
    #: Seconds a killed server of a fixed fleet takes to come back (its nanny
    #: restarts it); None: it does not.
    restart: float | None = 1.0
    #: The fixed fleet's servers share one host's disk (the embedded cluster): what
    #: one converts into the local cache, the others load from it.
    one_host: bool = False
    #: Servers joining at given times, by name, instead of the kinds' counts at
    #: ``join_at`` (a replay: each server when it joined).
    schedule: list[tuple[float, ServerKind, str]] = field(default_factory=list)
    #: Context identities every server's local disk holds from the start (weights
    #: staged, or converted by an earlier run on the same disk).
    cached: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        """Servers of the fixed fleet (or the pool's most)."""
        total = sum(kind.count for kind in self.kinds)
        return min(total, self.pool.maximum) if self.pool else total


@dataclass
class Preemption:
    """Servers taken away: at a rate per partition (``*``: the whole fleet), by a
    trace of (seconds from the start, server name or partition), or at the end of
    each server's life, drawn from its partition's hazard (:mod:`.hazard`) when it
    joins (``*``: the partitions not named)."""

    rates: dict[str, float] = field(default_factory=dict)
    trace: list[tuple[float, str]] = field(default_factory=list)
    lifetimes: dict[str, Hazard] = field(default_factory=dict)
    #: KILL: the server dies with its jobs; TERM: it drains for ``grace`` seconds.
    signal: str = "KILL"
    grace: float = DRAIN_GRACE_SECONDS

    @property
    def any(self) -> bool:
        """Whether anything is preempted."""
        rated = any(rate > 0 for rate in self.rates.values())
        return bool(self.trace) or bool(self.lifetimes) or rated


@dataclass
class Options:
    """How the run goes: Snakemake's settings, the executor's, and this machine's
    latencies (defaults measured here, see docs/simulator.md)."""

    #: Snakemake's --jobs (0: twice the fleet's slots).
    jobs: int = 0
    #: full: contexts stay loaded; partial: each job loads, from the local cache
    #: after the first; agnostic: each job loads from the source.
    mode: str = "full"
    seed: int = 1
    #: Seconds of Snakemake's own process per job it hands over and hears back of
    #: (its scheduler's selection, the job's submission and its report).
    snakemake_job_seconds: float = 0.036
    #: Snakemake's --max-jobs-per-timespan (jobs per second).
    jobs_per_second: float = 100.0
    #: Dask's round trip: a submission to its server, a result back.
    dask_latency: float = 0.012
    #: A server's event through the scheduler to the executor.
    event_latency: float = 0.01
    #: Cores for local rules and plain jobs run in Snakemake's process.
    local_cores: int = 2
    budgets: Budgets = field(default_factory=Budgets)
    #: Seconds from the run's start to Snakemake's first job (the DAG, the cluster).
    start_seconds: float = 0.0
    #: Seconds from the last job's end to the run's end (reports, shutdown).
    end_seconds: float = 0.0
    #: Stop simulating after this many simulated seconds.
    limit: float = 30 * 86400.0
    #: Keep the event log (the determinism test compares it).
    log: bool = True
    #: Placement and the pool weigh how long servers are likely to live
    #: (``--context-tuning survival_placement``: :mod:`..fleet.survival`).
    survival: bool = False
