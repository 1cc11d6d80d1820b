"""The terminal monitor's reader: every query it runs, each proportional to what changed.

:class:`MonitorReader` keeps a mirror of the rows the monitor shows (servers,
placements, contexts, losses) and running totals over job attempts. Each
:meth:`MonitorReader.read` asks only for rows that are new since the previous read (ids
are watermarks) or that may have changed: attempts not finished yet, and the servers
(with their placements) that fleet events recorded since then name. Every change the
recorder makes to a server or a placement notes such an event, except a server's
description, so a server not described yet is read again until it is. A read in which
nothing changed is a handful of indexed queries that return nothing, whatever the
catalog's size. The servers' ended lives, from which the monitor estimates how long
each live server will live (:mod:`.lives`), are read again only when a server ended.
The monitor derives what its views show from the mirror.

With several writers (PostgreSQL), a transaction may commit a lower id after a higher
one was read: such gaps below a watermark are asked for again for a while.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from sqlalchemy import ColumnElement, Row, create_engine, func, or_, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from ..models import Attempt, Context, EventRecord, Job, Placement, Run, Server, ServerLoss
from ..store import CatalogStore, check_schema, resolve_location
from .fleetseed import survival_history
from .status import JobRow, RunRow, recent_jobs, runs

__all__ = [
    "ContextRecord",
    "Finishes",
    "LossRecord",
    "MonitorReader",
    "PlacementRecord",
    "ReadResult",
    "ServerRecord",
    "open_immutable",
]

R = TypeVar("R", "ServerRecord", "PlacementRecord", "ContextRecord")

#: Reads for which a gap below a watermark is asked for again.
GAP_READS = 40
#: How far below the newest id read a gap is looked for.
GAP_SPAN = 1000


class ServerRecord(NamedTuple):
    """A server as the catalog holds it (live while ``left`` is None)."""

    id: int
    address: str
    name: str
    host: str
    gpu_model: str
    gpu_name: str | None
    gpu_memory_bytes: int | None
    compute_capability: str | None
    slots: int
    joined: float
    left: float | None
    left_reason: str | None
    pid: int | None
    #: Where its survival is counted (:meth:`.lives.LiveServer.of`).
    group_label: str | None = None
    partition: str | None = None
    pool: str | None = None


class PlacementRecord(NamedTuple):
    """A context on a server, from its load to its end."""

    id: int
    server_id: int
    context_id: int
    state: str
    load_seconds: float | None
    from_cache: bool | None
    conversions: int | None
    peer_seconds: float | None
    #: Ranks of a gang (a context spanning several processes); None: one process.
    ranks: int | None


class ContextRecord(NamedTuple):
    """A context by identity."""

    id: int
    identity: str
    name: str
    loader: str
    arguments: str
    bytes: int | None


class LossRecord(NamedTuple):
    """A server lost with jobs running, and those jobs ("rule (key)")."""

    id: int
    server_id: int
    at: float
    reason: str
    jobs_lost: int
    seconds_lost: float
    jobs: tuple[str, ...]


@dataclass(frozen=True)
class ReadResult:
    """What one :meth:`MonitorReader.read` found."""

    #: Servers, placements, contexts and losses new or changed.
    fleet_changed: int
    #: Attempts new or changed (started, finished), and jobs new.
    jobs_changed: int
    #: Attempts that finished since the previous read.
    finished: int
    #: Servers whose attempts changed (running, done), and (server, context) pairs
    #: whose warm jobs changed, when only attempts changed.
    servers: frozenset[int | None] = frozenset()
    pairs: frozenset[tuple[int | None, int | None]] = frozenset()

    @property
    def changed(self) -> int:
        """Rows new or changed since the previous read (0: nothing changed)."""
        return self.fleet_changed + self.jobs_changed


class Finishes:
    """Finish times (sorted) and items of successful attempts, for sums over time."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.items: list[int] = []
        self._sums = [0]  # items before each position
        self._stale = 0  # the first position whose sum is out of date

    def add(self, at: float, items: int) -> None:
        """One more finished attempt (nearly always at or near the end)."""
        position = bisect.bisect_right(self.times, at)
        self.times.insert(position, at)
        self.items.insert(position, items)
        self._stale = min(self._stale, position)

    def since(self, at: float) -> int:
        """Attempts finished at ``at`` or later."""
        return len(self.times) - bisect.bisect_left(self.times, at)

    def buckets(self, since: float, until: float, count: int) -> tuple[list[int], list[int]]:
        """Attempts and items per bucket of [since, until] cut in ``count`` equal ones."""
        if self._stale < len(self.times):
            del self._sums[self._stale + 1 :]
            tail = accumulate(self.items[self._stale :], initial=self._sums[self._stale])
            self._sums.extend(list(tail)[1:])
            self._stale = len(self.times)
        width = (until - since) / count
        edges = [bisect.bisect_left(self.times, since + k * width) for k in range(count)]
        edges.append(bisect.bisect_right(self.times, until))
        jobs = [edges[k + 1] - edges[k] for k in range(count)]
        items = [self._sums[edges[k + 1]] - self._sums[edges[k]] for k in range(count)]
        return jobs, items


