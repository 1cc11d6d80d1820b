"""What the monitor reads from a catalog, in one poll, off the UI thread.

:class:`CatalogSource` opens the catalog read-only (immutable when it is finished or
read-only), and :meth:`CatalogSource.fetch` gathers a :class:`Snapshot` with a fresh
session. Nothing here writes, and nothing here touches Textual.
"""

from __future__ import annotations

import bisect
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from snakemake_executor_context.catalog import queries

__all__ = ["WINDOWS", "CatalogProblem", "CatalogSource", "Snapshot"]

#: Throughput windows the monitor offers (label, seconds; 0 = the whole history).
WINDOWS: tuple[tuple[str, float], ...] = (
    ("5 min", 300.0),
    ("15 min", 900.0),
    ("1 h", 3600.0),
    ("all", 0.0),
)
#: Buckets of the throughput charts.
BUCKETS = 40


class CatalogProblem(Exception):
    """The catalog cannot be shown (missing, another schema, empty): a message for the
    screen, never a traceback."""


@dataclass(frozen=True)
class Snapshot:
    """Everything the views show, as read in one poll."""

    fetched_at: float
    query_seconds: float
    fleet: list[queries.FleetRow]
    servers: list[queries.ServerRow]
    placements: list[queries.PlacementRow]
    contexts: list[queries.ContextRow]
    timeline: list[queries.TimelineRow]
    loss_totals: queries.LossTotals
    series: list[queries.Series]
    window: str
    throughput: list[queries.ThroughputRow]
    runs: list[queries.RunRow]
    progress: queries.Progress | None
    counts: queries.Counts
    recent_jobs: list[queries.JobRow] = field(default_factory=list)

    def server(self, address: str) -> queries.ServerRow | None:
        """A live server by address."""
        return next((s for s in self.servers if s.address == address), None)


class AttemptTotals:
    """What the views sum over job attempts, kept up to date incrementally.

    Each poll reads only the attempts that are new (id above the last one seen) or that
    were still unfinished at the last poll, so a read costs the same with 100,000 jobs
    in the catalog as with 100.
    """

    def __init__(self) -> None:
        self.watermark = 0
        #: Unfinished attempts: id -> (server id, started or None).
        self.pending: dict[int, tuple[int | None, float | None]] = {}
        #: server id -> (ok, failed, items) over finished attempts.
        self.done: dict[int, tuple[int, int, int]] = {}
        #: (server id, context id) -> jobs that found the context warm there.
        self.warm: dict[tuple[int | None, int | None], int] = {}
        #: (context id, server id) -> (jobs, job seconds, items) of successful attempts.
        self.totals: dict[tuple[int | None, int | None], tuple[int, float, int]] = {}
        #: run pk -> sorted finish times of its successful attempts.
        self.finished: dict[int | None, list[float]] = {}

    def update(self, session: Any) -> None:
        """Fold in what changed since the last call."""
        from sqlalchemy import or_, select

        from snakemake_executor_context.catalog.models import Attempt, Job

        condition = Attempt.id > self.watermark
        if self.pending:
            condition = or_(condition, Attempt.id.in_(list(self.pending)))
        rows = session.execute(
            select(
                Attempt.id,
                Attempt.server_id,
                Attempt.outcome,
                Attempt.items,
                Attempt.started,
                Attempt.finished,
                Attempt.load_seconds,
                Attempt.cold,
                Job.context_id,
                Job.run_pk,
            )
            .outerjoin(Job, Attempt.job_id == Job.id)
            .where(condition)
        ).all()
        for attempt, server, outcome, items, started, finished, load, cold, context, run in rows:
            self.watermark = max(self.watermark, attempt)
            if outcome is None:
                self.pending[attempt] = (server, started if finished is None else None)
                continue
            self.pending.pop(attempt, None)
            if finished is None:
                continue
            ok, failed, total_items = self.done.get(server, (0, 0, 0))
            self.done[server] = (
                ok + (outcome == "ok"),
                failed + (outcome == "failed"),
                total_items + int(items or 0),
            )
            if outcome != "ok":
                continue
            if not cold and context is not None:
                self.warm[(server, context)] = self.warm.get((server, context), 0) + 1
            if started is not None and context is not None:
                jobs, seconds, done_items = self.totals.get((context, server), (0, 0.0, 0))
                self.totals[(context, server)] = (
                    jobs + 1,
                    seconds + max(0.0, finished - started - (load or 0.0)),
                    done_items + int(items or 0),
                )
            bisect.insort(self.finished.setdefault(run, []), finished)

    def busy(self) -> dict[int | None, int]:
        """Running attempts per server."""
        out: dict[int | None, int] = {}
        for server, started in self.pending.values():
            if started is not None:
                out[server] = out.get(server, 0) + 1
        return out

    def recent(self, run: int | None, since: float) -> int:
        """Successful attempts of a run finished since ``since``."""
        times = self.finished.get(run, [])
        return len(times) - bisect.bisect_left(times, since)


