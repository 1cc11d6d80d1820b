"""What the dispatch machine (:mod:`.machine`) holds of a run: its queued jobs and
their attempts in flight, the work still to come per context, and placement's
refusals for the rest of one pass over the queue.

**The work still to come** (:class:`Demand`) is the run's, not the executor's:
Snakemake hands a remote executor at most ``--jobs`` jobs at a time, so the jobs it
holds say little about how much work a context has left. At the start of a run the
DAG's jobs that will reach the executor are counted per context (:meth:`Demand.plan`);
then a job is added when it becomes ready (a retry, a job a checkpoint added) and
removed when it ends. Jobs whose context is not known before they run (a ``context``
resource given by a function that needs more than the job's wildcards, such as its
input files) count as unknown: no load happens on their behalf, and a context that only
such jobs use is weighed as before this existed (the jobs the executor holds, and for
a load only the jobs queued ahead of the one placed). The same holds without a DAG
(the attribute is not part of Snakemake's plugin interface).

**Refusals** (:class:`Refusals`): in one pass of the machine over its queue, the
fleet's state changes only when a job is placed, and placement
(:func:`..fleet.placement.choose_server`) is a pure function of that state, of the
pass's demand and time, and of what the job asks: its wanted resources, its context
and the work still to come for it. A queued job that asks what an earlier one of the
pass was refused is refused the same, until a job is placed: then every refusal is
forgotten. Queued jobs of one context get one answer a pass instead of one each. A
refusal for want of a free slot or of a server with the resources is decided before
the work to come is weighed, so it holds for every job of that context and resources
(a context the run's DAG did not name weighs each of its jobs with a different count:
the jobs queued ahead of it).

Plain data and small bookkeeping; no clock, no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..fleet.index import wanted_key
from ..fleet.losses import LossHistory
from ..fleet.placement import Decision, PlacementStep
from .vocabulary import JobTicket

__all__ = ["WHATEVER_REMAINS", "Attempt", "Demand", "QueuedJob", "Refusals"]


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


class Demand:
    """Jobs still to come, per context identity."""

    def __init__(self) -> None:
        self._remaining: dict[str, set[str]] = {}
        #: The identities the run's DAG named before any job ran.
        self._planned: set[str] = set()
        #: Jobs of the plan whose context is not known before they run.
        self.unknown = 0
        #: Whether a job became ready whose context the DAG did not name (the work to
        #: come for it is then counted from the jobs held, see :meth:`counts`).
        self.unplanned = False

    def plan(self, jobs: Mapping[str, str | None]) -> None:
        """Count the DAG's jobs (Snakemake job id -> context identity, or None)."""
        for jobid, identity in jobs.items():
            if identity is None:
                self.unknown += 1
            else:
                self._planned.add(identity)
                self._remaining.setdefault(identity, set()).add(jobid)

    def knows(self, identity: str) -> bool:
        """Whether the run's DAG named this context (its work to come is known)."""
        return identity in self._planned

    def ready(self, identity: str | None, jobid: str) -> None:
        """A job became ready (counted once, however often it is retried)."""
        if identity is not None:
            self._remaining.setdefault(identity, set()).add(jobid)
            self.unplanned = self.unplanned or identity not in self._planned

    def ended(self, identity: str | None, jobid: str) -> None:
        """A job ended (reported to Snakemake, either way)."""
        if identity is not None:
            self._remaining.get(identity, set()).discard(jobid)

    def counts(self, held: Iterable[str]) -> Counter[str]:
        """Jobs still to come per identity: the DAG's for the contexts it named, else
        ``held`` (the identities of the jobs the executor holds, one per job)."""
        out = Counter(identity for identity in held if identity not in self._planned)
        for identity in self._planned:
            out[identity] = len(self._remaining.get(identity, ()))
        return out


#: The refusals placement gives whatever the work to come (see the module's docstring).
WHATEVER_REMAINS = frozenset({PlacementStep.BUSY, PlacementStep.UNRUNNABLE})

#: A job's wanted resources (hashable), its context, and the work to come (None: any).
_Key = tuple[frozenset[tuple[str, float]], str | None, int | None]


class Refusals:
    """The refusals of one pass over the queue since its last placement."""

    def __init__(self) -> None:
        self._known: dict[_Key, Decision] = {}

    def get(
        self, wanted: frozenset[tuple[str, float]], identity: str | None, remaining: int
    ) -> Decision | None:
        """The refusal a job asking this was given (None: none was)."""
        known = self._known
        return known.get((wanted, identity, remaining)) or known.get((wanted, identity, None))

    def refused(
        self,
        wanted: frozenset[tuple[str, float]],
        identity: str | None,
        remaining: int,
        decision: Decision,
    ) -> None:
        """Remember a refusal (a decision without a server)."""
        self._known[(wanted, identity, remaining)] = decision
        if decision.step in WHATEVER_REMAINS:
            self._known[(wanted, identity, None)] = decision

    def forget(self) -> None:
        """A job was placed: the fleet's state changed, every refusal may not hold."""
        self._known.clear()
