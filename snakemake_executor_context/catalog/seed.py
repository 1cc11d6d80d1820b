"""What a run's placement starts from: the catalog's history of job and load times
(read once, when a run starts or a persistent cluster's hub opens its catalog)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from .models import Attempt, Context, Job, Placement, Server, Transfer

__all__ = ["job_seconds", "placement_measurements"]


def job_seconds() -> Any:
    """An attempt's job time without its loads, as an SQL expression."""
    return Attempt.finished - Attempt.started - Attempt.load_seconds


def placement_measurements(session: Session) -> dict[str, Any]:
    """Measured job and load seconds per context and GPU model, as
    :meth:`~..fleet.measure.Measurements.merge_wire` takes them (one query per table)."""
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
        # By kind (:meth:`~..fleet.measure.Measurements.load_seconds`).
        "convert": loads(converted),
        "peer": loads(unconverted, fetched),
        "reload": loads(*plain),
        # Where a load read (:meth:`~..fleet.measure.Measurements.rates`).
        "source": loads(*plain, Placement.from_cache.is_(False)),
        "cache": loads(*plain, Placement.from_cache.is_(True)),
        "transfer": {i: [float(v), int(c)] for i, v, c in rates if v is not None},
        "bytes": {identity: int(size) for identity, size in sizes},
    }
