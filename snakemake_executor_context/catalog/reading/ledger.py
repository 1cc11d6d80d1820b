"""The ledger from the catalog: where every GPU-second of a run, or of a time window,
went (``snakemake-context report``, its CSV and JSON export, the monitor's view).

:func:`read_ledger` reads, for the servers alive in the window, their attempts,
loads, contexts held, drains and pilots' batch allocations, and accounts each server
with :func:`~...fleet.accounting.account` (every second in one bucket,
:class:`~...fleet.buckets.Bucket`). :class:`Ledger` sums the segments by server, GPU
model, context, rule and run; :data:`EXPORT_COLUMNS` are the export's columns. The
report adds, per survival group, how long the window's servers lived against what
the history before it predicted (:func:`.lives.group_lives`).
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from ...errors import ContextExecutorError
from ...fleet.accounting import (
    Load,
    RunSpan,
    Segment,
    ServerLife,
    Warm,
    Work,
    account,
    life_seconds,
    load_stretches,
)
from ...fleet.buckets import BUCKET_HELP, Bucket
from ...fleet.loads import load_parts
from ..models import Attempt, Context, Job, Pilot, Placement, Run, Server
from .lives import GroupLives

__all__ = [
    "EXPORT_COLUMNS",
    "Ledger",
    "ServerAccount",
    "Window",
    "export_csv",
    "export_json",
    "read_ledger",
    "window_of",
]

#: The export's columns (CSV header, JSON keys), with what each holds.
EXPORT_COLUMNS: dict[str, str] = {
    "run": "the run the seconds belong to (empty: between runs of a persistent cluster)",
    "server": "the server's name (a server restarted under its name: name#2, #3...)",
    "host": "the host it ran on",
    "gpu_model": "its GPU model, normalised ('cpu': a CPU server, one stand-in GPU)",
    "gpus": "its GPUs",
    "bucket": "where the seconds went (see the buckets)",
    "rule": "the rule whose job it was (running, failed, lost, loading; empty otherwise)",
    "context": "the context loaded or used (empty: none)",
    "seconds": "server-seconds, to the millisecond",
    "gpu_seconds": "seconds times the server's GPUs",
}


@dataclass(frozen=True)
class Window:
    """The span a ledger covers, and the run it is of (None: a time window)."""

    start: float
    end: float
    run: str | None = None
    #: The run is still going (the ledger is live).
    live: bool = False


@dataclass
class ServerAccount:
    """One server's segments in the window."""

    id: int
    name: str
    host: str
    gpu_model: str
    gpus: int
    life: float
    segments: list[Segment]
    pilot: bool = False

    def seconds(self) -> dict[Bucket, float]:
        """Server-seconds per bucket."""
        out: dict[Bucket, float] = {}
        for s in self.segments:
            out[s.bucket] = out.get(s.bucket, 0.0) + s.seconds
        return out


@dataclass
class Ledger:
    """Every server's account in a window, and its sums."""

    window: Window
    servers: list[ServerAccount] = field(default_factory=list)
    #: Per survival group, the window's servers' lives against the prediction (the
    #: report's: :func:`.lives.group_lives`; empty where nobody asked).
    lives: list[GroupLives] = field(default_factory=list)

    def rows(self) -> Iterator[dict[str, Any]]:
        """The export's rows: one per server x bucket x rule (and context and run)."""
        for server in self.servers:
            sums: dict[tuple[str, Bucket, str, str], float] = {}
            for s in server.segments:
                key = (s.run, s.bucket, s.rule, s.context)
                sums[key] = sums.get(key, 0.0) + s.seconds
            for (run, bucket, rule, context), seconds in sorted(sums.items()):
                yield {
                    "run": run,
                    "server": server.name,
                    "host": server.host,
                    "gpu_model": server.gpu_model,
                    "gpus": server.gpus,
                    "bucket": bucket.value,
                    "rule": rule,
                    "context": context,
                    "seconds": round(seconds, 3),
                    "gpu_seconds": round(seconds * server.gpus, 3),
                }

    def by(self, what: str) -> dict[str, dict[Bucket, float]]:
        """GPU-seconds per bucket by ``server``, ``gpu_model``, ``context``, ``rule`` or
        ``run``."""
        out: dict[str, dict[Bucket, float]] = {}
        per_segment = what in ("context", "rule", "run")
        for server in self.servers:
            fixed = {"server": server.name, "gpu_model": server.gpu_model}.get(what, "")
            for s in server.segments:
                key: str = getattr(s, what) if per_segment else fixed
                row = out.setdefault(key, {})
                row[s.bucket] = row.get(s.bucket, 0.0) + s.seconds * server.gpus
        return dict(sorted(out.items()))

    def totals(self) -> dict[Bucket, float]:
        """GPU-seconds per bucket over the whole window, in the buckets' order."""
        sums: dict[Bucket, float] = {}
        for server in self.servers:
            for bucket, seconds in server.seconds().items():
                sums[bucket] = sums.get(bucket, 0.0) + seconds * server.gpus
        return {b: sums[b] for b in Bucket if b in sums}

    def gpu_seconds(self) -> float:
        """All GPU-seconds accounted."""
        return sum(self.totals().values())


