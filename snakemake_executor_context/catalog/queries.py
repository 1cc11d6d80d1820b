"""What ``snakemake-context status`` asks a catalog (read-only). Split by reader:
placement's start is :mod:`.seed`, runs, losses and jobs (also the monitor's) are
:mod:`.history`, and the terminal monitor's own reader, which reads only what changed
since its last poll, is :mod:`.monitor_queries`.

Each function takes an open session and returns plain dataclasses; :func:`overview`
gathers what ``status`` prints. Nothing here writes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import and_, case, func, select
from sqlalchemy.orm import Session

from .history import JobRow, LossRow, RunRow, losses, recent_jobs, runs
from .models import Attempt, Context, EventRecord, Job, Placement, Run, Server, ServerLoss
from .seed import job_seconds, placement_measurements

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
    seconds = job_seconds()
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
