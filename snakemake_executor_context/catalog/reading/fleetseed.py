"""What a run's placement starts from: the catalog's history of job and load times,
and of servers' lives (read once, when a run starts or a persistent cluster's hub opens
its catalog)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ...fleet.losses import LossKind
from ...fleet.survival import Life, survival_group
from ..models import Attempt, Context, Job, Placement, Server, Transfer

__all__ = [
    "HISTORY_LIVES",
    "LIFE_COLUMNS",
    "job_seconds",
    "placement_measurements",
    "survival_history",
]

#: Ended lives read for the survival estimates: the newest this many.
HISTORY_LIVES = 5000


def job_seconds() -> Any:
    """An attempt's job time without its loads, as an SQL expression."""
    return Attempt.finished - Attempt.started - Attempt.load_seconds


def placement_measurements(session: Session) -> dict[str, Any]:
    """Measured job and load seconds per context and GPU model, as
    :meth:`~...fleet.measure.Measurements.merge_wire` takes them (one query per table)."""
    job_rows = session.execute(
        select(Context.identity, Server.gpu_model, func.avg(job_seconds()), func.count())
        .select_from(Attempt)
        .join(Job, Attempt.job_id == Job.id)
        .join(Context, Job.context_id == Context.id)
        .join(Server, Attempt.server_id == Server.id)
        .where(Attempt.outcome == "ok", Attempt.started.is_not(None))
        .group_by(Context.identity, Server.gpu_model)
    ).all()

    def loads(*where: Any) -> list[list[Any]]:
        rows = session.execute(
            select(
                Context.identity, Server.gpu_model, func.avg(Placement.load_seconds), func.count()
            )
            .select_from(Placement)
            .join(Context, Placement.context_id == Context.id)
            .join(Server, Placement.server_id == Server.id)
            .where(Placement.load_seconds.is_not(None), *where)
            .group_by(Context.identity, Server.gpu_model)
        ).all()
        return [[i, m, float(v), int(c)] for i, m, v, c in rows if v is not None]

    converted = Placement.conversions > 0
    unconverted = func.coalesce(Placement.conversions, 0) == 0
    fetched = Placement.peer_seconds.is_not(None)
    sizes = session.execute(select(Context.identity, Context.bytes).where(Context.bytes > 0)).all()
    plain = (unconverted, Placement.peer_seconds.is_(None))
    rates = session.execute(
        select(Context.identity, func.avg(Transfer.bytes / Transfer.seconds), func.count())
        .join(Context, Transfer.context_id == Context.id)
        .where(Transfer.outcome == "ok", Transfer.seconds > 0, Transfer.bytes > 0)
        .group_by(Context.identity)
    ).all()
    return {
        "job": [[i, m, float(v), int(c)] for i, m, v, c in job_rows if v is not None],
        "load": loads(),
        # By kind (:meth:`~...fleet.measure.Measurements.load_seconds`).
        "convert": loads(converted),
        "peer": loads(unconverted, fetched),
        "reload": loads(*plain),
        # Where a load read (:meth:`~...fleet.measure.Measurements.rates`).
        "source": loads(*plain, Placement.from_cache.is_(False)),
        "cache": loads(*plain, Placement.from_cache.is_(True)),
        "transfer": {i: [float(v), int(c)] for i, v, c in rates if v is not None},
        "bytes": {identity: int(size) for identity, size in sizes},
    }


#: What a server's life is read from: joined, left, what ended it, its group label,
#: partition and pool, and its GPU model.
LIFE_COLUMNS = (
    Server.joined,
    Server.left,
    Server.ended_by,
    Server.group_label,
    Server.partition,
    Server.pool,
    Server.gpu_model,
)


def survival_history(session: Session, *, before: float | None = None) -> dict[str, Any]:
    """The ended lives of the catalog's servers (the newest :data:`HISTORY_LIVES`, and
    only those that ended before ``before`` when given), as
    :meth:`~...fleet.survival.SurvivalBook.merge_wire` takes them: a preemption or a
    crash is a death, a close censors. Servers recorded before schema 8 (no
    ``ended_by``) are left out: whether they were lost is not known."""
    query = (
        select(*LIFE_COLUMNS)
        .where(Server.left.is_not(None), Server.ended_by.is_not(None))
        .order_by(Server.left.desc())
        .limit(HISTORY_LIVES)
    )
    if before is not None:
        query = query.where(Server.left < before)
    lives = [
        Life(
            max(0.0, float(left) - float(joined)),
            ended_by != LossKind.CLOSED,
            survival_group(group or "", partition or "", pool or ""),
            model or "",
        ).to_wire()
        for joined, left, ended_by, group, partition, pool, model in session.execute(query)
    ]
    return {"lives": lives}
