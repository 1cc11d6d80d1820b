"""What ``snakemake-context status`` asks a catalog (read-only). Split by reader:
placement's start is :mod:`.fleetseed`, runs, losses and jobs (also the monitor's) are
:mod:`.history`, and the terminal monitor's own reader, which reads only what changed
since its last poll, is :mod:`.monitoring`; each live server's expected life left
is :mod:`.lives`'s.

Each function takes an open session and returns plain dataclasses; :func:`overview`
gathers what ``status`` prints. Nothing here writes.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import and_, case, func, select
from sqlalchemy.orm import Session

from ...fleet.loads import LoadKind, load_parts
from ..models import (
    Attempt,
    Context,
    EventRecord,
    Job,
    Placement,
    Run,
    Server,
    ServerLoss,
    Transfer,
)
from .fleetseed import job_seconds, placement_measurements
from .gangs import GangRow, gangs
from .history import JobRow, LossRow, RunRow, losses, recent_jobs, runs
from .lives import catalog_lives_left

__all__ = [
    "ContextRow",
    "Counts",
    "FleetRow",
    "GangRow",
    "JobRow",
    "LossRow",
    "NodeRow",
    "RunRow",
    "ThroughputRow",
    "TransferRow",
    "contexts",
    "counts",
    "fleet",
    "gangs",
    "load_kind",
    "losses",
    "nodes",
    "overview",
    "placement_measurements",
    "recent_events",
    "recent_jobs",
    "runs",
    "throughput",
    "transfers",
]

#: The order ``status`` and the monitor list load kinds in.
KIND_ORDER = (LoadKind.SOURCE, LoadKind.CACHE, LoadKind.PEER, LoadKind.CONVERSION)


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
    transfers: int = 0


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
        transfers=n(Transfer),
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


@dataclass(frozen=True)
class NodeRow:
    """Servers present now, by node (the host each recorded): what a cluster of
    nodes that join, or pilots, looks like from the catalog."""

    host: str
    servers: list[str]
    gpu_models: list[str]
    slots: int


def nodes(session: Session) -> list[NodeRow]:
    """The servers present now, grouped by their host, in the hosts' order."""
    found: dict[str, tuple[list[str], list[str], list[int]]] = {}
    for host, name, model, slots in session.execute(
        select(Server.host, Server.name, Server.gpu_model, Server.slots)
        .where(Server.left.is_(None))
        .order_by(Server.host, Server.name)
    ):
        names, models, counts = found.setdefault(host or "", ([], [], []))
        names.append(name)
        if model not in models:
            models.append(model)
        counts.append(int(slots or 0))
    return [
        NodeRow(host, names, models, sum(counts)) for host, (names, models, counts) in found.items()
    ]


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
    #: Its finished loads by kind (:func:`load_kind`; only kinds it had), in
    #: :data:`KIND_ORDER`.
    kinds: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        context: Any,
        warm_on: list[str],
        loading_on: list[str],
        loads: int,
        mean_load_seconds: float | None,
        from_cache: int,
        kinds: dict[str, int] | None = None,
    ) -> ContextRow:
        """The row of ``context`` (a catalog row, or a reader's record of one: its
        identity, name, loader, arguments as JSON, bytes) and where it is."""
        try:
            arguments = json.loads(context.arguments or "{}")
        except ValueError:
            arguments = {}
        return cls(
            identity=context.identity,
            name=context.name,
            loader=context.loader,
            arguments=arguments,
            bytes=context.bytes,
            warm_on=warm_on,
            loading_on=loading_on,
            loads=loads,
            mean_load_seconds=mean_load_seconds,
            from_cache=from_cache,
            kinds={k.value: n for k in KIND_ORDER if (n := (kinds or {}).get(k.value, 0))},
        )


def load_kind(
    from_cache: bool | None, conversions: int | None, peer_seconds: float | None
) -> LoadKind:
    """How a placement got its context: the kind of its load's first part, as the
    ledger splits it (:func:`~...fleet.loads.load_parts`)."""
    parts = load_parts(
        0.0, from_cache=from_cache, conversions=conversions, peer_seconds=peer_seconds
    )
    return parts[0][0]


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
    kinds: dict[int, dict[str, int]] = {}
    peer = case((Placement.peer_seconds.is_not(None), 0.0), else_=None)
    for context_id, from_cache, conversions, fetched, n in session.execute(
        select(
            Placement.context_id, Placement.from_cache, Placement.conversions, peer, func.count()
        )
        .where(Placement.load_seconds.is_not(None))
        .group_by(Placement.context_id, Placement.from_cache, Placement.conversions, peer)
    ):
        kind = load_kind(from_cache, conversions, fetched).value
        into = kinds.setdefault(context_id, {})
        into[kind] = into.get(kind, 0) + int(n)
    rows = []
    for row in session.scalars(select(Context).order_by(Context.name)):
        warm, loading = where.get(row.id, ([], []))
        loads, mean, cached = stats.get(row.id, (0, None, 0))
        mean = float(mean) if mean is not None else None
        by_kind = kinds.get(row.id, {})
        rows.append(ContextRow.of(row, warm, loading, loads, mean, cached, by_kind))
    return rows


@dataclass(frozen=True)
class TransferRow:
    """A context's transfers from peers: tries, those that ended early, and the bytes
    and seconds of all of them."""

    identity: str
    name: str
    transfers: int
    failed: int
    bytes: int
    seconds: float


def transfers(session: Session) -> list[TransferRow]:
    """Every context's transfers from peers (contexts never fetched from one aside)."""
    found = session.execute(
        select(
            Context.identity,
            Context.name,
            func.count(),
            func.sum(case((Transfer.outcome != "ok", 1), else_=0)),
            func.sum(Transfer.bytes),
            func.sum(Transfer.seconds),
        )
        .join(Context, Transfer.context_id == Context.id)
        .group_by(Context.identity, Context.name)
        .order_by(Context.name, Context.identity)
    ).all()
    return [
        TransferRow(identity, name, int(n), int(failed or 0), int(nbytes or 0), float(sec or 0))
        for identity, name, n, failed, nbytes, sec in found
    ]


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


def overview(session: Session, *, limit: int = 10, now: float | None = None) -> dict[str, Any]:
    """Everything ``snakemake-context status --json`` prints from the catalog (the
    live servers' expected lives left as of ``now``, default the time now)."""
    now = time.time() if now is None else now
    return {
        "fleet": [asdict(row) for row in fleet(session)],
        "nodes": [asdict(row) for row in nodes(session)],
        "contexts": [asdict(row) for row in contexts(session)],
        "throughput": [asdict(row) for row in throughput(session)],
        "transfers": [asdict(row) for row in transfers(session)],
        "gangs": [asdict(row) for row in gangs(session)],
        "runs": [asdict(row) for row in runs(session, limit)],
        "losses": [asdict(row) for row in losses(session, limit)],
        "jobs": [asdict(row) for row in recent_jobs(session, limit)],
        "events": [
            {"at": at, "kind": kind, "text": text}
            for at, kind, text in recent_events(session, 2 * limit)
        ],
        "counts": asdict(counts(session)),
        "lives": [
            {
                "address": server.address,
                "name": server.name,
                "group": server.group,
                "gpu_model": server.gpu_model,
                "age": max(0.0, now - server.joined),
                **asdict(life),
                "text": life.text(),
            }
            for server, life in catalog_lives_left(session, now=now)
        ],
    }
