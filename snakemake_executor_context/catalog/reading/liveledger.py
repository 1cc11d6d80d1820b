"""The ledger of the latest run, live, for the monitor: each poll accounts again only
the servers something happened to, and moves the others' clocks on.

Between two records about a server nothing about it changes (every change of what it
does is a record: an attempt's start or end, a load, an eviction, a drain, its end),
so a server nothing touched since the last poll stays in the bucket its account ended
in; :class:`LiveLedger` adds the time since to that bucket. A server is accounted
again, from the catalog (:func:`~.ledger.read_ledger` over it alone), when one of its
attempts is new or changed, or a fleet event names it. A poll in which nothing
happened is three indexed queries that return nothing, and a loop over the live
servers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from ...fleet.accounting import Segment
from ...fleet.buckets import Bucket
from ..models import Attempt, EventRecord, Run, Server
from .ledger import Window, read_ledger
from .reportdata import pool_books

__all__ = ["Bucket", "LedgerSums", "LiveLedger"]


@dataclass(frozen=True)
class LedgerSums:
    """GPU-seconds per bucket, by GPU model and by context, over ``window``."""

    window: Window
    by_model: dict[str, dict[Bucket, float]] = field(default_factory=dict)
    by_context: dict[str, dict[Bucket, float]] = field(default_factory=dict)
    servers: int = 0
    #: The pool's books over the window (:func:`~.reportdata.pool_books`; None:
    #: no pilot).
    pool: dict[str, Any] | None = None

    def totals(self) -> dict[Bucket, float]:
        """GPU-seconds per bucket, in the buckets' order."""
        sums: dict[Bucket, float] = {}
        for row in self.by_model.values():
            for bucket, seconds in row.items():
                sums[bucket] = sums.get(bucket, 0.0) + seconds
        return {b: sums[b] for b in Bucket if b in sums}


@dataclass
class _Server:
    model: str
    gpus: int
    #: Its segments over [window start, ``until``], in time order.
    segments: list[Segment]
    #: GPU-seconds by (bucket, context), up to ``until`` (and on, for a live server).
    sums: dict[tuple[Bucket, str], float]
    until: float
    #: The bucket (and context) it is in at ``until``; None: it has left.
    tail: tuple[Bucket, str] | None
    #: When it first loaded or ran something (None: not yet).
    active: float | None


#: Buckets of a server that has not done anything yet.
_BEFORE = (Bucket.STARTING, Bucket.ALLOCATED_BEFORE)