class _Ids:
    """A table's id watermark, and recent gaps below it."""

    def __init__(self) -> None:
        self.high = 0
        self.gaps: dict[int, int] = {}  # id -> reads left

    def new(self, column: InstrumentedAttribute[int]) -> ColumnElement[bool]:
        """Rows above the watermark, or in a gap below it."""
        above = column > self.high
        return or_(above, column.in_(list(self.gaps))) if self.gaps else above

    def saw(self, ids: Iterable[int]) -> None:
        """Move the watermark past the ids read; note the gaps left below it."""
        seen = set(ids)
        for gap in list(self.gaps):
            self.gaps[gap] -= 1
            if gap in seen or self.gaps[gap] <= 0:
                del self.gaps[gap]
        top = max(seen, default=0)
        if top > self.high:
            self.gaps.update(
                (gap, GAP_READS)
                for gap in range(max(self.high + 1, top - GAP_SPAN), top)
                if gap not in seen
            )
            self.high = top


class MonitorReader:
    """The monitor's reader over one catalog: call :meth:`read` with a fresh session
    each poll; the attributes hold the mirror (see the module)."""

    def __init__(self) -> None:
        self.servers: dict[int, ServerRecord] = {}
        self.placements: dict[int, PlacementRecord] = {}
        self.contexts: dict[int, ContextRecord] = {}
        self.losses: dict[int, LossRecord] = {}
        #: Unfinished attempts: id -> (server id, started or None).
        self.pending: dict[int, tuple[int | None, float | None]] = {}
        #: server id -> (ok, failed, items) over finished attempts.
        self.done: dict[int | None, tuple[int, int, int]] = {}
        #: server id -> seconds its finished attempts ran (loads included), and when
        #: the last of them ended.
        self.busy_seconds: dict[int | None, float] = {}
        self.last_end: dict[int | None, float] = {}
        #: (server id, context id) -> successful attempts that found the context warm.
        self.warm: dict[tuple[int | None, int | None], int] = {}
        #: (context id, server id) -> (jobs, job seconds, items) of successful attempts.
        self.totals: dict[tuple[int | None, int | None], tuple[int, float, int]] = {}
        #: Successful attempts by run pk, by server id, and by their server's GPU model.
        self.by_run: dict[int | None, Finishes] = {}
        self.by_server: dict[int, Finishes] = {}
        self.by_model: dict[str, Finishes] = {}
        #: The earliest finish of any attempt.
        self.first_finish: float | None = None
        #: Rows per table (exact with one writer).
        self.rows = {"runs": 0, "attempts": 0, "jobs": 0, "events": 0}
        #: The latest runs, newest first, and the pk of each.
        self.runs: list[RunRow] = []
        self.run_pks: dict[str, int] = {}
        #: The latest job attempts, newest first (read again when attempts changed).
        self.recent_jobs: list[JobRow] = []
        #: The servers' ended lives (:func:`~.fleetseed.survival_history`), read again when
        #: a server has ended since.
        self.survival: dict[str, Any] = {}
        self._survival_read = False
        self._servers_touched: set[int | None] = set()
        self._pairs_touched: set[tuple[int | None, int | None]] = set()
        self._ids = {name: _Ids() for name in ("server", "placement", "context", "loss")}
        self._ids |= {name: _Ids() for name in ("event", "attempt", "job")}

    def read(self, session: Session, *, now: float, recent: int = 30) -> ReadResult:
        """Fold in what changed since the previous read; the runs (and which are
        stale) as of ``now``; the latest ``recent`` attempts when attempts changed."""
        fleet_changed = self._read_fleet(session)
        finished, attempts_changed = self._read_attempts(session)
        new_jobs = session.scalars(select(Job.id).where(self._ids["job"].new(Job.id))).all()
        self._ids["job"].saw(new_jobs)
        self.rows["jobs"] += len(new_jobs)
        self.rows["runs"] = int(session.scalar(select(func.count()).select_from(Run)) or 0)
        self.runs = runs(session, 10, now)
        self.run_pks = {
            run_id: pk
            for run_id, pk in session.execute(
                select(Run.run_id, Run.id).where(Run.run_id.in_([r.run_id for r in self.runs]))
            )
        }
        if attempts_changed or new_jobs or not self.recent_jobs:
            self.recent_jobs = recent_jobs(session, recent)
        changed = attempts_changed + len(new_jobs)
        servers, pairs = frozenset(self._servers_touched), frozenset(self._pairs_touched)
        return ReadResult(fleet_changed, changed, finished, servers, pairs)

    def _read_fleet(self, session: Session) -> int:
        """Servers, placements, contexts and losses new or changed: how many."""
        ids = self._ids
        events = session.execute(
            select(EventRecord.id, EventRecord.server_id).where(ids["event"].new(EventRecord.id))
        ).all()
        ids["event"].saw(event_id for event_id, _ in events)
        self.rows["events"] += len(events)
        touched = {server for _, server in events if server is not None}
        undescribed = {s.id for s in self.servers.values() if s.pid is None and s.left is None}
        again = touched | undescribed
        servers = session.execute(
            select(*_columns(Server, ServerRecord)).where(
                or_(ids["server"].new(Server.id), Server.id.in_(again))
            )
        ).all()
        placements = session.execute(
            select(*_columns(Placement, PlacementRecord)).where(
                or_(ids["placement"].new(Placement.id), Placement.server_id.in_(touched))
            )
        ).all()
        used = {row.context_id for row in placements}
        contexts = session.execute(
            select(*_columns(Context, ContextRecord)).where(
                or_(ids["context"].new(Context.id), Context.id.in_(used))
            )
        ).all()
        changed = 0
        ended = any(
            row.left is not None and getattr(self.servers.get(row.id), "left", None) is None
            for row in servers
        )
        if ended or not self._survival_read:
            self.survival = survival_history(session)
            self._survival_read = True
        remodel = any(
            row.id in self.by_server and self.servers[row.id].gpu_model != row.gpu_model
            for row in servers
        )
        changed += _fold(ids["server"], self.servers, ServerRecord, servers)
        changed += _fold(ids["placement"], self.placements, PlacementRecord, placements)
        changed += _fold(ids["context"], self.contexts, ContextRecord, contexts)
        if remodel:  # described after it ran jobs: sort them by GPU model again
            self.by_model = {}
            for server, finishes in self.by_server.items():
                into = self.by_model.setdefault(self.servers[server].gpu_model, Finishes())
                for at, items in zip(finishes.times, finishes.items, strict=True):
                    into.add(at, items)
        return changed + self._read_losses(session)

    def _read_losses(self, session: Session) -> int:
        losses = session.execute(
            select(*_columns(ServerLoss, LossRecord)).where(self._ids["loss"].new(ServerLoss.id))
        ).all()
        self._ids["loss"].saw(loss.id for loss in losses)
        if not losses:
            return 0
        hits: dict[int, list[str]] = {}
        for loss_id, key, rule in session.execute(
            select(Attempt.loss_id, Attempt.key, Job.rule)
            .outerjoin(Job, Attempt.job_id == Job.id)
            .where(Attempt.loss_id.in_([loss.id for loss in losses]))
            .order_by(Attempt.id)
        ):
            hits.setdefault(loss_id, []).append(f"{rule or '?'} ({key})")
        for loss in losses:
            self.losses[loss.id] = LossRecord._make((*loss, tuple(hits.get(loss.id, ()))))
        return len(losses)

    def _read_attempts(self, session: Session) -> tuple[int, int]:
        """Fold in the attempts new or unfinished at the previous read: how many
        finished since, and how many rows changed."""
        condition = self._ids["attempt"].new(Attempt.id)
        if self.pending:
            condition = or_(condition, Attempt.id.in_(list(self.pending)))
        rows = session.execute(
            select(*_ATTEMPT_COLUMNS, Job.context_id, Job.run_pk)
            .outerjoin(Job, Attempt.job_id == Job.id)
            .where(condition)
        ).all()
        self._ids["attempt"].saw(row.id for row in rows)
        finished = changed = 0
        touched, pairs = self._servers_touched, self._pairs_touched
        touched.clear()
        pairs.clear()
        for attempt, server, outcome, items, started, end, load, cold, context, run in rows:
            before = self.pending.pop(attempt, None)
            self.rows["attempts"] += before is None  # pending ones were counted already
            if outcome is None:
                self.pending[attempt] = (server, started if end is None else None)
                if self.pending[attempt] != before:
                    changed += 1
                    touched.update((server, before[0] if before else server))
                continue
            changed += 1
            touched.update((server, before[0] if before else server))
            if end is None:
                continue
            finished += 1
            self.first_finish = end if self.first_finish is None else min(self.first_finish, end)
            ok, failed, all_items = self.done.get(server, (0, 0, 0))
            failed += outcome == "failed"
            self.done[server] = (ok + (outcome == "ok"), failed, all_items + int(items or 0))
            if started is not None:
                self.busy_seconds[server] = self.busy_seconds.get(server, 0.0) + max(
                    0.0, end - started
                )
            self.last_end[server] = max(end, self.last_end.get(server, end))
            if outcome != "ok":
                continue
            if not cold and context is not None:
                self.warm[(server, context)] = self.warm.get((server, context), 0) + 1
                pairs.add((server, context))
            if started is not None and context is not None:
                jobs, seconds, ok_items = self.totals.get((context, server), (0, 0.0, 0))
                seconds += max(0.0, end - started - (load or 0.0))
                self.totals[(context, server)] = (jobs + 1, seconds, ok_items + int(items or 0))
            self.by_run.setdefault(run, Finishes()).add(end, int(items or 0))
            if server is not None:
                self.by_server.setdefault(server, Finishes()).add(end, int(items or 0))
                model = self.servers[server].gpu_model if server in self.servers else "cpu"
                self.by_model.setdefault(model, Finishes()).add(end, int(items or 0))
        return finished, changed


