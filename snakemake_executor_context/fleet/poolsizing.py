"""How many pilots a pool should hold: pure policy over the run's demand.

Dask's own adaptive scaling counts tasks in the scheduler; with affinity placement the
executor holds most jobs back until a server is free, so the scheduler sees almost none.
The pool is sized instead from what the run still has to do per kind of pilot (the
demand the executor publishes), and a pilot is added only while the work it would get
outweighs the context load it must pay first.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .gpus import GpuInfo
from .pilotbook import PilotRecord
from .resources import server_resources
from .survival import LIKELY, UNMEASURED_SPAN, SurvivalBook

__all__ = [
    "WITHDRAWN",
    "DemandWatch",
    "PoolDemand",
    "PoolShape",
    "growth_limit",
    "kind_resources",
    "kind_survival",
    "next_kind",
    "pilot_lifetime",
    "pilots_to_release",
    "pilots_wanted",
    "useful_pilots",
]


@dataclass(frozen=True)
class PoolDemand:
    """The work a run still has for the pool's pilots: what the executor publishes in
    the scheduler's metadata (:meth:`to_wire`) and a pool reads (:meth:`from_wire`)."""

    #: Jobs that could start now if a server were free.
    ready: int = 0
    #: Jobs still to come (ready ones included).
    remaining: int = 0
    #: Mean seconds per job where measured (0: unknown).
    job_seconds: float = 0.0
    #: Seconds a new pilot spends loading its context before its first job (0: unknown).
    load_seconds: float = 0.0
    #: Queued jobs per GPU model they ask for (only jobs that name one).
    by_gpu_model: Mapping[str, int] = field(default_factory=dict)
    #: The publication's number: it grows with each of a living run's checks
    #: (:class:`DemandWatch`); None where nobody numbered it.
    sequence: int | None = None
    #: Whether the run weighs servers' survival (``--context-tuning survival_placement``):
    #: then the pool prefers the kinds of pilot that live longer (:func:`kind_survival`).
    survival: bool = False

    def to_wire(self) -> dict[str, Any]:
        """This demand as the scheduler's metadata holds it (msgpack-able)."""
        wire: dict[str, Any] = {
            "ready": self.ready,
            "remaining": self.remaining,
            "job_seconds": self.job_seconds,
            "load_seconds": self.load_seconds,
            "by_gpu_model": dict(self.by_gpu_model),
        }
        if self.sequence is not None:
            wire["sequence"] = self.sequence
        if self.survival:
            wire["survival"] = True
        return wire

    @classmethod
    def from_wire(cls, wire: object) -> PoolDemand | None:
        """A published demand (:meth:`to_wire`); None for none, or for a run's
        withdrawal (:data:`WITHDRAWN`). A field of the wrong type raises ValueError
        or TypeError: the publisher is this plugin, so that is a version mismatch."""
        if not isinstance(wire, Mapping) or not wire:
            return None
        sequence = wire.get("sequence")
        by_model = dict(wire.get("by_gpu_model") or {})
        return cls(
            ready=int(wire.get("ready", 0)),
            remaining=int(wire.get("remaining", 0)),
            job_seconds=float(wire.get("job_seconds", 0.0)),
            load_seconds=float(wire.get("load_seconds", 0.0)),
            by_gpu_model={str(model): int(count) for model, count in by_model.items()},
            sequence=None if sequence is None else int(sequence),
            survival=bool(wire.get("survival", False)),
        )


#: What a run publishes when it asks nothing more of a pool (at its end).
WITHDRAWN: Mapping[str, Any] = MappingProxyType({})


@dataclass
class DemandWatch:
    """Whether a run's published demand is still its own: the executor numbers each
    publication, and a number that stopped growing for ``stale_after`` seconds means
    the run is gone without withdrawing its demand (a killed Snakemake); a pool that
    kept acting on it would hold, and replace, pilots for work nobody asks for."""

    stale_after: float
    #: The last sequence number seen, and when it was first seen (the pool's clock).
    sequence: int | None = None
    since: float = 0.0

    def current(self, published: PoolDemand | None, now: float) -> PoolDemand | None:
        """``published``, or None where its sequence number is stale. A demand without
        a number is returned as it is."""
        if published is None or published.sequence is None:
            return published
        if published.sequence != self.sequence:
            self.sequence, self.since = published.sequence, now
        elif now - self.since > self.stale_after:
            return None
        return published


@dataclass(frozen=True)
class PoolShape:
    """The bounds of a pool."""

    minimum: int = 0
    maximum: int = 1
    #: Jobs one pilot runs at once.
    slots: int = 1


