"""The fleet's hub: a scheduler plugin, running in the scheduler's process.

Installed in every scheduler this project starts (and registered by an executor on
any other Dask scheduler), it

- turns workers joining and leaving into :class:`~..fleet.events.ServerJoined` and
  :class:`~..fleet.events.ServerLeft` events, the latter with the jobs that were
  running on the server (a loss record): the one source of fleet membership;
- keeps a :class:`~..fleet.state.FleetState` from every event on
  :data:`~..fleet.events.TOPIC`, which an executor that attaches takes as its starting
  point (:func:`fleet_snapshot`);
- with a catalog (``snakemake-context up``), writes every event into it: the one
  writer of that catalog. Executors then send their events here, never to the
  database.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from ..fleet import events as ev
from ..fleet.keys import is_attempt_key
from ..fleet.state import FleetState

__all__ = ["PLUGIN_NAME", "FleetHub", "fleet_snapshot"]

PLUGIN_NAME = "snakemake-context-hub"
logger = logging.getLogger(__name__)


class FleetHub(SchedulerPlugin):
    """See the module docstring. ``catalog``: a path or URL to write, or None."""

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self, catalog: str | None = None) -> None:
        self.catalog = catalog
        self.view = FleetState()
        self.lock = threading.Lock()
        self.writer: Any = None
        self.error: str | None = None
        self.scheduler: Any = None

    async def start(self, scheduler: Any) -> None:
        """Open the catalog (a failure is logged once; the cluster runs on)."""
        self.scheduler = scheduler
        if self.catalog:
            try:
                from ..catalog.lease import open_writer
                from ..catalog.seed import placement_measurements

                self.writer = open_writer(
                    self.catalog,
                    owner=f"cluster-{os.getpid()}",
                    warn=logger.warning,
                    say=logger.warning,
                )
                store = self.writer.store
                with store.session() as session:
                    self.view.measure.merge_wire(placement_measurements(session))
                logger.info("context catalog: %s", store.location.describe())
            except Exception as error:
                self.error = str(error)
                logger.warning("context catalog disabled: %s", error)
        for address in list(scheduler.workers):
            self.add_worker(scheduler, address)

    def _publish(self, event: ev.Event) -> None:
        # Scheduler.log_event reaches subscribed clients and every plugin's
        # log_event, this one included: the view and the writer see it there.
        self.scheduler.log_event(ev.TOPIC, ev.encode([event]))

    def add_worker(self, scheduler: Any, worker: str) -> None:
        """A worker joined: publish a ServerJoined."""
        ws = scheduler.workers.get(worker)
        if ws is None:
            return
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
        if topic == ev.TOPIC:
            with self.lock:
                decoded = list(ev.decode(msg))
                for item in decoded:
                    self.view.apply(item)
            if self.writer is not None:
                for item in decoded:
                    self.writer.submit(item)
        elif topic == "all" and isinstance(msg, dict) and msg.get("action") == "remove-worker":
            self._server_left(msg)

    def _server_left(self, msg: dict[str, Any]) -> None:
        address = str(msg.get("worker", ""))
        expected = bool(msg.get("expected"))
        with self.lock:
            server = self.view.servers.get(address)
            started = dict(server.started) if server else {}
            slots = server.slots if server else 1
        # The hub learns of jobs only from their servers' JobStarted: what holds a
        # slot here has started.
        running = list(started)
        lost = [ev.LostJob(key=key, started=started[key]).to_wire() for key in running]
        unreported = [
            key
            for key in msg.get("processing-tasks") or ()
            if isinstance(key, str) and key not in started and is_attempt_key(key)
        ]
        # Dask's processing set also holds the jobs queued behind a running one
        # (placement prefetches one per warm server); those had not started and are
        # simply placed again. Only a free slot can hold a start not yet reported.
        for key in unreported[: max(0, slots - len(running))]:
            lost.append(ev.LostJob(key=key).to_wire())
        # Dask's stimulus ids end in a timestamp ("handle-worker-cleanup-1795953990.72"):
        # the cause without it reads better in a loss record.
        stimulus = re.sub(r"-[0-9.]+$", "", str(msg.get("stimulus_id", "")))
        reason = ("closed" if expected else "lost") + (f" ({stimulus})" if stimulus else "")
        self._publish(ev.ServerLeft(address=address, reason=reason, expected=expected, lost=lost))

    async def close(self) -> None:
        """Write what is queued (a few seconds at most) and close the catalog."""
        if self.writer is not None:
            self.writer.close(timeout=5.0)

    def info(self) -> dict[str, Any]:
        """Whether this plugin writes a catalog, and where."""
        location = None
        if self.writer is not None:
            loc = self.writer.store.location
            location = {"requested": loc.requested, "live": loc.describe()}
        return {"writer": self.writer is not None, "catalog": location, "error": self.error}


def fleet_snapshot(dask_scheduler: Any) -> dict[str, Any] | None:
    """Run on the scheduler (``Client.run_on_scheduler``): the hub's fleet state and
    whether it writes a catalog; None if the hub is not installed."""
    plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
    if plugin is None:
        return None
    with plugin.lock:
        view = plugin.view.to_wire()
    return {"view": view, "taken": time.time(), **plugin.info()}
