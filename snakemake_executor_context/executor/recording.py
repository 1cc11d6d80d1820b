"""A run's record, in Snakemake's process: where its events go (a relay to the
writer of the cluster's hub, which is where an embedded cluster's run writes; its own
catalog writer, attached to a cluster whose hub writes none; or nowhere), the fleet as
it was when the run attached, and the run's start and end.

Nothing here can fail a run: a catalog problem is one warning.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..contexts import ContextDeclaration
from ..defaults import DEFAULT_CATALOG, catalog_disabled
from ..errors import ContextExecutorError
from ..fleet import events as ev
from ..fleet.state import FleetState

if TYPE_CHECKING:
    from ..catalog.writing.sinks import EventSink
    from ..cluster.connection import ClusterConnection

__all__ = ["Recording", "holds_run", "run_catalog", "versions"]

logger = logging.getLogger(__name__)


class Recording:
    """The catalog side of one run; ``log`` (Snakemake's logger) shows a catalog
    problem once."""

    def __init__(
        self,
        connection: ClusterConnection,
        run_id: str,
        workdir: str,
        catalog: str | None,
        log: Any,
        report: bool = False,
    ) -> None:
        self.connection = connection
        self.run_id = run_id
        self.workdir = workdir
        self.catalog = catalog
        #: Write the run's GPU ledger report at its end (--context-report).
        self.report = report
        self._warn = log.warning
        self._info = log.info
        self._warned = False
        self.sink: EventSink | None = None
        #: Whether this process writes the catalog (else a relay, or nothing).
        self.writes = False
        #: What the hub's writer said that the run's log shows (each once).
        self._said: set[str] = set()
        self.location: str | None = None
        #: The run's view of the fleet (from :meth:`begin`).
        self.fleet: FleetState | None = None

    def warn_once(self, message: str) -> None:
        """A catalog problem: said once, never fatal."""
        if not self._warned:
            self._warned = True
            self._warn(message)

    def begin(
        self,
        fleet: FleetState,
        on_events: Callable[[Any], None],
        *,
        jobs_total: int | None,
        declarations: list[ContextDeclaration],
    ) -> bool:
        """Follow the fleet's events (``on_events``), seed ``fleet`` from the hub's
        snapshot (installing the hub on a scheduler this project did not start), open
        the sink and record the run's start (the servers' caches are probed apart, in
        the background: :class:`.loop.CacheProbes`). Returns whether the cluster has a hub (the
        source of fleet membership)."""
        try:
            self.connection.client.subscribe_topic(ev.TOPIC, on_events)
        except Exception as error:
            self.warn_once(f"Cannot follow the fleet's events: {error}")
        self.fleet = fleet
        snapshot = self._snapshot()
        if snapshot:
            fleet.load_wire(snapshot.get("view") or {})
        self.sink = self._open_sink(snapshot, fleet)
        self._started(fleet, jobs_total)
        return snapshot is not None

    def _snapshot(self) -> dict[str, Any] | None:
        from ..cluster.hub import FleetHub, fleet_snapshot

        client = self.connection.client
        try:
            snapshot = client.run_on_scheduler(fleet_snapshot)
            if snapshot is None:
                client.register_plugin(FleetHub())
                snapshot = client.run_on_scheduler(fleet_snapshot)
            return dict(snapshot) if snapshot is not None else None
        except Exception as error:
            logger.debug("no fleet snapshot from the scheduler: %r", error)
            return None

    def _open_sink(self, snapshot: dict[str, Any] | None, fleet: FleetState) -> EventSink | None:
        """A relay to the cluster's writer, or this process's own writer."""
        from ..catalog.writing.sinks import DaskRelay

        for message in (snapshot or {}).get("warnings") or ():
            self.catalog_said(str(message))
        if snapshot and snapshot.get("writer"):
            self.location = (snapshot.get("catalog") or {}).get("requested")
            if self.connection.embedded:
                private = _outside(self.location or "", self.workdir)
                if private is not None:
                    _make_private(private)
            elif self.catalog:
                self._info(
                    f"The cluster records into its own catalog ({self.location}); "
                    "--context-catalog is not used."
                )
            return DaskRelay(self.connection.client, warn=self.warn_once, heartbeat_run=self.run_id)
        spec = self.catalog or str(Path(self.workdir) / DEFAULT_CATALOG)
        if self.connection.embedded:  # its hub writes the run's catalog, or none
            error = (snapshot or {}).get("error")
            if error and not catalog_disabled(spec):
                self.warn_once(
                    f"Cannot open the context catalog {spec}: {error}. The run goes on "
                    "without recording into it."
                )
            return None
        if catalog_disabled(spec):
            return None
        return self._own_writer(spec, fleet)

    def _own_writer(self, spec: str, fleet: FleetState | None) -> EventSink | None:
        """This process's writer of catalog ``spec`` (None, and a warning, if it cannot
        be opened); ``fleet`` takes the catalog's measurements."""
        writer = None
        try:
            from ..catalog.reading.fleetseed import placement_measurements, survival_history
            from ..catalog.writing.writer import open_writer
            from ..cluster.credentials import private_dir

            private = _outside(spec, self.workdir)
            if private is not None and not private.parent.exists():
                private_dir(private.parent, fix="remove it, or choose another --context-catalog.")
            writer = open_writer(
                spec,
                owner=f"run {self.run_id}",
                warn=self.warn_once,
                say=self._warn,
                heartbeat_run=self.run_id,
            )
            if private is not None:
                where = writer.store.location
                _make_private(Path(where.snapshot or where.path or private))
            if fleet is not None:
                with writer.store.session() as session:
                    fleet.measure.merge_wire(placement_measurements(session))
                    fleet.survival.merge_wire(survival_history(session))
        except Exception as error:
            if writer is not None:
                writer.close(timeout=0.1)
            self.warn_once(
                f"{error} The run goes on without recording into the catalog."
                if isinstance(error, ContextExecutorError)
                else f"Cannot open the context catalog {spec}: {error}. The run goes on "
                "without recording into it."
            )
            return None
        self.writes = True
        self.location = writer.store.location.describe()
        return writer

    def _started(self, fleet: FleetState, jobs_total: int | None) -> None:
        """Record the run's start, and (as the writer) the servers it found."""
        self.emit(
            ev.RunStarted(
                run_id=self.run_id,
                workdir=self.workdir,
                host=socket.gethostname(),
                pid=os.getpid(),
                cluster=self.connection.description,
                jobs_total=jobs_total,
                versions=versions(),
            )
        )
        if not self.writes:
            return
        for server in list(fleet.servers.values()):
            self.emit(
                ev.ServerJoined(
                    address=server.address,
                    name=server.name,
                    slots=server.slots,
                    resources=server.resources,
                )
            )
            # Its survival group as the hub's book has it (label, or partition/pool
            # joined): the catalog's history groups its life the same way.
            live = fleet.survival.alive.get(server.address)
            group = live.group if live is not None else ""
            if server.budget is not None or server.gpu is not None or group:
                self.emit(
                    ev.ServerDescribed(
                        address=server.address,
                        name=server.name,
                        memory_budget=server.budget or 0,
                        gpu=server.gpu,
                        group=group,
                    )
                )

    def probe_caches(self, declarations: list[ContextDeclaration]) -> dict[str, tuple[str, ...]]:
        """Which declared contexts each server's local cache holds (by address)."""
        from ..server.calls import probe_caches

        if not declarations:
            return {}
        try:
            found = self.connection.run(probe_caches, declarations)
        except Exception as error:
            logger.debug("no cache probes from the servers: %r", error)
            return {}
        return {a: tuple(ids) for a, ids in found.items() if isinstance(ids, list)}

    def emit(self, event: ev.Event) -> None:
        """Send one event to the catalog (nothing without one)."""
        if self.sink is not None:
            self.sink.submit(event)

    def relay(self, events: list[ev.Event]) -> None:
        """The fleet's events, as the hub sent them: recorded if this run writes the
        catalog itself (else the cluster's own writer records them); what the hub's
        writer says goes to the run's log."""
        for event in events:
            if isinstance(event, ev.CatalogWarning):
                self.catalog_said(event.message)
            elif self.writes:
                self.emit(event)

    def take_over(self, hub_alive: bool) -> None:
        """The embedded cluster's hub, which writes the catalog, is gone (its scheduler
        died: ``hub_alive`` False) or about to be (the run kills its cluster to stop:
        the hub first writes what it holds and lets go of the catalog, :func:`..cluster.
        hub.hand_over`). This process writes what is left of the run (the servers' and
        the attempts' ends, the run's) into the same catalog, taking over the lease."""
        from ..catalog.writing.sinks import DaskRelay
        from ..cluster.hub import hand_over

        relay = self.sink
        if not isinstance(relay, DaskRelay) or not self.connection.embedded or not self.location:
            return
        self.sink = None
        unsent = relay.abandon()
        if hub_alive:
            try:
                self.connection.client.run_on_scheduler(
                    hand_over, events=ev.encode(unsent), timeout=5.0
                )
                unsent = []
            except Exception as error:
                logger.debug("the hub could not hand the catalog over: %r", error)
        self.sink = self._own_writer(self.location, None)
        for event in unsent:
            self.emit(event)

    def catalog_said(self, message: str) -> None:
        """A line of the hub's catalog writer, in the run's log once."""
        if message not in self._said:
            self._said.add(message)
            self._warn(message)

    def finished(self, end: ev.RunFinished) -> None:
        """Record the run's ``end`` (as dispatch says it ended), and write what is
        queued (a few seconds at most; through the hub: until the hub has written it,
        and for the embedded cluster, which stops with the run, with every server's
        end)."""
        self.emit(end)
        try:
            self.connection.client.unsubscribe_topic(ev.TOPIC)
        except Exception as error:
            logger.debug("unsubscribing from the fleet's events: %r", error)
        sink, self.sink = self.sink, None
        if sink is not None:
            # Waits while the writer makes progress (two minutes at most: a loaded node
            # writes a few hundred events a second), and gives up after 10 s without any
            # (a starved thread on a loaded node can pause 5 s).
            sink.close(timeout=10.0, patience=120.0)
            store = getattr(sink, "store", None)  # this process's writer: where it ended
            written = store.location.requested if store is not None else None
            if store is not None:
                self.location = store.location.describe()
            dropped = getattr(sink, "dropped", 0)
            hub = self._hub_recorded() if store is None else None
            if hub is not None:
                for message in hub.get("warnings") or ():
                    self.catalog_said(str(message))
                dropped += int(hub.get("dropped") or 0)
                self.location = str(hub.get("location") or self.location)
                written = str(hub.get("requested") or "") or None
            if dropped:
                self._warn(
                    f"The context catalog {self.location} did not record {dropped} "
                    f"event(s) of run {self.run_id} (see the warning above for why). The "
                    "workflow's results are not affected."
                )
            self._ledger(written)

    def _hub_recorded(self) -> dict[str, Any] | None:
        """The hub's word that this run's events are written (:func:`..cluster.hub.
        run_recorded`); None if it writes no catalog or cannot be asked."""
        from ..cluster.hub import run_recorded

        closing = "closed: the run's cluster stopped with the run"
        try:
            told = self.connection.client.run_on_scheduler(
                run_recorded,
                run_id=self.run_id,
                closing=closing if self.connection.embedded else "",
                timeout=60.0,
            )
        except Exception as error:
            logger.debug("the hub's catalog at the run's end: %r", error)
            return None
        return dict(told) if told else None

    def _ledger(self, written: str | None) -> None:
        """Write the run's GPU ledger report (``--context-report``), or name the command
        that writes it, from the catalog this process wrote (``written``, where it
        ended: beside the shared one, or again after the file was deleted) only when it
        holds the run. Never fails the run."""
        from ..report.reportcommand import build_report, write_report

        spec = written or self.catalog or str(Path(self.workdir) / DEFAULT_CATALOG)
        if "://" not in spec and self.location and not self.writes:
            spec = self.location  # the cluster's own catalog
        command = f"snakemake-context report --run {self.run_id}"
        if spec != str(Path(self.workdir) / DEFAULT_CATALOG):
            command += f" --catalog {spec}"
        if written is not None and not holds_run(spec, self.run_id):
            if self.report:
                self._warn(
                    f"The run's ledger report is not written: the context catalog {spec} "
                    f"does not hold run {self.run_id} (see the warnings above)."
                )
            return
        if not self.report:
            self._info(f"Where this run's GPU-seconds went (the ledger): {command}")
            return
        try:
            page, _ = build_report(spec, run=self.run_id)
            output = write_report(page, None, Path(self.workdir), self.run_id)
            self._info(f"Where this run's GPU-seconds went (the ledger): {output}")
        except Exception as error:
            self._warn(f"Cannot write the run's ledger report ({command}): {error}")


