"""The catalog's one writer: a thread that drains a bounded queue into the database
(a :class:`~.sinks.QueuedSink`), and how a run or a cluster opens it (:func:`open_writer`).

A database error (locked past the busy timeout, disk full, a
schema mismatch) warns once through the ``warn`` callback and the writer degrades:
it keeps the failed batch and retries it after a pause, keeps draining the queue,
and never fails or stalls the process it runs in. Each batch (at most
:data:`BATCH_SIZE` events) is one transaction, so the catalog holds whole batches
only. What was not recorded by the end is counted in :attr:`~.sinks.QueuedSink.dropped`, which
the run reports.

A SQLite catalog has one writer, which holds its lease (:mod:`.lease`) and renews it
from this thread.

The same thread publishes snapshots of a SQLite catalog whose requested location is
on a network filesystem (see :mod:`..store`), and notices a SQLite catalog deleted or
replaced under it (:mod:`.follow`): it says so in one line through ``say`` and records
on where the user will look.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ...fleet.events import Event
from .sinks import BATCH_SIZE, QUEUE_SIZE, QueuedSink, first_line

if TYPE_CHECKING:
    from ..store import CatalogLocation, CatalogStore
    from .lease import WriterLease
    from .record import Recorder

__all__ = ["CatalogWriter", "open_writer"]

#: Seconds between two snapshots of a catalog on a network filesystem.
SNAPSHOT_SECONDS = 3.0
#: Seconds a failing writer pauses before it tries the database again.
RETRY_SECONDS = 2.0
#: Events a failing writer keeps back for its retries, at most.
BACKLOG_SIZE = 100_000
#: Tries of one transaction that races another writer before it counts as failed.
WRITE_ATTEMPTS = 5
#: SQLSTATEs of two writers' transactions that crossed: PostgreSQL's serialization
#: failure and deadlock, after which it aborts one of them and asks for a retry.
CROSSED = frozenset({"40001", "40P01"})

logger = logging.getLogger(__name__)


class CatalogWriter(QueuedSink):
    """Writes events into a catalog (the one writer of a SQLite catalog).

    ``heartbeat_run``: a run whose heartbeat the writer updates every few seconds
    while it lives (the executor's own run, when the executor is the writer).
    ``say``: where the line about a catalog deleted or replaced under it goes (else
    ``warn``).
    """

    thread_name = "snakemake-context-catalog"

    def __init__(
        self,
        store: CatalogStore,
        *,
        warn: Callable[[str], None],
        heartbeat_run: str | None = None,
        queue_size: int = QUEUE_SIZE,
        lease: WriterLease | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        from .follow import file_id
        from .record import Recorder

        super().__init__(warn=warn, queue_size=queue_size, heartbeat_run=heartbeat_run)
        self.store = store
        self.lease = lease
        self._say = say or warn
        path = store.location.path
        #: The SQLite file this writer opened (None: a database server).
        self._opened = file_id(path) if path is not None else None
        self._last_beat = time.monotonic()
        self.recorder: Recorder = Recorder()
        self._last_snapshot = 0.0
        self._dirty = False
        self._failing_since: float | None = None
        self._backlog: list[Event] = []
        self.start()

    def handle(self, batch: list[Event]) -> None:
        """One transaction per :data:`BATCH_SIZE` events. On failure: warn once, keep
        the batch (up to :data:`BACKLOG_SIZE` events, the rest counted as dropped)
        and try it again after a pause, for as long as the writer lives."""
        now = time.monotonic()
        self._follow()
        self._renew_lease(now)
        # Events stay in the backlog until written, so a flush sees them meanwhile.
        room = max(0, BACKLOG_SIZE - len(self._backlog))
        self._backlog.extend(batch[:room])
        self.dropped += max(0, len(batch) - room)
        if self._failing_since is not None and now - self._failing_since < RETRY_SECONDS:
            return
        while self._backlog:
            chunk = self._backlog[:BATCH_SIZE]
            try:
                self._write(chunk)
            except Exception as error:
                self.recorder.reset()
                self.failures += 1
                self._failing_since = now
                self.warn_once(
                    "write",
                    f"The context catalog {self.store.location.describe()} cannot be "
                    f"written ({type(error).__name__}: {first_line(error)}); events are "
                    "kept and retried while this lasts. The workflow is not affected.",
                )
                return
            del self._backlog[: len(chunk)]
            self._failing_since = None
            self.written += len(chunk)
            self._dirty = True
        self._maybe_snapshot(now)

    def unwritten(self) -> int:
        """Events queued, or kept back after a failed write for the next retry."""
        return self._pending + len(self._backlog)

    def _follow(self) -> None:
        """Notice the SQLite catalog deleted or replaced under this writer: copy what it
        holds to where the user will look, record there from now on, and say so."""
        from .follow import file_id, moved, rescue
        from .lease import WriterLease, lease_path

        path = self.store.location.path
        if self._opened is None or path is None:
            return
        try:
            what = moved(self._opened, file_id(path))
        except OSError as error:  # cannot tell (its directory unreadable): next tick
            logger.debug("looking at the catalog %s: %r", path, error)
            return
        if what is None:
            return
        name = self.heartbeat_run or f"writer-{os.getpid()}"
        run = f"run {self.heartbeat_run}" if self.heartbeat_run else "its writer"
        try:
            self.store, happened = rescue(self.store, what, name)
        except Exception as error:
            self._opened = None
            self._say(
                f"The context catalog {path} was {what} while {run} wrote to it, and its "
                f"records cannot be written again ({type(error).__name__}: "
                f"{first_line(error)}): they are lost. Fix: keep the catalog while a run "
                "writes it, or point runs at another (--context-catalog NEW.db)."
            )
            return
        self._opened = file_id(self.store.location.path or path)
        self._dirty = True
        where = lease_path(self.store.location)
        if self.lease is not None and where is not None and where != self.lease.path:
            self.lease.release()
            self.lease = WriterLease(where, self.lease.owner)
        if self.lease is not None and not self.lease.path.exists():
            try:  # gone with the catalog's directory: taken again
                self.lease.acquire()
            except Exception as error:
                logger.debug("taking the catalog's lease again: %r", error)
        self._say(happened.describe(run))

    def _renew_lease(self, now: float) -> None:
        from .lease import LEASE_HEARTBEAT_SECONDS

        if self.lease is None or now - self._last_beat < LEASE_HEARTBEAT_SECONDS:
            return
        self._last_beat = now
        try:
            kept = self.lease.beat()
        except OSError as error:
            kept = True
            logger.debug("renewing the catalog lease: %r", error)
        if not kept:
            self.warn_once(
                "lease",
                f"The writer lease of the context catalog {self.store.location.describe()} "
                "was taken over by another run (this writer stalled for a minute); both "
                "now write it.",
            )

    def _write(self, batch: list[Event]) -> None:
        """One transaction; a race with another writer (PostgreSQL may have several)
        is retried at once, with the ids looked up afresh: a unique key taken in the
        meantime, or two transactions that crossed (a deadlock, a serialization
        failure: PostgreSQL aborts one of them and asks for a retry)."""
        from sqlalchemy.exc import IntegrityError, OperationalError

        for attempt in range(WRITE_ATTEMPTS):
            try:
                with self.store.session() as session, session.begin():
                    self.recorder.apply(session, batch)
                return
            except (IntegrityError, OperationalError) as error:
                self.recorder.reset()
                crossed = getattr(getattr(error, "orig", None), "sqlstate", None) in CROSSED
                if attempt == WRITE_ATTEMPTS - 1 or not (
                    isinstance(error, IntegrityError) or crossed
                ):
                    raise
                # Two victims that retry in step would cross again.
                time.sleep(random.uniform(0.0, 0.05 * (attempt + 1)))

    def _maybe_snapshot(self, now: float, force: bool = False) -> None:
        location = self.store.location
        if location.snapshot is None or location.path is None or not self._dirty:
            return
        if not force and now - self._last_snapshot < SNAPSHOT_SECONDS:
            return
        from ..store import publish_snapshot

        try:
            publish_snapshot(location.path, location.snapshot)
        except Exception as error:
            self.warn_once(
                "snapshot",
                f"The context catalog's snapshot {location.snapshot} cannot be published "
                f"({type(error).__name__}: {first_line(error)}); the live catalog is "
                f"{location.path}.",
            )
        self._last_snapshot = now
        self._dirty = False

    def finish(self) -> None:
        """Try a kept-back batch once more, publish a last snapshot, release the
        database."""
        try:
            if not self._thread.is_alive():
                self._follow()
            if self._backlog and not self._thread.is_alive():
                self._failing_since = None
                self.handle([])
            self._maybe_snapshot(time.monotonic(), force=True)
        finally:
            self.dropped += len(self._backlog)
            self._backlog = []
            self.store.close()
            if self.lease is not None:
                self.lease.release()


def open_writer(
    spec: str,
    *,
    owner: str,
    warn: Callable[[str], None],
    say: Callable[[str], None],
    heartbeat_run: str | None = None,
    fallback: bool = True,
) -> CatalogWriter:
    """The writer of a catalog, as a run or a cluster opens it: take the lease (or
    take over a stale one, and ``say`` so), mark abandoned runs, and when another
    live writer holds the lease, write a catalog of this run's own beside it and
    ``say`` where. Raises :class:`CatalogError` when no catalog can be opened. A
    SQLite catalog this call creates is 0600 from the start (SQLite would follow the
    umask), and removed again if it failed to open before anything was written."""
    from ..store import resolve_location

    location = resolve_location(spec)
    created = _create_private(location.path)
    try:
        return _open_writer(location, spec, owner, warn, say, heartbeat_run, fallback)
    except BaseException:
        if created is not None:
            _remove_if_empty(created)
        raise


def _create_private(path: Path | None) -> Path | None:
    """Create a missing SQLite catalog file 0600; the path if this call created it."""
    from ... import paths

    if path is None or not path.parent.is_dir():
        return None
    try:
        return path if paths.create_exclusive(path) else None
    except OSError:
        return None


def _remove_if_empty(path: Path) -> None:
    try:
        if path.stat().st_size == 0:
            path.unlink()
    except OSError:
        pass


def _open_writer(
    location: CatalogLocation,
    spec: str,
    owner: str,
    warn: Callable[[str], None],
    say: Callable[[str], None],
    heartbeat_run: str | None,
    fallback: bool,
) -> CatalogWriter:
    import socket

    from ..store import CatalogError, open_store
    from .lease import LeaseHeld, WriterLease, lease_path, sibling_path
    from .record import mark_abandoned

    lease: WriterLease | None = None
    path = lease_path(location)
    if path is not None:
        lease = WriterLease(path, owner)
        try:
            taken = lease.acquire()
        except LeaseHeld as held:
            if not fallback:
                raise
            own = sibling_path(location.requested, owner)
            say(
                f"The context catalog {location.requested} is being written by "
                f"{held.holder.describe() if held.holder else 'another run'}; this run "
                f"records into its own catalog {own} instead (read it with "
                f"`snakemake-context status --catalog {own}`)."
            )
            return open_writer(
                own, owner=owner, warn=warn, say=say, heartbeat_run=heartbeat_run, fallback=False
            )
        except OSError as error:
            raise CatalogError(
                f"Cannot open the catalog {location.describe()}: {type(error).__name__}: "
                f"{error}. Fix: give a writable path or a reachable database URL "
                "(--context-catalog, or `snakemake-context up --catalog`)."
            ) from error
        if taken is not None:
            say(
                f"The context catalog {location.requested} had a writer lease without a "
                f"heartbeat ({taken.describe()}); this run took it over."
            )
    try:
        store = open_store(spec)
        with store.session() as session, session.begin():
            abandoned = mark_abandoned(session, time.time(), socket.gethostname())
    except BaseException:
        if lease is not None:
            lease.release()
        raise
    if abandoned:
        say(
            f"The context catalog {store.location.describe()}: marked "
            f"{len(abandoned)} run(s) abandoned (their writer stopped without ending "
            f"them): {', '.join(abandoned[:5])}{' ...' if len(abandoned) > 5 else ''}."
        )
    return CatalogWriter(store, warn=warn, heartbeat_run=heartbeat_run, lease=lease, say=say)