def window_of(
    session: Session,
    *,
    run: str | None = None,
    since: float | None = None,
    now: float | None = None,
) -> Window:
    """The window of a run (``run``; the latest one when neither is given), or from
    ``since`` until now. Refused in one line when the run is not in the catalog."""
    now = time.time() if now is None else now
    if since is not None and run is None:
        return Window(since, now)
    query = select(Run.run_id, Run.started, Run.finished, Run.heartbeat)
    query = query.where(Run.run_id == run) if run else query.order_by(Run.started.desc()).limit(1)
    found = session.execute(query).first()
    if found is None:
        raise ContextExecutorError(
            f"No run {run} in this catalog: `snakemake-context status` lists its runs."
            if run
            else "No run in this catalog yet: a run with `--executor context` records one."
        )
    end = found.finished if found.finished is not None else now
    return Window(found.started, max(found.started, end), found.run_id, found.finished is None)


def read_ledger(
    session: Session,
    window: Window,
    only: Collection[int] | None = None,
    active_since: Mapping[int, float] | None = None,
) -> Ledger:
    """Every server alive in the window (``only``: those of these ids), accounted (see
    the module); ``active_since``: when servers first did something, known from before
    the window (a later stretch of their account)."""
    start, end = window.start, window.end
    alive = and_(
        func.coalesce(Server.allocated_at, Server.joined) <= end,
        or_(Server.left.is_(None), Server.left >= start),
    )
    if only is not None:
        alive = and_(alive, Server.id.in_(list(only)))
    lives: dict[int, ServerLife] = {}
    hosts: dict[int, str] = {}
    for row in session.execute(
        select(
            Server.id,
            Server.name,
            Server.address,
            Server.host,
            Server.gpu_model,
            Server.gpus,
            Server.joined,
            Server.left,
            Server.draining_at,
            Server.allocated_at,
        ).where(alive)
    ):
        lives[row.id] = ServerLife(
            name=row.name or row.address,
            joined=row.joined,
            left=row.left,
            gpus=row.gpus or 1,
            gpu_model=row.gpu_model or "cpu",
            draining=row.draining_at,
            allocated=row.allocated_at,
        )
        hosts[row.id] = row.host or ""
    for server_id, since in (active_since or {}).items():
        if server_id in lives:
            lives[server_id].active_since = since
    runs = _runs(session, start, end)
    narrow = None if only is None else list(lives)
    _attempts(session, lives, start, end, {pk: r.run for pk, r in runs.items()}, narrow)
    _placements(session, lives, end, narrow)
    pilots = _pilots(session, lives)
    seen: dict[str, int] = {}
    for _, life in sorted(lives.items(), key=lambda item: (item[1].joined, item[0])):
        # A server restarted under its name (a nanny's restart) is another incarnation.
        seen[life.name] = seen.get(life.name, 0) + 1
        life.name = life.name if seen[life.name] == 1 else f"{life.name}#{seen[life.name]}"
    accounts = [
        ServerAccount(
            id=server_id,
            name=life.name,
            host=hosts[server_id],
            gpu_model=life.gpu_model,
            gpus=life.gpus,
            life=life_seconds(life, start, end),
            segments=account(life, start, end, list(runs.values())),
            pilot=server_id in pilots,
        )
        for server_id, life in sorted(lives.items(), key=lambda item: (item[1].joined, item[0]))
    ]
    return Ledger(window, accounts)


def _runs(session: Session, start: float, end: float) -> dict[int, RunSpan]:
    found = session.execute(
        select(Run.id, Run.run_id, Run.started, Run.finished).where(
            Run.started <= end, or_(Run.finished.is_(None), Run.finished >= start)
        )
    )
    return {pk: RunSpan(run_id, started, finished) for pk, run_id, started, finished in found}