def open_immutable(path: Path) -> CatalogStore:
    """Open a SQLite catalog that nobody writes (a finished run's, or one on a read-only
    filesystem): immutable reads take no locks and need no write access."""
    engine = create_engine(f"sqlite:///file:{path.resolve()}?immutable=1&uri=true")
    store = CatalogStore(resolve_location(str(path)), engine)
    check_schema(store, create=False)
    return store


def _fold(ids: _Ids, mirror: dict[int, R], record: type[R], rows: Sequence[Row[Any]]) -> int:
    """Put rows read into a mirror: how many were new or changed."""
    ids.saw(row.id for row in rows)
    changed = 0
    for row in rows:
        new = record._make(row)
        changed += mirror.get(row.id) != new
        mirror[row.id] = new
    return changed


def _columns(model: Any, record: type[NamedTuple]) -> list[InstrumentedAttribute[Any]]:
    """The model's columns a record holds, in its order."""
    return [getattr(model, name) for name in record._fields if name != "jobs"]


_ATTEMPT_COLUMNS: list[InstrumentedAttribute[Any]] = [Attempt.id, Attempt.server_id]
_ATTEMPT_COLUMNS += [Attempt.outcome, Attempt.items, Attempt.started, Attempt.finished]
_ATTEMPT_COLUMNS += [Attempt.load_seconds, Attempt.cold]
