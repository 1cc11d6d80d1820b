"""What the monitor reads from a catalog, in one poll, off the UI thread.

:class:`CatalogSource` opens the catalog read-only (immutable when it is finished or
read-only), and :meth:`CatalogSource.fetch` folds in what changed since the previous
poll (the catalog's :class:`~snakemake_executor_context.catalog.reading.monitoring.MonitorReader`,
with a fresh session) and gathers a :class:`Snapshot`. Nothing here writes, and nothing
here touches Textual.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from snakemake_executor_context.catalog.reading.liveledger import LedgerSums, LiveLedger
from snakemake_executor_context.catalog.reading.monitoring import MonitorReader, open_immutable
from snakemake_executor_context.catalog.reading.status import (
    ContextRow,
    Counts,
    FleetRow,
    JobRow,
    RunRow,
    ThroughputRow,
)
from snakemake_executor_context.catalog.store import (
    CatalogError,
    CatalogSchemaError,
    EmptyCatalogError,
    open_reader,
)

from .derive import Derived
from .format import LAST_RUN
from .rows import (
    EndedFleet,
    LossTotals,
    PlacementRow,
    Progress,
    Series,
    ServerRow,
    TimelineRow,
)

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
#: Joins, departures and losses the losses view lists at most.
TIMELINE = 200


class CatalogProblem(Exception):
    """The catalog cannot be shown (missing, another schema, empty): a message for the
    screen, never a traceback."""


@dataclass(frozen=True)
class Snapshot:
    """Everything the views show, as read in one poll. A list that did not change since
    the previous poll is the same object as then."""

    fetched_at: float
    query_seconds: float
    window: str
    counts: Counts
    fleet: list[FleetRow]
    servers: list[ServerRow]
    placements: list[PlacementRow]
    contexts: list[ContextRow]
    timeline: list[TimelineRow]
    loss_totals: LossTotals
    series: list[Series]
    throughput: list[ThroughputRow]
    runs: list[RunRow]
    progress: Progress | None
    recent_jobs: list[JobRow]
    #: Catalog rows new or changed since the previous poll (0: nothing changed).
    changed: int = 0
    #: Job attempts that finished since the previous poll.
    finished: int = 0
    #: The latest run's ledger (where its GPU-seconds went), live.
    ledger: LedgerSums | None = None
    #: The last run's servers, ended, when no run and no server is live (else None):
    #: the fleet view shows them then.
    ended: EndedFleet | None = None

    def server(self, address: str) -> ServerRow | None:
        """A live server by address."""
        return next((s for s in self.servers if s.address == address), None)


class CatalogSource:
    """A catalog opened for reading: by path or SQLAlchemy URL."""

    def __init__(self, spec: str | os.PathLike[str], clock: Callable[[], float] = time.time):
        self.spec = os.fspath(spec)
        self.clock = clock
        self.immutable = False
        self._store: Any = None
        self.reader = MonitorReader()
        self.derived = Derived(self.reader, limit=TIMELINE)
        self.ledger = LiveLedger()

    @property
    def description(self) -> str:
        """The catalog as the user named it, and how it is open."""
        return self.spec + (" (immutable)" if self.immutable else "")

    def open(self) -> None:
        """Open the catalog; :class:`CatalogProblem` with a clear message if it cannot."""
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
                self._store = open_immutable(path)
            else:
                self._store = open_reader(self.spec)
        except CatalogSchemaError as error:
            raise CatalogProblem(f"This catalog has another schema version.\n\n{error}") from None
        except EmptyCatalogError:
            raise CatalogProblem(
                f"The catalog {self.spec} is empty: no run has written to it yet.\n\n"
                "Start a run with `--executor context`; the monitor shows it live."
            ) from None
        except CatalogError as error:
            raise CatalogProblem(str(error)) from None
        self.immutable = immutable
        self.reader = MonitorReader()
        self.ledger = LiveLedger()

    def close(self) -> None:
        """Release the database."""
        if self._store is not None:
            self._store.close()
            self._store = None

    def fetch(self, window: str = "15 min") -> Snapshot:
        """Fold in what changed since the last poll (a fresh session) and gather what
        the views show."""
        if self._store is None:
            self.open()
        elif self.immutable and self._writer_appeared():
            self.close()
            self.open()
        started = time.perf_counter()
        now = self.clock()
        reader = self.reader
        try:
            with self._store.session() as session:
                result = reader.read(session, now=now)
                ledger = self.ledger.read(session, now)
        except CatalogError as error:
            self.reader = MonitorReader()  # a read cut short: start again from scratch
            self.ledger = LiveLedger()
            raise CatalogProblem(str(error)) from None
        except Exception as error:  # a database error while a writer works: retry next poll
            self.reader = MonitorReader()
            self.ledger = LiveLedger()
            raise CatalogProblem(
                f"Reading {self.spec} failed: {type(error).__name__}: {error}"
            ) from None
        if not reader.runs and not reader.servers:
            raise CatalogProblem(
                f"The catalog {self.spec} is empty: no run has written to it yet."
                "\n\nStart a run with `--executor context`; the monitor shows it live."
            )
        if self.derived.reader is not reader:
            self.derived = Derived(reader, limit=TIMELINE)
        derived = self.derived
        derived.update(result, now)
        since, until, label = derived.since(dict(WINDOWS)[window], now), now, window
        last_run = derived.last_run(now)
        if last_run is not None and window != "all":
            # No run is live: the window covers the last run, not the last minutes.
            (since, until), label = last_run, LAST_RUN
        return Snapshot(
            fetched_at=now,
            query_seconds=time.perf_counter() - started,
            window=label,
            counts=Counts(
                runs=reader.rows["runs"],
                servers=len(reader.servers),
                contexts=len(reader.contexts),
                placements=len(reader.placements),
                jobs=reader.rows["jobs"],
                attempts=reader.rows["attempts"],
                losses=len(reader.losses),
                events=reader.rows["events"],
            ),
            fleet=derived.fleet,
            servers=derived.servers,
            placements=derived.placements,
            contexts=derived.contexts,
            timeline=derived.timeline,
            loss_totals=derived.loss_totals,
            series=derived.series(since, until, BUCKETS),
            throughput=derived.throughput,
            runs=reader.runs,
            progress=derived.progress(now),
            recent_jobs=reader.recent_jobs,
            changed=result.changed,
            finished=result.finished,
            ledger=ledger,
            ended=derived.ended(last_run),
        )

    def story(self, key: str) -> str:
        """The story of the job of attempt ``key`` (a fresh session; for the server
        page's selected job), or why there is none."""
        from snakemake_executor_context.catalog.reading.stories import (
            find_job,
            job_story,
            story_text,
        )

        if self._store is None:
            return ""
        try:
            with self._store.session() as session:
                run, job = find_job(session, key)
                return story_text(run, job, job_story(session, job))
        except CatalogError as error:
            return str(error)

    def _finished_or_read_only(self, path: Path) -> bool:
        """No writer and no -wal file (finished), or no write access (read-only)."""
        wal = path.with_name(path.name + "-wal")
        if not os.access(path, os.W_OK) or not os.access(path.parent, os.W_OK):
            return True
        return not wal.exists()

    def _writer_appeared(self) -> bool:
        path = Path(self.spec)
        return path.with_name(path.name + "-wal").exists() and os.access(path.parent, os.W_OK)