def pilots_wanted(demand: PoolDemand, shape: PoolShape) -> int:
    """The number of pilots (running or pending) the pool should hold.

    Enough pilots for the jobs that are ready, but no more than the remaining work pays
    for: with both times measured, a further pilot must get at least one load's worth of
    jobs. Always within the shape's bounds.
    """
    slots = max(1, shape.slots)
    want = math.ceil(max(0, demand.ready) / slots)
    if demand.remaining > 0 and demand.job_seconds > 0 and demand.load_seconds > 0:
        work = demand.remaining * demand.job_seconds / slots
        worth = max(1, math.floor(work / demand.load_seconds))
        want = min(want, worth)
    return max(shape.minimum, min(shape.maximum, want))


def growth_limit(useful: int, pending: int, shape: PoolShape) -> int:
    """How large the pool may grow now: one pilot beyond those proving useful (busy,
    or new enough to get a first job) and those still in the batch queue.

    Ready jobs alone overstate what more pilots can take when something else bounds
    the run (Snakemake's own per-job cost, placement keeping a context on warm servers
    because a load would not pay): pilots that got no work for an idle timeout stop
    the growth, and are released, instead of being kept because jobs are ready.
    """
    return max(shape.minimum, min(shape.maximum, useful + pending + 1))


def useful_pilots(
    records: Iterable[PilotRecord],
    idle_since: Mapping[str, float],
    now: float,
    idle_timeout: float,
) -> int:
    """Pilots that are proving useful at ``now``: running, and busy within the idle
    timeout (not idle since, or idle for less), or registered so recently that they
    may still get their first job. ``idle_since``: since when each idle pilot (by
    name) has had no job."""
    useful = 0
    for record in records:
        if record.registered is None or record.ended is not None:
            continue
        since = idle_since.get(record.name)
        recent = now - record.registered < idle_timeout
        if recent or since is None or now - since < idle_timeout:
            useful += 1
    return useful


def pilots_to_release(
    idle_since: Mapping[str, float], now: float, idle_timeout: float, count: int, minimum: int
) -> list[str]:
    """Pilots idle longer than ``idle_timeout``, longest idle first, keeping ``minimum``."""
    if idle_timeout <= 0:
        return []
    idle = sorted(
        (since, name) for name, since in idle_since.items() if now - since >= idle_timeout
    )
    spare = max(0, count - minimum)
    return [name for _, name in idle[:spare]]


def next_kind(
    ready_per_kind: Sequence[int],
    held_per_kind: Sequence[int],
    survival: Sequence[float] | None = None,
) -> int:
    """The kind of pilot to add: the most ready jobs per pilot already held of that kind
    (jobs that need that GPU type); then, given ``survival`` (per kind, the chance a new
    pilot of it lives through a load and its work: :meth:`.survival.SurvivalBook.new_server`;
    kinds at least :data:`.survival.LIKELY` alike), the longer-lived; then the kind held
    least."""

    def score(index: int) -> tuple[float, float, int, int]:
        ready, held = ready_per_kind[index], held_per_kind[index]
        lives = min(LIKELY, survival[index]) if survival is not None else 1.0
        return (ready / (held + 1), lives, -held, -index)

    return max(range(len(held_per_kind)), key=score)


def kind_survival(
    demand: PoolDemand | None,
    book: SurvivalBook,
    kinds: Sequence[tuple[str, str]],
    now: float,
) -> list[float] | None:
    """Per kind of pilot (its survival group and GPU model), the chance a new pilot of
    it lives through a load and a job (the demand's measured times, else
    :data:`.survival.UNMEASURED_SPAN`), for :func:`next_kind`; None where the run does
    not weigh survival."""
    if demand is None or not demand.survival:
        return None
    span = (demand.load_seconds + demand.job_seconds) or UNMEASURED_SPAN
    return [book.new_server(group, gpu_model, span, now=now) for group, gpu_model in kinds]


def kind_resources(gpu_type: str | None, gpus: int, memory_bytes: int) -> dict[str, float]:
    """What a pilot of a kind will advertise, before any has started: its GPUs under
    its type's name (without a type, GPUs of a model not known until NVML reads it)."""
    if gpu_type:
        named = [
            GpuInfo(index=i, uuid=f"{gpu_type}-{i}", name=gpu_type, memory_bytes=0)
            for i in range(gpus)
        ]
        return server_resources(memory_bytes, named)
    return server_resources(memory_bytes, stand_in_gpus=gpus)


#: A pilot lives at least this long, whatever its walltime leaves after the margins:
#: long enough to register and take a job.
SHORTEST_LIFETIME = 20.0


def pilot_lifetime(walltime_seconds: float, retire_margin: float, stagger: float) -> float:
    """Seconds after its start at which a pilot retires (Dask's ``--lifetime``, which
    then moves it by up to ``stagger`` either way): its walltime less the margin and the
    stagger, so that even the latest retirement ends before the batch system kills it."""
    return max(SHORTEST_LIFETIME, walltime_seconds - retire_margin - stagger)