class CatalogSource:
    """A catalog opened for reading: by path or SQLAlchemy URL."""

    def __init__(self, spec: str | os.PathLike[str], clock: Callable[[], float] = time.time):
        self.spec = os.fspath(spec)
        self.clock = clock
        self.immutable = False
        self._store: Any = None
        self.attempts = AttemptTotals()

    @property
    def description(self) -> str:
        """The catalog as the user named it, and how it is open."""
        return self.spec + (" (immutable)" if self.immutable else "")

    def open(self) -> None:
        """Open the catalog; :class:`CatalogProblem` with a clear message if it cannot."""
        from snakemake_executor_context.catalog.store import (
            CatalogError,
            CatalogSchemaError,
            open_reader,
        )

        path = None if "://" in self.spec else Path(self.spec)
        if path is not None and not path.exists():
            raise CatalogProblem(
                f"No catalog at {path}.\n\nA run with `--executor context` writes one to "
                ".snakemake/context/catalog.db in its workflow directory, and "
                "`snakemake-context up` beside its scheduler file. Start the monitor "
                "there, or name one: snakemake-context monitor --catalog PATH|URL"
            )
        immutable = path is not None and self._finished_or_read_only(path)
        try:
            if immutable:
                assert path is not None
                self._store = _open_immutable(path)
            else:
                self._store = open_reader(self.spec)
        except CatalogSchemaError as error:
            raise CatalogProblem(f"This catalog has another schema version.\n\n{error}") from None
        except CatalogError as error:
            message = str(error)
            if "is empty" in message:
                raise CatalogProblem(
                    f"The catalog {self.spec} is empty: no run has written to it yet.\n\n"
                    "Start a run with `--executor context`; the monitor shows it live."
                ) from None
            raise CatalogProblem(message) from None
        self.immutable = immutable

    def close(self) -> None:
        """Release the database."""
        if self._store is not None:
            self._store.close()
            self._store = None

    def fetch(self, window: str = "15 min", limit: int = 200) -> Snapshot:
        """Read everything the views show, with a fresh session."""
        from snakemake_executor_context.catalog.store import CatalogError

        if self._store is None:
            self.open()
        elif self.immutable and self._writer_appeared():
            self.close()
            self.open()
            self.attempts = AttemptTotals()
        started = time.perf_counter()
        now = self.clock()
        seconds = dict(WINDOWS)[window]
        try:
            with self._store.session() as session:
                counts = queries.counts(session)
                if counts.runs == 0 and counts.servers == 0:
                    raise CatalogProblem(
                        f"The catalog {self.spec} is empty: no run has written to it yet."
                        "\n\nStart a run with `--executor context`; the monitor shows it live."
                    )
                since = now - seconds if seconds else _first_finish(session, now)
                timeline, totals = queries.timeline(session, limit)
                attempts = self.attempts
                attempts.update(session)
                snapshot = Snapshot(
                    fetched_at=now,
                    query_seconds=0.0,
                    fleet=queries.fleet(session),
                    servers=queries.server_rows(session, done=attempts.done, busy=attempts.busy()),
                    placements=queries.placement_rows(session, warm=attempts.warm),
                    contexts=queries.contexts(session),
                    timeline=timeline,
                    loss_totals=totals,
                    series=queries.throughput_series(
                        session, since=since, until=now, buckets=BUCKETS
                    ),
                    window=window,
                    throughput=queries.throughput_from_totals(session, attempts.totals),
                    runs=queries.runs(session, 10, now),
                    progress=queries.progress(session, now, recent_count=attempts.recent),
                    counts=counts,
                    recent_jobs=queries.recent_jobs(session, 30),
                )
        except CatalogProblem:
            raise
        except CatalogError as error:
            raise CatalogProblem(str(error)) from None
        except Exception as error:  # a database error while a writer works: retry next poll
            raise CatalogProblem(
                f"Reading {self.spec} failed: {type(error).__name__}: {error}"
            ) from None
        return _with_timing(snapshot, time.perf_counter() - started)

    def _finished_or_read_only(self, path: Path) -> bool:
        """No writer and no -wal file (finished), or no write access (read-only)."""
        wal = path.with_name(path.name + "-wal")
        if not os.access(path, os.W_OK) or not os.access(path.parent, os.W_OK):
            return True
        return not wal.exists()

    def _writer_appeared(self) -> bool:
        path = Path(self.spec)
        return path.with_name(path.name + "-wal").exists() and os.access(path.parent, os.W_OK)


def _open_immutable(path: Path) -> Any:
    """A SQLite file that nobody writes: immutable reads take no locks and need no
    write access (a catalog on a read-only filesystem, or a finished run's)."""
    from sqlalchemy import create_engine

    from snakemake_executor_context.catalog.store import (
        CatalogStore,
        check_schema,
        resolve_location,
    )

    engine = create_engine(f"sqlite:///file:{path.resolve()}?immutable=1&uri=true")
    store = CatalogStore(resolve_location(str(path)), engine)
    check_schema(store, create=False)
    return store


def _first_finish(session: Any, now: float) -> float:
    from sqlalchemy import func, select

    from snakemake_executor_context.catalog.models import Attempt

    first = session.scalar(select(func.min(Attempt.finished)))
    return float(first) if first is not None and first < now else now - 60.0


def _with_timing(snapshot: Snapshot, seconds: float) -> Snapshot:
    from dataclasses import replace

    return replace(snapshot, query_seconds=seconds)