def run_catalog(catalog: str | None, workdir: str, warn: Callable[[str], None]) -> str | None:
    """The catalog a run's embedded cluster writes (``--context-catalog``, else the
    workflow's own), None when disabled. A missing directory outside the workflow
    directory is made private first; if it cannot be, ``warn`` says so and the run
    records nothing."""
    spec = catalog or str(Path(workdir) / DEFAULT_CATALOG)
    if catalog_disabled(spec):
        return None
    private = _outside(spec, workdir)
    if private is not None and not private.parent.exists():
        from ..cluster.credentials import private_dir

        try:
            private_dir(private.parent, fix="remove it, or choose another --context-catalog.")
        except ContextExecutorError as error:
            warn(f"{error} The run goes on without recording into the catalog.")
            return None
    return spec


def holds_run(spec: str, run_id: str) -> bool:
    """Whether the catalog ``spec`` can be read and holds run ``run_id`` (so that its
    report can be read)."""
    from sqlalchemy import select

    from ..catalog.models import Run
    from ..catalog.store import open_reader

    try:
        store = open_reader(spec)
    except Exception as error:
        logger.debug("reading the catalog %s: %r", spec, error)
        return False
    try:
        with store.session() as session:
            return session.scalar(select(Run.id).where(Run.run_id == run_id)) is not None
    except Exception as error:
        logger.debug("reading the catalog %s: %r", spec, error)
        return False
    finally:
        store.close()


def versions() -> dict[str, str]:
    """The versions a run records (snakemake and this plugin)."""
    from .._version import __version__

    try:
        from ..snakemake_internals import snakemake_version

        return {"snakemake": snakemake_version(), "plugin": __version__}
    except Exception as error:
        logger.debug("no snakemake version: %r", error)
        return {"plugin": __version__}


def _outside(spec: str, workdir: str) -> Path | None:
    """The catalog's path if it is a file outside the workflow directory (private
    there: 0600), else None (a URL, or a file under the workflow directory, which
    follows the umask like Snakemake's own files)."""
    if "://" in spec:
        return None
    path = Path(spec).expanduser().absolute()
    return None if path.is_relative_to(Path(workdir).absolute()) else path


def _make_private(path: Path) -> None:
    """Make an SQLite catalog and its journal files 0600 (those of this user)."""
    suffixes = ("-wal", "-shm", "-journal", ".writer")  # .writer: its lease (catalog.lease)
    for candidate in (path, *(path.with_name(path.name + s) for s in suffixes)):
        try:
            info = os.lstat(candidate)  # never through a symlink
            if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid():
                os.chmod(candidate, 0o600)
        except OSError:
            pass
