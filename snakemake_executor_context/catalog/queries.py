"""Read-only questions to a catalog: what placement starts from, and what
``snakemake-context status`` shows (the terminal monitor's own reader, which reads only
what changed since its last poll, is :mod:`.monitor_queries`).

Each function takes an open session and returns plain dataclasses; :func:`overview`
gathers what ``status`` prints. Nothing here writes.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import and_, case, func, select
from sqlalchemy.orm import Session, aliased

from .models import Attempt, Context, EventRecord, Job, Placement, Run, Server, ServerLoss

__all__ = [
    "ContextRow",
    "Counts",
    "FleetRow",
    "JobRow",
    "LossRow",
    "RunRow",
    "ThroughputRow",
    "contexts",
    "counts",
    "fleet",
    "losses",
    "overview",
    "placement_measurements",
    "recent_events",
    "recent_jobs",
    "runs",
    "throughput",
]

#: A run whose heartbeat is older than this (seconds) and that never ended is stale.
STALE_SECONDS = 60.0


@dataclass(frozen=True)
class Counts:
    """Rows per table."""

    runs: int
    servers: int
    contexts: int
    placements: int
    jobs: int
    attempts: int
    losses: int
    events: int


def counts(session: Session) -> Counts:
    """How many rows each table holds."""

    def n(model: Any) -> int:
        return int(session.scalar(select(func.count()).select_from(model)) or 0)

    return Counts(
        runs=n(Run),
        servers=n(Server),
        contexts=n(Context),
        placements=n(Placement),
        jobs=n(Job),
        attempts=n(Attempt),
        losses=n(ServerLoss),
        events=n(EventRecord),
    )


def _job_seconds() -> Any:
    return Attempt.finished - Attempt.started - Attempt.load_seconds


def placement_measurements(session: Session) -> dict[str, Any]:
    """Measured job and load seconds per context and GPU model, as
    :meth:`~..fleet.Measurements.merge_wire` takes them (one query per table)."""
    job_rows = session.execute(
        select(Context.identity, Server.gpu_model, func.avg(_job_seconds()), func.count())
        .select_from(Attempt)
        .join(Job, Attempt.job_id == Job.id)
        .join(Context, Job.context_id == Context.id)
        .join(Server, Attempt.server_id == Server.id)
        .where(Attempt.outcome == "ok", Attempt.started.is_not(None))
        .group_by(Context.identity, Server.gpu_model)
    ).all()
    load_rows = session.execute(
        select(Context.identity, Server.gpu_model, func.avg(Placement.load_seconds), func.count())
        .select_from(Placement)
        .join(Context, Placement.context_id == Context.id)
        .join(Server, Placement.server_id == Server.id)
        .where(Placement.load_seconds.is_not(None))
        .group_by(Context.identity, Server.gpu_model)
    ).all()
    sizes = session.execute(select(Context.identity, Context.bytes).where(Context.bytes > 0)).all()
    return {
        "job": [[i, m, float(v), int(c)] for i, m, v, c in job_rows if v is not None],
        "load": [[i, m, float(v), int(c)] for i, m, v, c in load_rows if v is not None],
        "bytes": {identity: int(size) for identity, size in sizes},
    }


@dataclass(frozen=True)
class FleetRow:
    """Servers present now, by GPU model."""

    gpu_model: str
    gpu_name: str | None
    servers: int
    slots: int
    gpu_memory_bytes: int | None
    compute_capability: str | None
    names: list[str] = field(default_factory=list)
    left: int = 0
    lost: int = 0


def fleet(session: Session) -> list[FleetRow]:
    """The fleet by GPU model: servers present, and how many of that model left or
    were lost (over the catalog's history)."""
    present = session.execute(
        select(
            Server.gpu_model,
            func.max(Server.gpu_name),
            func.count(),
            func.sum(Server.slots),
            func.max(Server.gpu_memory_bytes),
            func.max(Server.compute_capability),
        )
        .where(Server.left.is_(None))
        .group_by(Server.gpu_model)
    ).all()
    names: dict[str, list[str]] = {}
    for model, name in session.execute(
        select(Server.gpu_model, Server.name).where(Server.left.is_(None)).order_by(Server.name)
    ):
        names.setdefault(model, []).append(name)
    gone = {
        model: (int(left or 0), int(lost or 0))
        for model, left, lost in session.execute(
            select(
                Server.gpu_model,
                func.count(func.distinct(Server.id)),
                func.count(func.distinct(ServerLoss.server_id)),
            )
            .outerjoin(ServerLoss, ServerLoss.server_id == Server.id)
            .where(Server.left.is_not(None))
            .group_by(Server.gpu_model)
        )
    }
    rows = [
        FleetRow(
            gpu_model=model,
            gpu_name=name,
            servers=int(count),
            slots=int(slots or 0),
            gpu_memory_bytes=memory,
            compute_capability=capability,
            names=names.get(model, []),
            left=gone.get(model, (0, 0))[0],
            lost=gone.get(model, (0, 0))[1],
        )
        for model, name, count, slots, memory, capability in present
    ]
    for model, (left, lost) in gone.items():
        if model not in {row.gpu_model for row in rows}:
            rows.append(FleetRow(model, None, 0, 0, None, None, [], left, lost))
    return sorted(rows, key=lambda row: (-row.servers, row.gpu_model))


@dataclass(frozen=True)
class ContextRow:
    """A context, where it is warm now, and its loads."""

    identity: str
    name: str
    loader: str
    arguments: dict[str, Any]
    bytes: int | None
    warm_on: list[str]
    loading_on: list[str]
    loads: int
    mean_load_seconds: float | None
    from_cache: int


def contexts(session: Session) -> list[ContextRow]:
    """Every context, the live servers it is warm (or loading) on, and its loads."""
    where: dict[int, tuple[list[str], list[str]]] = {}
    for context_id, state, name, address in session.execute(
        select(Placement.context_id, Placement.state, Server.name, Server.address)
        .join(Server, Placement.server_id == Server.id)
        .where(Placement.state.in_(("loading", "ready")), Server.left.is_(None))
        .order_by(Server.name)
    ):
        warm, loading = where.setdefault(context_id, ([], []))
        (warm if state == "ready" else loading).append(name or address)
    stats = {
        context_id: (int(loads), mean, int(cached or 0))
        for context_id, loads, mean, cached in session.execute(
            select(
                Placement.context_id,
                func.count(Placement.load_seconds),
                func.avg(Placement.load_seconds),
                func.sum(case((Placement.from_cache.is_(True), 1), else_=0)),
            ).group_by(Placement.context_id)
        )
    }
    rows = []
    for row in session.scalars(select(Context).order_by(Context.name)):
        warm, loading = where.get(row.id, ([], []))
        loads, mean, cached = stats.get(row.id, (0, None, 0))
        try:
            arguments = json.loads(row.arguments or "{}")
        except ValueError:
            arguments = {}
        rows.append(
            ContextRow(
                identity=row.identity,
                name=row.name,
                loader=row.loader,
                arguments=arguments,
                bytes=row.bytes,
                warm_on=warm,
                loading_on=loading,
                loads=loads,
                mean_load_seconds=float(mean) if mean is not None else None,
                from_cache=cached,
            )
        )
    return rows


@dataclass(frozen=True)
class RunRow:
    """A run and its totals."""

    run_id: str
    workdir: str
    host: str
    cluster: str
    started: float
    finished: float | None
    heartbeat: float | None
    state: str
    ok: bool | None
    jobs_total: int | None
    jobs_ok: int
    jobs_failed: int
    items: int
    loads: int


def runs(session: Session, limit: int = 10, now: float | None = None) -> list[RunRow]:
    """The latest runs, newest first; ``state`` is running, finished, failed or
    stale (no heartbeat for :data:`STALE_SECONDS`, never ended)."""
    now = time.time() if now is None else now
    out = []
    for row in session.scalars(select(Run).order_by(Run.started.desc()).limit(limit)):
        if row.finished is not None:
            state = "failed" if row.ok is False else "finished"
        elif row.heartbeat is not None and now - row.heartbeat > STALE_SECONDS:
            state = "stale"
        else:
            state = "running"
        out.append(
            RunRow(
                run_id=row.run_id,
                workdir=row.workdir,
                host=row.host,
                cluster=row.cluster,
                started=row.started,
                finished=row.finished,
                heartbeat=row.heartbeat,
                state=state,
                ok=row.ok,
                jobs_total=row.jobs_total,
                jobs_ok=row.jobs_ok,
                jobs_failed=row.jobs_failed,
                items=row.items,
                loads=row.loads,
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


@dataclass(frozen=True)
class ThroughputRow:
    """What a context achieves on a GPU model."""

    context: str
    gpu_model: str
    jobs: int
    mean_job_seconds: float
    items: int
    items_per_second: float | None


def throughput(session: Session) -> list[ThroughputRow]:
    """Jobs, mean job seconds (loads excluded) and items per second, per context and
    GPU model, over successful attempts."""
    seconds = _job_seconds()
    rows = session.execute(
        select(
            Context.name,
            Server.gpu_model,
            func.count(),
            func.avg(seconds),
            func.sum(Attempt.items),
            func.sum(seconds),
        )
        .select_from(Attempt)
        .join(Job, Attempt.job_id == Job.id)
        .join(Context, Job.context_id == Context.id)
        .join(Server, Attempt.server_id == Server.id)
        .where(and_(Attempt.outcome == "ok", Attempt.started.is_not(None)))
        .group_by(Context.name, Server.gpu_model)
        .order_by(Context.name, Server.gpu_model)
    ).all()
    return [
        ThroughputRow(
            context=name,
            gpu_model=model,
            jobs=int(jobs),
            mean_job_seconds=float(mean or 0.0),
            items=int(items or 0),
            items_per_second=(float(items) / float(total)) if items and total else None,
        )
        for name, model, jobs, mean, items, total in rows
    ]


def recent_events(session: Session, limit: int = 20) -> list[tuple[float, str, str]]:
    """The latest fleet events ``(at, kind, text)``, newest first."""
    return [
        (at, kind, text)
        for at, kind, text in session.execute(
            select(EventRecord.at, EventRecord.kind, EventRecord.text)
            .order_by(EventRecord.id.desc())
            .limit(limit)
        )
    ]


def overview(session: Session, *, limit: int = 10) -> dict[str, Any]:
    """Everything ``snakemake-context status --json`` prints from the catalog."""
    return {
        "fleet": [asdict(row) for row in fleet(session)],
        "contexts": [asdict(row) for row in contexts(session)],
        "throughput": [asdict(row) for row in throughput(session)],
        "runs": [asdict(row) for row in runs(session, limit)],
        "losses": [asdict(row) for row in losses(session, limit)],
        "jobs": [asdict(row) for row in recent_jobs(session, limit)],
        "events": [
            {"at": at, "kind": kind, "text": text}
            for at, kind, text in recent_events(session, 2 * limit)
        ],
        "counts": asdict(counts(session)),
    }
