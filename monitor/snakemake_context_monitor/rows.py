"""What the views show, as plain rows (derived from the catalog by :mod:`.derive`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from snakemake_executor_context.catalog.reading.lives import LifeLeft
from snakemake_executor_context.catalog.reading.status import FleetRow, RunRow

__all__ = [
    "EndedFleet",
    "LossTotals",
    "PlacementRow",
    "Progress",
    "Series",
    "ServerRow",
    "TimelineRow",
]


@dataclass(frozen=True)
class ServerRow:
    """One server, live (``left`` None) or ended, with what it holds (held when it
    left) and has done."""

    address: str
    name: str
    host: str
    gpu_model: str
    gpu_name: str | None
    gpu_memory_bytes: int | None
    compute_capability: str | None
    slots: int
    busy: int
    contexts: list[str]
    jobs_ok: int
    jobs_failed: int
    items: int
    joined: float
    #: Seconds its finished jobs ran (loads included), and when the last one ended.
    busy_seconds: float = 0.0
    last_end: float | None = None
    #: Its expected remaining life (None: not estimated, or it has ended).
    life: LifeLeft | None = None
    #: When it left (None: live), and whether it was lost (jobs running on it).
    left: float | None = None
    lost: bool = False

    def idle_seconds(self, now: float) -> float:
        """Seconds since it joined that no finished job ran (running ones aside)."""
        return max(0.0, now - self.joined - self.busy_seconds)


@dataclass(frozen=True)
class EndedFleet:
    """The last run's servers, all ended: what the fleet view shows when no run and no
    server is live. ``models`` groups them by GPU model as the live fleet's rows do."""

    models: list[FleetRow]
    servers: list[ServerRow]


@dataclass(frozen=True)
class PlacementRow:
    """A context on a live server: its latest state, and what it was used for there."""

    context: str
    identity: str
    server: str
    address: str
    gpu_model: str
    state: str
    load_seconds: float | None
    from_cache: bool | None
    loads: int
    evictions: int
    jobs_warm: int
    #: How its latest load got the context (a load kind; "": not loaded yet).
    kind: str = ""
    #: Processes it spans there (a gang: one rank per device); 1: the server's own.
    ranks: int = 1


@dataclass(frozen=True)
class TimelineRow:
    """A server joining, leaving, or lost (with what its loss cost)."""

    at: float
    kind: str  # joined, left, lost
    server: str
    address: str
    gpu_model: str
    reason: str = ""
    jobs_lost: int = 0
    seconds_lost: float = 0.0
    jobs: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class LossTotals:
    """Every loss in the catalog, summed."""

    servers_lost: int
    jobs_sent_back: int
    seconds_lost: float
    servers_joined: int
    servers_left: int


@dataclass(frozen=True)
class Series:
    """Jobs and items finished per time bucket, for one GPU model (or all)."""

    gpu_model: str
    start: float
    bucket_seconds: float
    jobs: list[int]
    items: list[int]

    @property
    def jobs_per_minute(self) -> list[float]:
        """Jobs per minute in each bucket."""
        return [n * 60.0 / self.bucket_seconds for n in self.jobs]


@dataclass(frozen=True)
class Progress:
    """How far the current run is, and when it may end."""

    run: RunRow
    done: int
    failed: int
    total: int | None
    jobs_per_minute: float | None
    eta_seconds: float | None
