"""Runs, losses and jobs as the catalog recorded them: read by ``snakemake-context
status`` and by the terminal monitor."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, fields
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, aliased

from ..models import RUN_INTERRUPTED, Attempt, Context, EventRecord, Job, Run, Server, ServerLoss

__all__ = ["JobRow", "LossRow", "RunRow", "RunSummary", "losses", "recent_jobs", "runs"]

#: A run whose heartbeat is older than this (seconds) and that never ended is stale.
STALE_SECONDS = 60.0


@dataclass(frozen=True)
class RunSummary:
    """A run: its id, span, outcome and totals (the run report's row)."""

    run_id: str
    started: float
    finished: float | None
    ok: bool | None
    jobs_total: int | None
    jobs_ok: int
    jobs_failed: int
    items: int
    loads: int


@dataclass(frozen=True)
class RunRow(RunSummary):
    """A run, its totals, where it ran and its state now."""

    workdir: str
    host: str
    cluster: str
    heartbeat: float | None
    state: str


def runs(session: Session, limit: int = 10, now: float | None = None) -> list[RunRow]:
    """The latest runs, newest first; ``state`` is running, finished, failed,
    interrupted (cancelled, or told to stop: its end noted so), stale (no heartbeat for
    :data:`STALE_SECONDS`, never ended) or abandoned (marked so by a later writer: see
    :func:`..writing.record.mark_abandoned`)."""
    now = time.time() if now is None else now
    out = []
    rows = session.scalars(select(Run).order_by(Run.started.desc()).limit(limit)).all()
    interrupted = set(
        session.scalars(
            select(EventRecord.run_pk).where(
                EventRecord.kind == RUN_INTERRUPTED,
                EventRecord.run_pk.in_([row.id for row in rows]),
            )
        )
    )
    for row in rows:
        if row.finished is not None and row.ok is None:
            state = "abandoned"
        elif row.finished is not None and row.id in interrupted:
            state = "interrupted"
        elif row.finished is not None:
            state = "failed" if row.ok is False else "finished"
        elif row.heartbeat is not None and now - row.heartbeat > STALE_SECONDS:
            state = "stale"
        else:
            state = "running"
        out.append(
            RunRow(
                **{item.name: getattr(row, item.name) for item in fields(RunSummary)},
                workdir=row.workdir,
                host=row.host,
                cluster=row.cluster,
                heartbeat=row.heartbeat,
                state=state,
            )
        )
    return out


@dataclass(frozen=True)
class LossRow:
    """A server lost while it ran jobs."""

    at: float
    server: str
    address: str
    gpu_model: str
    reason: str
    jobs_lost: int
    seconds_lost: float
    jobs: list[str]


def losses(session: Session, limit: int = 10) -> list[LossRow]:
    """The latest server losses, newest first, with the jobs each hit."""
    rows = session.execute(
        select(ServerLoss, Server.name, Server.address, Server.gpu_model)
        .join(Server, ServerLoss.server_id == Server.id)
        .order_by(ServerLoss.at.desc())
        .limit(limit)
    ).all()
    hits: dict[int, list[str]] = {}
    if rows:
        # One query for every loss's jobs (not one per loss).
        for loss_id, key, rule in session.execute(
            select(Attempt.loss_id, Attempt.key, Job.rule)
            .outerjoin(Job, Attempt.job_id == Job.id)
            .where(Attempt.loss_id.in_([loss.id for loss, *_ in rows]))
            .order_by(Attempt.id)
        ):
            hits.setdefault(loss_id, []).append(f"{rule or '?'} ({key})")
    out = []
    for loss, name, address, model in rows:
        out.append(
            LossRow(
                at=loss.at,
                server=name or address,
                address=address,
                gpu_model=model,
                reason=loss.reason,
                jobs_lost=loss.jobs_lost,
                seconds_lost=loss.seconds_lost,
                jobs=hits.get(loss.id, []),
            )
        )
    return out


@dataclass(frozen=True)
class JobRow:
    """One attempt of a job."""

    key: str
    run_id: str | None
    rule: str | None
    wildcards: dict[str, Any]
    context: str | None
    server: str | None
    gpu_model: str | None
    placed_by: str | None
    dispatched: float | None
    started: float | None
    finished: float | None
    outcome: str | None
    items: int
    load_seconds: float
    cold: bool


def recent_jobs(session: Session, limit: int = 10) -> list[JobRow]:
    """The latest job attempts, newest first."""
    server = aliased(Server)
    rows = session.execute(
        select(
            Attempt,
            Job.rule,
            Job.wildcards,
            Context.name,
            server.name,
            server.gpu_model,
            Run.run_id,
        )
        .outerjoin(Job, Attempt.job_id == Job.id)
        .outerjoin(Run, Job.run_pk == Run.id)
        .outerjoin(Context, Job.context_id == Context.id)
        .outerjoin(server, Attempt.server_id == server.id)
        .order_by(Attempt.id.desc())
        .limit(limit)
    ).all()
    out = []
    for attempt, rule, wildcards, context, server_name, model, run_id in rows:
        try:
            parsed = json.loads(wildcards or "{}")
        except ValueError:
            parsed = {}
        out.append(
            JobRow(
                key=attempt.key,
                run_id=run_id,
                rule=rule,
                wildcards=parsed,
                context=context,
                server=server_name,
                gpu_model=model,
                placed_by=attempt.placed_by,
                dispatched=attempt.dispatched,
                started=attempt.started,
                finished=attempt.finished,
                outcome=attempt.outcome,
                items=attempt.items,
                load_seconds=attempt.load_seconds,
                cold=attempt.cold,
            )
        )
    return out
