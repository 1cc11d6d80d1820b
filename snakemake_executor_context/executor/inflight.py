"""What the dispatch machine (:mod:`.dispatch`) holds of a run: its queued jobs and
their attempts in flight. Plain data."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..fleet.index import wanted_key
from ..fleet.losses import LossHistory
from ..fleet.placement import PlacementStep
from .vocabulary import JobTicket

__all__ = ["Attempt", "QueuedJob"]


@dataclass
class QueuedJob:
    """A job the machine holds, from the moment it is ready to its report."""

    ticket: JobTicket
    #: Its place in the order jobs arrived (placement goes by priority, then this).
    seq: int
    dispatches: int = 0
    #: Its attempt in flight, if any.
    attempt: str | None = None
    #: Since when no server of the fleet can run it (None: one can).
    waiting_since: float | None = None
    cancelled: bool = False
    #: The losses charged to its budgets so far.
    losses: LossHistory = field(default_factory=LossHistory)
    #: A job lost with a server not confirmed dead waits for that server's lease.
    not_before: float = 0.0
    #: Its wanted resources, hashable (the fleet's candidates are kept by them).
    wanted: frozenset[tuple[str, float]] = field(init=False)

    def __post_init__(self) -> None:
        self.wanted = wanted_key(self.ticket.wanted)

    @property
    def order(self) -> tuple[int, int]:
        """Its place in the queue: by Snakemake's priority, then arrival."""
        return (-self.ticket.priority, self.seq)


@dataclass
class Attempt:
    """One dispatch of a job to a server (its own Dask key)."""

    key: str
    job: QueuedJob
    address: str | None
    step: PlacementStep
    #: Whether it holds its server's slot (freed once: by its end event or result).
    holds_slot: bool = True
    #: When its server's JobFinished came (its result is polled for after a while),
    #: and whether it said the job succeeded: if the server dies holding the result,
    #: that event is the job's end (its outputs were written and checked).
    event_seen: float | None = None
    event_ok: bool = False
    #: Submitted to one server (False: Dask chose).
    pinned: bool = True
