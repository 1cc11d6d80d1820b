"""The fleet's hub: a scheduler plugin, running in the scheduler's process.

Installed in every scheduler this project starts (and registered by an executor on
any other Dask scheduler), it

- turns workers joining and leaving into :class:`~..fleet.events.ServerJoined` and
  :class:`~..fleet.events.ServerLeft` events, the latter with the jobs that were
  running on the server (a loss record) and what classifies the loss (the exit code
  its nanny saw, an injector's announcement, missed heartbeats, a drain): the one
  source of fleet membership;
- drains a server whose last jobs of a rule all failed by its fault (not a script's
  own error) while others succeeded on it (a black hole);
- assembles gang pilots into servers that span nodes (:mod:`.roster`);
- keeps a :class:`~..fleet.state.FleetState` from every event on
  :data:`~..fleet.events.TOPIC`, which an executor that attaches takes as its starting
  point (:func:`fleet_snapshot`), and whose measured rates of a context's loads and
  transfers a server asks for before it takes a template from a peer or the source
  (:data:`~..defaults.PEER_RATES_HANDLER`);
- with a catalog (``snakemake-context up``, and a run's embedded cluster), writes
  every event into it: the one writer of that catalog. Executors then send their
  events here, never to the database; what the writer says (it cannot write, it
  writes beside a catalog another writer holds, it took over a lease) goes out as a
  :class:`~..fleet.events.CatalogWarning` for the runs' logs, and at a run's end
  :func:`run_recorded` tells the run that its events are written (or, before a run
  kills its embedded cluster, :func:`hand_over` gives the catalog to the run).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
import time
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from ..defaults import HUB_PLUGIN_NAME, PEER_RATES_HANDLER
from ..fleet import events as ev
from ..fleet.keys import is_attempt_key, rule_of
from ..fleet.losses import FailureStreaks
from ..fleet.state import FleetState
from .roster import HANDLER as ROSTER_HANDLER
from .roster import GangRoster

__all__ = ["FleetHub", "fleet_snapshot", "hand_over", "run_recorded"]

logger = logging.getLogger(__name__)


class FleetHub(SchedulerPlugin):
    """See the module docstring. ``catalog``: a path or URL to write, or None;
    ``run_id``: the run whose embedded cluster this is (its catalog's writer writes as
    the run's would: the lease names the run, a catalog beside is the run's)."""

    name = HUB_PLUGIN_NAME
    idempotent = True

    #: Exit codes of server processes by their last address, filled by the nannies
    #: of a cluster this project starts (:mod:`.nannies`, same process).
    exits: dict[str, int] = {}
    #: The jobs each such process ran when it died, by its own record on disk.
    running_at_exit: dict[str, list[str]] = {}
    #: Seconds to wait for a lost server's exit code before publishing its loss (0
    #: where no nanny of ours reports them).
    exit_wait: float = 0.0

    def __init__(self, catalog: str | None = None, run_id: str | None = None) -> None:
        self.catalog = catalog
        self.run_id = run_id
        #: What the catalog's writer said, for the runs that attach later.
        self.catalog_warnings: list[str] = []
        #: Runs whose RunFinished the hub has seen.
        self.finished_runs: set[str] = set()
        self.injected: dict[str, int] = {}
        self.restarting: dict[str, str] = {}
        self.heartbeat_lost: set[str] = set()
        self.drained: dict[str, str] = {}
        #: Servers whose drain was a crash (ServerDraining.crashed).
        self.drained_crash: set[str] = set()
        self.streaks = FailureStreaks()
        self._waiting: set[asyncio.Future[None]] = set()
        self.view = FleetState()
        self.lock = threading.Lock()
        self.writer: Any = None
        self.error: str | None = None
        self.scheduler: Any = None
        #: Gang pilots waiting for the rest of their gang, and the gangs made.
        self.roster = GangRoster(self._publish)

    async def start(self, scheduler: Any) -> None:
        """Open the catalog (a failure is logged once; the cluster runs on), and
        take the gang pilots' calls (:mod:`.roster`)."""
        self.scheduler = scheduler
        scheduler.handlers[ROSTER_HANDLER] = self.roster.join
        scheduler.handlers[PEER_RATES_HANDLER] = self.rates
        if self.catalog:
            try:
                from ..catalog.reading.fleetseed import placement_measurements, survival_history
                from ..catalog.writing.writer import open_writer

                self.writer = open_writer(
                    self.catalog,
                    owner=f"run {self.run_id}" if self.run_id else f"cluster-{os.getpid()}",
                    warn=self._warn,
                    say=self._warn,
                    heartbeat_run=self.run_id,
                )
                store = self.writer.store
                with store.session() as session:
                    self.view.measure.merge_wire(placement_measurements(session))
                    self.view.survival.merge_wire(survival_history(session))
                logger.info("context catalog: %s", store.location.describe())
            except Exception as error:
                self.error = str(error)
                logger.warning("context catalog disabled: %s", error)
        for address in list(scheduler.workers):
            self.add_worker(scheduler, address)

    def _warn(self, message: str) -> None:
        """What the catalog's writer says (from any thread): the cluster's log, the
        runs following the fleet, and the snapshot of a run that attaches later."""
        logger.warning("%s", message)
        self.catalog_warnings.append(message)
        if self.scheduler is not None:
            event = ev.CatalogWarning(message=message)
            self.scheduler.loop.add_callback(self._publish, event)

    def close_catalog(self, timeout: float, patience: float = 0.0) -> None:
        """Write what is queued (``timeout`` s without progress, ``patience`` s in all
        at most) and close the catalog; events after this are not recorded."""
        writer, self.writer = self.writer, None
        if writer is not None:
            writer.close(timeout=timeout, patience=patience)

    def rates(self, identity: str, model: str = "") -> dict[str, Any]:
        """The measured rates of a context's loads and transfers (a handler: plain data)."""
        with self.lock:
            return self.view.measure.rates(identity, model).to_wire()

    def _job_finished(self, event: ev.JobFinished) -> None:
        """A server whose last jobs of a rule all failed by its fault while others
        succeeded on it is drained and reported (the catalog and the console say why)."""
        why = self.streaks.record(rule_of(event.key), event.address, event.ok, event.fault)
        if why is None or self.scheduler is None or event.address in self.drained:
            return
        self.drained[event.address] = why
        logger.warning("draining %s: %s", event.address, why)
        drained = ev.ServerDraining(address=event.address, why=why, grace=0.0)
        # Inside log_event: publish and retire once it has returned.
        self.scheduler.loop.add_callback(self._drain, drained)

    async def _drain(self, drained: ev.ServerDraining) -> None:
        self._publish(drained)
        try:
            await self.scheduler.retire_workers(workers=[drained.address], close_workers=True)
        except Exception as error:
            logger.warning("could not retire %s: %r", drained.address, error)

    def _publish(self, event: ev.Event) -> None:
        # Scheduler.log_event reaches subscribed clients and every plugin's
        # log_event, this one included: the view and the writer see it there.
        self.scheduler.log_event(ev.TOPIC, ev.encode([event]))

    def add_worker(self, scheduler: Any, worker: str) -> None:
        """A worker joined: publish a ServerJoined."""
        ws = scheduler.workers.get(worker)
        if ws is None:
            return
        # What a nanny reported after the hub's wait belongs to an earlier process here.
        self.exits.pop(worker, None)
        self.running_at_exit.pop(worker, None)
        host = worker.split("://")[-1].rsplit(":", 1)[0]
        self._publish(
            ev.ServerJoined(
                address=worker,
                name=str(ws.name),
                host=host,
                slots=int(ws.nthreads),
                memory_bytes=int(ws.memory_limit or 0),
                resources={k: float(v) for k, v in (ws.resources or {}).items()},
            )
        )

    def log_event(self, topic: str, msg: Any) -> None:
        """Every event of the topic updates the view and goes to the writer; Dask's
        own remove-worker event becomes a ServerLeft with the jobs it hit."""
        if topic in (ev.TOPIC, ev.RECORD_TOPIC):
            with self.lock:
                decoded = list(ev.decode(msg))
                for item in decoded:
                    self.view.apply(item)
                    if isinstance(item, ev.ServerKillInjected):
                        self.injected[item.address] = item.signal
                    elif isinstance(item, ev.ServerRestarting):
                        self.restarting[item.address] = item.why
                    elif isinstance(item, ev.ServerDraining):
                        self.drained[item.address] = item.why
                        if item.crashed:
                            self.drained_crash.add(item.address)
                    elif isinstance(item, ev.JobFinished) and not item.cancelled:
                        self._job_finished(item)
                    elif isinstance(item, ev.RunFinished):
                        self.finished_runs.add(item.run_id)
            writer = self.writer
            if writer is not None:
                for item in decoded:
                    writer.submit(item)
        elif not isinstance(msg, dict):
            return
        elif msg.get("action") == "worker-ttl-timed-out":
            self.heartbeat_lost.update(str(w) for w in msg.get("workers") or ())
        elif topic == "all" and msg.get("action") == "remove-worker":
            address = str(msg.get("worker", ""))
            self.roster.strike(address)
            with self.lock:
                server = self.view.servers.get(address)
                started = dict(server.started) if server else {}
                slots = server.slots if server else 1
                name = server.name if server else ""
            if self.exit_wait > 0 and not msg.get("expected"):
                # The nanny reaps the process a moment after the scheduler sees its
                # connection close: wait briefly for the exit code that classifies it.
                task = asyncio.ensure_future(self._left_after_exit(msg, started, slots, name))
                self._waiting.add(task)  # the loop keeps only a weak reference
                task.add_done_callback(self._waiting.discard)
            else:
                self._server_left(msg, started, slots, name)

    async def _left_after_exit(
        self, msg: dict[str, Any], started: dict[str, float], slots: int, name: str
    ) -> None:
        address = str(msg.get("worker", ""))
        for _ in range(int(self.exit_wait / 0.05)):
            if address in self.exits:
                break
            await asyncio.sleep(0.05)
        self._server_left(msg, started, slots, name)

    def _server_left(
        self, msg: dict[str, Any], started: dict[str, float], slots: int, name: str
    ) -> None:
        address = str(msg.get("worker", ""))
        restarted = self.restarting.pop(address, "")
        expected = bool(msg.get("expected")) or bool(restarted)
        # The hub learns of jobs from their servers' JobStarted (what holds a slot
        # here has started), or, better, from what the dead process recorded.
        recorded = self.running_at_exit.pop(address, None)
        running = list(started) if recorded is None else recorded
        lost = [ev.LostJob(key=key, started=started.get(key)).to_wire() for key in running]
        unreported = [
            key
            for key in msg.get("processing-tasks") or ()
            if isinstance(key, str) and key not in started and is_attempt_key(key)
        ]
        # Dask's processing set also holds the jobs queued behind a running one
        # (placement prefetches one per warm server); those had not started and are
        # simply placed again. Only a free slot can hold a start not yet reported.
        for key in unreported[: max(0, slots - len(running))] if recorded is None else ():
            lost.append(ev.LostJob(key=key).to_wire())
        # Dask's stimulus ids end in a timestamp ("handle-worker-cleanup-1795953990.72"):
        # the cause without it reads better in a loss record.
        stimulus = re.sub(r"-[0-9.]+$", "", str(msg.get("stimulus_id", "")))
        left = ev.ServerLeft(
            address=address,
            expected=expected,
            lost=lost,
            name=name,
            exit_code=self.exits.pop(address, None),
            injected=self.injected.pop(address, None),
            heartbeat=address in self.heartbeat_lost or "worker-ttl" in stimulus,
            running=recorded,
            drained=self.drained.pop(address, ""),
            drained_crash=address in self.drained_crash,
            restarted=restarted,
        )
        self.heartbeat_lost.discard(address)
        self.drained_crash.discard(address)
        cause = left.cause()
        # The classification leads the reason, so the catalog's loss records say it.
        left.reason = f"{cause.kind}: {cause.why}" + (f" ({stimulus})" if stimulus else "")
        self._publish(left)

    async def close(self) -> None:
        """Record the end of every server still in the fleet (Dask closes its workers
        after its plugins: no remove-worker will come for them), write what is queued
        (a few seconds at most) and close the catalog."""
        if self.writer is not None:
            with self.lock:
                closing = self.view.closing("closed: the cluster shut down")
            for left in closing:
                self.writer.submit(left)
            self.writer.close(timeout=5.0)

    def info(self) -> dict[str, Any]:
        """Whether this plugin writes a catalog, where, and what its writer said."""
        location = None
        if self.writer is not None:
            loc = self.writer.store.location
            location = {"requested": loc.requested, "live": loc.describe()}
        return {
            "writer": self.writer is not None,
            "catalog": location,
            "error": self.error,
            "warnings": list(self.catalog_warnings),
        }


