"""What a simulated run took: its makespan, jobs per server, loads by kind, losses,
the ledger's GPU-seconds, and the dispatch machine's CPU time; as text or JSON."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..fleet.loads import LoadKind
from .simledger import Ledger
from .simservers import SimServer

__all__ = ["Counts", "SimResult", "describe", "summarise"]


@dataclass
class SimResult:
    """One simulated run."""

    makespan: float
    jobs: int
    failed: int
    items: int
    #: Jobs each server ran to their end (by name; a restarted server keeps its name).
    per_server: dict[str, int]
    loads: dict[str, int]
    #: Servers lost while running jobs, and attempts thrown away.
    losses: int
    attempts_lost: int
    preemptions: int
    ledger: Ledger
    placed: dict[str, int]
    #: The dispatch machine's CPU seconds, the stimuli it took, and jobs handed to it.
    dispatch_cpu: float
    stimuli: int
    handed: int
    wall: float
    pool: dict[str, Any] | None = None
    #: (end time, items) of each job that ended ok, in time order.
    finishes: list[tuple[float, int]] = field(default_factory=list)
    events: list[tuple[float, str, str]] = field(default_factory=list)
    #: Whether the run ended (False: the simulation stopped at ``Options.limit``
    #: with jobs still to run, and the makespan is that limit, not a prediction).
    ended: bool = True

    def items_by(self, when: float) -> int:
        """Items of the jobs that had ended ok by ``when``."""
        return sum(items for at, items in self.finishes if at <= when)

    @property
    def cpu_per_job(self) -> float:
        """The dispatch machine's CPU seconds per job handed to it."""
        return self.dispatch_cpu / max(1, self.handed)

    def to_json(self) -> dict[str, Any]:
        """Plain data (without the event log)."""
        return {
            "makespan_s": round(self.makespan, 3),
            "jobs": self.jobs,
            "failed": self.failed,
            "items": self.items,
            "per_server": self.per_server,
            "loads": self.loads,
            "losses": self.losses,
            "attempts_lost": self.attempts_lost,
            "preemptions": self.preemptions,
            "gpu_hours": {k: round(h, 4) for k, h in self.ledger.hours().items()},
            "gpu_hours_by_rule": {
                rule: {k: round(h, 4) for k, h in hours.items()}
                for rule, hours in self.ledger.rule_hours().items()
            },
            "placed": self.placed,
            "dispatch_cpu_s": round(self.dispatch_cpu, 4),
            "dispatch_cpu_per_job_ms": round(1000 * self.cpu_per_job, 4),
            "stimuli": self.stimuli,
            "wall_s": round(self.wall, 3),
            "pool": self.pool,
            "ended": self.ended,
        }


@dataclass
class Counts:
    """What the simulation counted as it ran."""

    done: int
    failed: int
    preemptions: int
    placed: Mapping[str, int]
    dispatch_cpu: float
    stimuli: int
    handed: int
    #: Items of each attempt handed to a server, by attempt key.
    items_of: Mapping[str, int]
    events: list[tuple[float, str, str]]
    #: Whether every job ended before the simulation's limit.
    ended: bool = True


def summarise(
    servers: Iterable[SimServer],
    counts: Counts,
    end: float,
    ledger: Ledger,
    books: Any,
    wall: float,
) -> SimResult:
    """The result of a finished simulation."""
    per_server: Counter[str] = Counter()
    loads: Counter[str] = Counter()
    finishes: list[tuple[float, int]] = []
    lost = losses = 0
    for server in servers:
        per_server[server.name] += server.jobs_done
        for load in server.loads:
            loads[str(load.kind)] += 1
        gone = [key for key, work in server.attempts.items() if work.outcome == "lost"]
        lost += len(gone)
        losses += 1 if gone else 0
        for key, work in server.attempts.items():
            if work.outcome == "ok" and work.end is not None and key in counts.items_of:
                finishes.append((work.end, counts.items_of[key]))
    finishes.sort()
    return SimResult(
        makespan=end,
        jobs=counts.done,
        failed=counts.failed,
        items=sum(items for _, items in finishes),
        per_server=dict(sorted(per_server.items())),
        loads={str(kind): loads[str(kind)] for kind in LoadKind if loads[str(kind)]},
        losses=losses,
        attempts_lost=lost,
        preemptions=counts.preemptions,
        ledger=ledger,
        placed=dict(sorted(counts.placed.items())),
        dispatch_cpu=counts.dispatch_cpu,
        stimuli=counts.stimuli,
        handed=counts.handed,
        wall=wall,
        pool=books,
        finishes=finishes,
        events=counts.events,
        ended=counts.ended,
    )


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h ({seconds:,.0f} s)"
    if seconds >= 120:
        return f"{seconds / 60:.1f} min ({seconds:,.0f} s)"
    return f"{seconds:.1f} s"


def describe(result: SimResult) -> str:
    """The result as lines of text."""
    lines = [
        f"predicted makespan: {_duration(result.makespan)}; {result.jobs} job(s) ok, "
        f"{result.failed} failed, {result.items:,} item(s)",
        "loads: "
        + (", ".join(f"{n} {kind}" for kind, n in result.loads.items()) or "none")
        + f"; losses: {result.losses} server(s) lost while running, "
        f"{result.attempts_lost} attempt(s) thrown away, {result.preemptions} preemption(s)",
        "GPU-hours by bucket:",
    ]
    total = result.ledger.total or 1.0
    for row, hours in result.ledger.hours().items():
        share = 100 * hours * 3600 / total
        lines.append(f"  {row:<20} {hours:10.3f} h  {share:5.1f}%")
    by_rule = result.ledger.rule_hours()
    if by_rule:
        lines.append("GPU-hours by rule (its jobs and their loads):")
    for rule, rows in by_rule.items():
        parts = ", ".join(f"{row} {hours:.3f}" for row, hours in rows.items())
        lines.append(f"  {rule:<20} {sum(rows.values()):10.3f} h  ({parts})")
    if result.pool:
        pool = result.pool
        lines.append(
            f"pilots: submitted {pool['submitted']}, started {pool['started']}, preempted "
            f"{pool['preempted']}, retired {pool['retired']}; pilot-seconds "
            f"{pool['pilot_seconds']:.0f} (busy {pool['busy_seconds']:.0f})"
        )
    lines.append(
        f"dispatch machine: {result.dispatch_cpu:.2f} CPU s for {result.handed} job(s) "
        f"({1000 * result.cpu_per_job:.3f} ms a job, {result.stimuli} stimuli); simulated "
        f"in {result.wall:.1f} s"
    )
    return "\n".join(lines)
