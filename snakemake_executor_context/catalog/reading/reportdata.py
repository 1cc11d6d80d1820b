"""What the run report shows beside the ledger (``snakemake-context report``): jobs
finished over time, the fleet's size over time, the forward-batch histogram, the
placement decisions, the pool's books, and the runs in the window. Each one query over
the window, so that the report reads the catalog alone."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from sqlalchemy import Integer, cast, func, or_, select
from sqlalchemy.orm import Session

from ...fleet.pilotbook import PilotRecord, account
from ..models import Attempt, ForwardBatch, Job, Pilot, Run, Server
from .history import RunSummary
from .ledger import Window

__all__ = [
    "RunSummary",
    "batch_histogram",
    "fleet_size",
    "placements",
    "pool_books",
    "run_summaries",
    "throughput",
]


def run_summaries(session: Session, window: Window) -> list[RunSummary]:
    """The runs that overlap the window, oldest first."""
    query = (
        select(*(getattr(Run, item.name) for item in fields(RunSummary)))
        .where(Run.started <= window.end)
        .where(or_(Run.finished.is_(None), Run.finished >= window.start))
        .order_by(Run.started)
    )
    if window.run is not None:
        query = query.where(Run.run_id == window.run)
    return [RunSummary(*row) for row in session.execute(query)]


def _in_window(window: Window) -> Any:
    return Attempt.finished.between(window.start, window.end)


def throughput(session: Session, window: Window, bins: int = 60) -> tuple[float, list[int]]:
    """Attempts that ended ok per bin of the window: (bin seconds, counts)."""
    width = max(1e-3, (window.end - window.start) / bins)
    counts = [0] * bins
    index = cast((Attempt.finished - window.start) / width, Integer)
    for position, count in session.execute(
        select(index, func.count())
        .where(_in_window(window), Attempt.outcome == "ok")
        .group_by(index)
    ):
        counts[min(bins - 1, max(0, int(position)))] += int(count)
    return width, counts


def fleet_size(session: Session, window: Window) -> list[tuple[float, int, int]]:
    """The fleet's size as a step function: (time, servers, GPUs) at each change."""
    steps: list[tuple[float, int]] = []
    gpus: dict[float, int] = {}
    for joined, left, count in session.execute(
        select(Server.joined, Server.left, Server.gpus).where(
            Server.joined <= window.end, or_(Server.left.is_(None), Server.left >= window.start)
        )
    ):
        count = count or 1
        steps.append((max(joined, window.start), 1))
        gpus[max(joined, window.start)] = gpus.get(max(joined, window.start), 0) + count
        if left is not None and left <= window.end:
            steps.append((left, -1))
            gpus[left] = gpus.get(left, 0) - count
    changes: dict[float, int] = {}
    for at, step in steps:
        changes[at] = changes.get(at, 0) + step
    out: list[tuple[float, int, int]] = [(window.start, 0, 0)]
    servers = total_gpus = 0
    for at in sorted(changes):
        servers += changes[at]
        total_gpus += gpus.get(at, 0)
        out.append((at, servers, total_gpus))
    out.append((window.end, servers, total_gpus))
    return out


def batch_histogram(session: Session, window: Window) -> dict[int, int]:
    """Calls of batched functions (forward batches) by size, led by attempts that
    ended in the window."""
    query = (
        select(ForwardBatch.size, func.sum(ForwardBatch.calls))
        .join(Attempt, ForwardBatch.attempt_id == Attempt.id)
        .where(_in_window(window))
        .group_by(ForwardBatch.size)
        .order_by(ForwardBatch.size)
    )
    return {int(size): int(calls) for size, calls in session.execute(query)}


def placements(session: Session, window: Window) -> dict[str, int]:
    """Attempts dispatched in the window by how placement chose their server (warm,
    cached, fastest, any, load, queued, plain...), and (``cold``) how many of them
    loaded their context."""
    by = func.coalesce(Attempt.placed_by, "unknown")
    query = select(by, func.count(), func.sum(cast(Attempt.cold, Integer))).group_by(by)
    query = query.where(Attempt.dispatched.between(window.start, window.end))
    if window.run is not None:
        query = query.join(Job, Attempt.job_id == Job.id).join(Run, Job.run_pk == Run.id)
        query = query.where(Run.run_id == window.run)
    rows = session.execute(query).all()
    counts = dict(sorted(((str(k), int(n)) for k, n, _ in rows), key=lambda kv: -kv[1]))
    return {**counts, "cold": sum(int(c or 0) for *_, c in rows)} if counts else {}


def pool_books(session: Session, window: Window) -> dict[str, Any] | None:
    """The pool's books over the pilots submitted before the window's end and not ended
    before its start (None: no pilot)."""
    rows = session.execute(
        select(Pilot).where(
            Pilot.submitted <= window.end, or_(Pilot.ended.is_(None), Pilot.ended >= window.start)
        )
    ).scalars()
    records = [
        PilotRecord(
            name=p.name,
            pilot_kind=p.kind,
            job_id=p.job_id,
            submitted=p.submitted,
            registered=p.registered,
            first_task=p.first_task,
            ended=p.ended,
            batch_state=p.batch_state,
            busy_seconds=p.busy_seconds,
            released=p.released,
        )
        for p in rows
    ]
    return account(records, window.end) if records else None