class LiveLedger:
    """See the module. Call :meth:`read` each poll, with a fresh session."""

    def __init__(self) -> None:
        self.window: Window | None = None
        self._servers: dict[int, _Server] = {}
        self._high = {"attempt": 0, "event": 0, "server": 0}
        #: Unfinished attempts: id -> (server id, started) as last read.
        self._pending: dict[int, tuple[int | None, float | None]] = {}
        #: GPU-seconds by (GPU model, bucket, context), kept up to date.
        self._totals: dict[tuple[str, Bucket, str], float] = {}

    def read(self, session: Session, now: float) -> LedgerSums | None:
        """The latest run's ledger as of ``now`` (None: no run yet)."""
        window = self._window(session, now)
        if window is None:
            return None
        if self.window is None or window.start != self.window.start:
            self._servers.clear()
            self._totals.clear()
            self._high = {"attempt": 0, "event": 0, "server": 0}
            self._pending.clear()
        first = not self._servers
        self.window = window
        touched = self._touched(session, window.start)
        if first:
            self._account(session, window, None, window.start)
        elif touched:
            # Everything before the earliest change (or the last account) stands.
            since = min(
                min(at, self._servers[s].until if s in self._servers else window.start)
                for s, at in touched.items()
            )
            self._account(session, window, set(touched), max(window.start, since))
        totals = self._totals
        for server in self._servers.values():
            if server.tail is not None and window.end > server.until:
                step = (window.end - server.until) * server.gpus
                server.sums[server.tail] = server.sums.get(server.tail, 0.0) + step
                key = (server.model, *server.tail)
                totals[key] = totals.get(key, 0.0) + step
                server.until = window.end
        return self._sums(window, pool_books(session, window))

    def _account(
        self, session: Session, window: Window, only: set[int] | None, since: float
    ) -> None:
        """Account ``only`` (None: every server) again from ``since`` on: what a server
        had before ``since`` stands, what came after is taken off and accounted anew."""
        stretch = Window(since, window.end, window.run, window.live)
        active = {i: s.active for i, s in self._servers.items() if s.active is not None}
        ledger = read_ledger(session, stretch, only, active if only is not None else None)
        totals = self._totals
        for account in ledger.servers:
            before = self._servers.get(account.id) if only else None
            gpus = account.gpus
            if before is not None:
                segments, sums = before.segments, before.sums
                _add(totals, before.model, sums, -1.0)
                end = segments[-1].end if segments else before.until
                if before.tail is not None and before.until > end:
                    # The clock moved on in its last bucket since its segments end.
                    sums[before.tail] -= (before.until - end) * gpus
                cut = []
                while segments and segments[-1].end > since:
                    s = segments.pop()
                    kept = 0.0
                    if s.start < since:
                        kept = s.seconds * (since - s.start) / (s.end - s.start)
                        cut.append(s._replace(end=since, seconds=kept))
                    sums[(s.bucket, s.context)] -= (s.seconds - kept) * gpus
                segments.extend(reversed(cut))
            else:
                segments, sums = [], {}
            new = sorted(account.segments, key=lambda s: s.end)
            for s in new:
                key = (s.bucket, s.context)
                sums[key] = sums.get(key, 0.0) + s.seconds * gpus
            segments.extend(new)
            _add(totals, account.gpu_model, sums, 1.0)
            last = new[-1] if new else None
            alive = last is not None and last.end >= window.end - 1e-6 and window.live
            did = before.active if before is not None and before.active is not None else None
            if did is None:
                did = next((s.start for s in segments if s.bucket not in _BEFORE), None)
            self._servers[account.id] = _Server(
                account.gpu_model,
                gpus,
                segments,
                sums,
                window.end,
                (last.bucket, last.context) if alive and last is not None else None,
                did,
            )

    def _window(self, session: Session, now: float) -> Window | None:
        found = session.execute(
            select(Run.run_id, Run.started, Run.finished).order_by(Run.started.desc()).limit(1)
        ).first()
        if found is None:
            return None
        end = found.finished if found.finished is not None else now
        return Window(found.started, max(found.started, end), found.run_id, found.finished is None)

    def _touched(self, session: Session, start: float) -> dict[int, float]:
        """Servers new, named by a new fleet event, or whose attempts are new or changed,
        each with the earliest time a change concerns."""
        high = self._high
        touched: dict[int, float] = {}

        def touch(server_id: int | None, at: float | None) -> None:
            if server_id is not None:
                at = start if at is None else at
                touched[server_id] = min(at, touched.get(server_id, at))

        connection = session.connection()
        attempts = connection.execute(
            select(
                Attempt.id,
                Attempt.server_id,
                Attempt.outcome,
                Attempt.started,
                Attempt.dispatched,
            ).where(or_(Attempt.id > high["attempt"], Attempt.id.in_(list(self._pending))))
        ).all()
        for attempt_id, server_id, outcome, started, dispatched in attempts:
            high["attempt"] = max(high["attempt"], attempt_id)
            before = self._pending.pop(attempt_id, None)
            if outcome is None:
                self._pending[attempt_id] = (server_id, started)
                if before == (server_id, started):
                    continue  # still running, as at the last poll
            touch(server_id, started if started is not None else dispatched)
        for event_id, server_id, at in connection.execute(
            select(EventRecord.id, EventRecord.server_id, EventRecord.at).where(
                EventRecord.id > high["event"]
            )
        ):
            high["event"] = max(high["event"], event_id)
            touch(server_id, at)
        for (server_id,) in connection.execute(select(Server.id).where(Server.id > high["server"])):
            high["server"] = max(high["server"], server_id)
            touch(server_id, start)
        return touched

    def _sums(self, window: Window, pool: dict[str, Any] | None) -> LedgerSums:
        by_model: dict[str, dict[Bucket, float]] = {}
        by_context: dict[str, dict[Bucket, float]] = {}
        for (model, bucket, context), seconds in self._totals.items():
            if abs(seconds) < 1e-9:
                continue
            row = by_model.setdefault(model, {})
            row[bucket] = row.get(bucket, 0.0) + seconds
            row = by_context.setdefault(context, {})
            row[bucket] = row.get(bucket, 0.0) + seconds
        return LedgerSums(
            window,
            dict(sorted(by_model.items())),
            dict(sorted(by_context.items())),
            len(self._servers),
            pool,
        )


def _add(
    totals: dict[tuple[str, Bucket, str], float],
    model: str,
    sums: dict[tuple[Bucket, str], float],
    sign: float,
) -> None:
    """Add (or take off) a server's sums to the fleet's, by GPU model."""
    for (bucket, context), seconds in sums.items():
        key = (model, bucket, context)
        totals[key] = totals.get(key, 0.0) + sign * seconds