def fleet_snapshot(dask_scheduler: Any) -> dict[str, Any] | None:
    """Run on the scheduler (``Client.run_on_scheduler``): the hub's fleet state and
    whether it writes a catalog; None if the hub is not installed."""
    plugin = dask_scheduler.plugins.get(HUB_PLUGIN_NAME)
    if plugin is None:
        return None
    with plugin.lock:
        view = plugin.view.to_wire()
    return {"view": view, "taken": time.time(), **plugin.info()}


async def run_recorded(
    dask_scheduler: Any, run_id: str, closing: str = "", timeout: float = 60.0
) -> dict[str, Any] | None:
    """Run on the scheduler at the end of run ``run_id``: wait until its RunFinished
    has reached the hub and every event queued is written (``timeout`` s at most).
    With ``closing`` (a run's embedded cluster, which stops with the run): record
    every server's end with that reason and close the catalog. Returns where the
    catalog is, what it did not record and what its writer said (None: the hub writes
    no catalog)."""
    hub = dask_scheduler.plugins.get(HUB_PLUGIN_NAME)
    writer = hub.writer if hub is not None else None
    if writer is None:
        return None
    deadline = time.monotonic() + timeout
    while run_id not in hub.finished_runs and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    # A writer that makes no progress for 10 s (a catalog locked by another) is
    # given up on: what it holds is counted as not recorded.
    left = max(1.0, deadline - time.monotonic())
    if closing:
        with hub.lock:
            ends = hub.view.closing(closing)
        for end in ends:
            hub._publish(end)
        await asyncio.to_thread(hub.close_catalog, 10.0, left)
    else:
        await asyncio.to_thread(writer.drain, 10.0, left)
    location = writer.store.location
    return {
        "warnings": list(hub.catalog_warnings),
        "requested": location.requested,
        "location": location.describe(),
        "dropped": writer.dropped + (0 if closing else writer.unwritten()),
    }


async def hand_over(dask_scheduler: Any, events: list[dict[str, Any]], timeout: float) -> bool:
    """Run on the scheduler of a run's embedded cluster that the run is about to kill
    (Ctrl-C, a stop): write ``events`` (what the run had not sent) and what is queued,
    and close the catalog (``timeout`` s at most), for the run to write the rest.
    False if the hub writes no catalog."""
    hub = dask_scheduler.plugins.get(HUB_PLUGIN_NAME)
    writer = hub.writer if hub is not None else None
    if writer is None:
        return False
    for event in ev.decode(events):
        writer.submit(event)
    await asyncio.to_thread(hub.close_catalog, timeout, timeout)
    return True