def _attempts(
    session: Session,
    lives: dict[int, ServerLife],
    start: float,
    end: float,
    runs: dict[int, str],
    only: list[int] | None,
) -> None:
    query = (
        select(
            Attempt.server_id,
            Attempt.started,
            Attempt.finished,
            Attempt.outcome,
            Job.rule,
            Job.context_id,
            Job.run_pk,
        )
        .outerjoin(Job, Attempt.job_id == Job.id)
        .where(
            Attempt.started.is_not(None),
            Attempt.started <= end,
            or_(Attempt.finished.is_(None), Attempt.finished >= start),
        )
    )
    if only is not None:
        query = query.where(Attempt.server_id.in_(only))
    # An attempt of no length takes no time; Core rows (no ORM) for 100,000 of them.
    query = query.where(or_(Attempt.finished.is_(None), Attempt.finished > Attempt.started))
    # A group that ended with a result is its members' time (each recorded as a job);
    # one lost with its server recorded no member: its own time is the loss.
    query = query.where(
        or_(Job.kind.is_(None), Job.kind != "group", Attempt.outcome.not_in(("ok", "failed")))
    )
    names: dict[int | None, str] = {pk: name for pk, name in runs.items()}
    contexts: dict[int | None, str] = {None: ""}
    contexts.update(
        (i, n) for i, n in session.connection().execute(select(Context.id, Context.name))
    )
    for (
        server_id,
        started,
        finished,
        outcome,
        rule,
        context,
        run_pk,
    ) in session.connection().execute(query).fetchall():
        life = lives.get(server_id)
        if life is None:
            continue
        if run_pk not in names:
            names[run_pk] = _run_name(session, run_pk)
        if outcome is None and finished is not None:
            outcome = "failed"  # ended without a report: not useful work
        name = contexts.get(context, "")
        life.work.append(Work(started, finished, outcome, rule or "", name or "", names[run_pk]))


def _run_name(session: Session, run_pk: int | None) -> str:
    if run_pk is None:
        return ""
    return str(session.scalar(select(Run.run_id).where(Run.id == run_pk)) or "")


def _placements(
    session: Session, lives: dict[int, ServerLife], end: float, only: list[int] | None
) -> None:
    query = select(
        Placement.server_id,
        Context.name,
        Placement.state,
        Placement.loading_at,
        Placement.ready_at,
        Placement.ended_at,
        Placement.from_cache,
        Placement.conversions,
        Placement.reload_seconds,
        Placement.peer_seconds,
    ).join(Context, Placement.context_id == Context.id)
    query = query.where(Placement.loading_at <= end)
    if only is not None:
        query = query.where(Placement.server_id.in_(only))
    for row in session.execute(query):
        life = lives.get(row.server_id)
        if life is None:
            continue
        name = row.name or ""
        if row.ready_at is None:
            # A load that never finished: lost with its server, failed, or still going.
            lost = row.state == "lost"
            kinds = load_parts(0.0, from_cache=row.from_cache)
            life.loads.append(Load(row.loading_at, row.ended_at, kinds[0][0], name, lost))
            continue
        life.loads += load_stretches(
            row.loading_at,
            max(row.ready_at, row.loading_at),
            name,
            from_cache=row.from_cache,
            conversions=row.conversions,
            reload_seconds=row.reload_seconds,
            peer_seconds=row.peer_seconds,
        )
        life.warm.append(Warm(row.ready_at, row.ended_at, name))


def _pilots(session: Session, lives: dict[int, ServerLife]) -> set[int]:
    """Match each pilot's record to its server (same name, joined after it was
    submitted): a released batch job's end is when the pool saw it gone."""
    by_name: dict[str, list[int]] = {}
    for server_id, life in lives.items():
        by_name.setdefault(life.name, []).append(server_id)
    matched: set[int] = set()
    if not by_name:
        return matched
    rows = session.execute(
        select(Pilot.name, Pilot.submitted, Pilot.ended).order_by(Pilot.submitted)
    ).all()
    for name, submitted, ended in rows:
        for server_id in by_name.get(name, ()):
            life = lives[server_id]
            if life.joined >= submitted and server_id not in matched:
                matched.add(server_id)
                if ended is not None and life.left is not None:
                    life.released = ended
                break
    return matched


def export_csv(rows: Iterable[dict[str, Any]]) -> str:
    """The export as CSV, header first (:data:`EXPORT_COLUMNS`)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(EXPORT_COLUMNS), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def export_json(ledger: Ledger) -> str:
    """The export as JSON: the window, the buckets' meanings, the columns' and the rows,
    and the servers' lives per survival group, predicted against actual."""
    return json.dumps(
        {
            "window": {
                "start": ledger.window.start,
                "end": ledger.window.end,
                "run": ledger.window.run,
            },
            "buckets": {b.value: BUCKET_HELP[b] for b in Bucket},
            "columns": EXPORT_COLUMNS,
            "rows": list(ledger.rows()),
            "lives": [row.to_wire() for row in ledger.lives],
        },
        indent=1,
    )
