"""A pool of pilots that follows the run's demand (runs in the cluster process).

:class:`DemandAdaptive` replaces Dask's task-count target with
:func:`~..fleet.poolsizing.pilots_wanted` over the demand the executor publishes in the
scheduler's metadata (:data:`~..defaults.DEMAND_KEY`), releases only pilots idle longer than the
idle timeout, and forgets pilots that left (retired at their lifetime, preempted,
cancelled) so that the pool submits replacements while work remains: dask-jobqueue
never resubmits a retired job itself (its issue #691). A submission that failed is
logged in one line and published (:data:`~..defaults.POOL_FAILURE_KEY`: the run it
serves ends on it), and the pool submits no new pilot for
:data:`SUBMIT_RETRY_SECONDS`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

from distributed.deploy.adaptive import Adaptive
from distributed.diagnostics.plugin import SchedulerPlugin

from ..defaults import DEMAND_KEY, DEMAND_STALE_SECONDS, HUB_PLUGIN_NAME, POOL_FAILURE_KEY
from ..fleet import events as ev
from ..fleet.pilotbook import PilotRecord, PoolBooks
from ..fleet.poolsizing import (
    DemandWatch,
    PoolDemand,
    PoolShape,
    growth_limit,
    pilots_to_release,
    pilots_wanted,
    useful_pilots,
)
from .batch.registry import batch_state

__all__ = ["POOL_KEY", "SUBMIT_RETRY_SECONDS", "DemandAdaptive", "demand_or_tasks", "kind_wanted"]

logger = logging.getLogger(__name__)

#: Where the executor publishes its demand in the scheduler's metadata.
#: Where the pool publishes its books (:mod:`..fleet.pilotbook`) for ``status``.
POOL_KEY = ["snakemake-context", "pool"]
#: Seconds the pool keeps asking the batch system how a departed pilot ended.
_STATE_PATIENCE = 60.0
#: Seconds a departed pilot's batch job has to end by itself before the pool cancels
#: it: a pilot that retired at its lifetime is still exiting when its server leaves,
#: and cancelling it then makes the batch system record it as cancelled (measured on
#: Grid Engine: qacct's failed 100, exit status 137, instead of failed 0, exit 0).
_EXIT_GRACE = 30.0
#: Seconds after a failed submission before the pool submits again (a persistent pool
#: outlives a batch system's outage; a run it serves has ended on the failure).
SUBMIT_RETRY_SECONDS = 30.0


def demand_or_tasks(published: PoolDemand | None, tasks_waiting: int) -> PoolDemand:
    """The pool's demand: what the executor published, else the scheduler's tasks
    (a run with ``placement=dask``, or none attached)."""
    if published is not None:
        return published
    return PoolDemand(ready=tasks_waiting, remaining=tasks_waiting)


class DemandAdaptive(Adaptive):
    """Adaptive scaling of pilots by the run's demand, not Dask's task count."""

    def __init__(
        self,
        cluster: Any,
        *,
        shape: PoolShape,
        idle_timeout: float,
        backend: str = "",
        kinds: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        # SpecCluster.adapt passes its own bounds: the shape's win.
        kwargs.pop("minimum", None)
        kwargs.pop("maximum", None)
        super().__init__(cluster, minimum=shape.minimum, maximum=shape.maximum, **kwargs)
        self.shape = shape
        self.idle_timeout = idle_timeout
        self._idle_since: dict[str, float] = {}
        self._seen: set[str] = set()
        self.backend = backend
        self.kinds = kinds or []
        #: Every pilot the pool submitted, by name.
        self.book: dict[str, PilotRecord] = {}
        #: When each worker registered, by name (exact: from the scheduler's hook).
        self.registrations: dict[str, float] = {}
        #: The batch jobs of departed pilots, by name, and when to cancel each.
        self._departed: dict[str, tuple[Any, float]] = {}
        self._sampled = time.time()
        #: Each pilot's record as last sent to the catalog (a PilotBooked event).
        self._booked: dict[str, PilotRecord] = {}
        self._demand = DemandWatch(DEMAND_STALE_SECONDS)
        #: No new pilot is submitted before then (a submission failed).
        self._retry_at = 0.0
        cluster.scheduler.add_plugin(_Registrations(self.registrations))

    @property
    def _cluster(self) -> Any:
        """The dask-jobqueue cluster (typed loosely: its attributes are SpecCluster's)."""
        return self.cluster

    async def target(self) -> int:
        """The number of pilots the demand asks for."""
        scheduler = self._cluster.scheduler
        wire = scheduler.get_metadata(keys=DEMAND_KEY, default=None)
        published = self._demand.current(PoolDemand.from_wire(wire), time.time())
        waiting = len(scheduler.unrunnable) + sum(
            len(ws.processing) for ws in scheduler.workers.values()
        )
        wanted = pilots_wanted(demand_or_tasks(published, waiting), self.shape)
        if time.time() < self._retry_at:
            wanted = min(wanted, len(self._cluster.worker_spec))
        return min(wanted, growth_limit(self._useful(), self._unregistered(), self.shape))

    def _useful(self) -> int:
        """Pilots that are proving useful now (:func:`~..fleet.poolsizing.useful_pilots`)."""
        return useful_pilots(self.book.values(), self._idle_since, time.time(), self.idle_timeout)

    def _unregistered(self) -> int:
        return sum(1 for r in self.book.values() if r.registered is None and r.ended is None)

    async def workers_to_close(self, target: int) -> list[str]:
        """Only pilots idle longer than the idle timeout, longest idle first."""
        scheduler = self._cluster.scheduler
        now = time.time()
        names = {str(ws.name): ws for ws in scheduler.workers.values()}
        for name, ws in names.items():
            if ws.processing:
                self._idle_since.pop(name, None)
            else:
                self._idle_since.setdefault(name, now)
        for name in list(self._idle_since):
            if name not in names:
                del self._idle_since[name]
        return pilots_to_release(
            self._idle_since, now, self.idle_timeout, len(names), max(self.minimum, target)
        )

    async def adapt(self) -> None:
        """Drop the pilots whose submission failed, keep the books, forget pilots that
        left, then scale as Dask's Adaptive does."""
        self._drop_failed()
        self._keep_books()
        await self._forget_departed()
        await super().adapt()
        await self._read_endings()
        self._publish()

    async def scale_down(self, workers: Any) -> None:
        """Release pilots (idle ones): they retire, whatever their batch state says."""
        for name in workers:
            record = self.book.get(str(name))
            if record is not None:
                record.released = True
                record.ended = record.ended or time.time()
        await super().scale_down(workers)

    def _note_registrations(self) -> None:
        """Each pilot's registration, as the scheduler's hook noted it: one that
        registered after the last sample, and left or was stopped before the next,
        still registered (its server's jobs ran there)."""
        for record in self.book.values():
            if record.registered is None and record.name in self.registrations:
                record.registered = self.registrations[record.name]

    def _drop_failed(self) -> None:
        """Pilots whose submission failed (:func:`~.jobqueue.submission_watched`) leave
        the pool's spec: one line in the log, and in the scheduler's metadata for the
        runs it serves."""
        cluster = self._cluster
        for name, job in list(cluster.workers.items()):
            line = getattr(job, "submit_failure", "")
            if not line:
                continue
            cluster.workers.pop(name, None)
            cluster.worker_spec.pop(name, None)
            now = time.time()
            self._retry_at = now + SUBMIT_RETRY_SECONDS
            logger.error("pilot %s was not submitted: %s", name, line)
            cluster.scheduler.set_metadata(keys=POOL_FAILURE_KEY, value={"line": line, "at": now})

    def _keep_books(self) -> None:
        self._note_registrations()
        now = time.time()
        elapsed, self._sampled = now - self._sampled, now
        cluster = self._cluster
        for name, job in list(cluster.workers.items()):
            record = self.book.get(name)
            if record is None:
                kind = name.split("-")[1] if name.startswith("pilot-") else ""
                record = self.book[name] = PilotRecord(name=name, pilot_kind=kind, submitted=now)
            record.job_id = record.job_id or str(getattr(job, "job_id", "") or "")
        for ws in cluster.scheduler.workers.values():
            record = self.book.get(str(ws.name))
            if record is None:
                continue
            if record.registered is None:
                record.registered = self.registrations.get(record.name, now)
            if ws.processing:
                record.first_task = record.first_task or now
                record.busy_seconds += elapsed

    async def _read_endings(self) -> None:
        import asyncio

        now = time.time()
        for record in self.book.values():
            if record.ended is None or record.batch_state or record.released:
                continue
            if now - record.ended > _STATE_PATIENCE:
                continue
            state = await asyncio.to_thread(batch_state, self.backend, record.job_id)
            if state:
                record.batch_state = state
                logger.info(
                    "pilot %s (batch job %s) ended: %s, counted as %s",
                    record.name,
                    record.job_id,
                    state,
                    record.ending,
                )

    def _publish(self) -> None:
        books = PoolBooks(
            records=tuple(self.book.values()),
            kinds=tuple(self.kinds),
            minimum=self.shape.minimum,
            maximum=self.shape.maximum,
            at=time.time(),
        )
        self._cluster.scheduler.set_metadata(keys=POOL_KEY, value=books.to_wire())
        self._book()

    def _book(self) -> None:
        """Send the records that changed to the catalog (the hub writes them), with the
        busy seconds whole: a pilot at work is not sent again every second."""
        changed = []
        for record in self.book.values():
            booked = replace(record, busy_seconds=float(int(record.busy_seconds)))
            if self._booked.get(record.name) != booked:
                self._booked[record.name] = booked
                changed.append(ev.PilotBooked.of(booked))
        scheduler = self._cluster.scheduler
        if changed and scheduler is not None:
            scheduler.log_event(ev.RECORD_TOPIC, ev.encode(changed))

    async def _forget_departed(self) -> None:
        observed = {str(name) for name in self.observed}
        self._seen |= observed
        gone = [name for name in self._cluster.worker_spec if name in self._seen - observed]
        for name in gone:
            logger.info("pilot %s left: the pool will replace it while work remains", name)
            record = self.book.get(name)
            if record is not None and record.ended is None:
                record.ended = time.time()
            self._seen.discard(name)
            self._cluster.worker_spec.pop(name, None)
            job = self._cluster.workers.pop(name, None)
            if job is not None:
                self._departed[name] = (job, time.monotonic() + _EXIT_GRACE)
        for name, (job, deadline) in list(self._departed.items()):
            if time.monotonic() < deadline:
                continue
            del self._departed[name]
            try:
                await job.close()
            except Exception as error:  # the batch job is already gone
                logger.debug("closing departed pilot %s: %r", name, error)

    def stop(self, reason: str = "unknown") -> None:
        """Stop scaling; the departed pilots' jobs go back to the cluster, which
        cancels every job it holds as it closes. Every pilot still held ends now,
        released, and the catalog hears it (its books)."""
        for name, (job, _) in self._departed.items():
            self._cluster.workers.setdefault(name, job)
        self._departed.clear()
        self._note_registrations()
        now = time.time()
        for record in self.book.values():
            if record.ended is None:
                record.ended = now
                record.released = True
        try:
            self._book()
        except Exception as error:  # the scheduler closed first
            logger.debug("booking the pilots at the pool's end: %r", error)
        super().stop(reason)


def kind_wanted(cluster: Any, kinds: list[Any]) -> int:
    """Which kind of pilot to submit next: the GPU type with the most ready jobs per
    pilot of that type (as published by the executor); where the run weighs survival,
    the kind whose pilots live longer by the hub's estimates; else the kind with fewest."""
    from ..fleet.poolsizing import kind_survival, next_kind
    from ..fleet.survival import survival_group

    held = [0] * len(kinds)
    for name in cluster.worker_spec:
        index = cluster.pilot_kinds.get(name)
        if index is not None:
            held[index] += 1
    published = None
    if cluster.scheduler is not None:
        published = PoolDemand.from_wire(
            cluster.scheduler.get_metadata(keys=DEMAND_KEY, default=None)
        )
    by_model = published.by_gpu_model if published is not None else {}
    wanted = [int(by_model.get(kind.gpu_type or "", 0)) for kind in kinds]
    hub = cluster.scheduler.plugins.get(HUB_PLUGIN_NAME) if cluster.scheduler is not None else None
    survival = None
    if hub is not None:
        groups = [
            (survival_group(k.group, k.queue or "", k.gpu_type or "pilot"), k.gpu_type or "")
            for k in kinds
        ]
        with hub.lock:
            survival = kind_survival(published, hub.view.survival, groups, time.time())
    return next_kind(wanted, held, survival)


class _Registrations(SchedulerPlugin):
    """Notes when each worker registers (the pool samples only once a second)."""

    name = "snakemake-context-pool-registrations"

    def __init__(self, registrations: dict[str, float]) -> None:
        self.registrations = registrations

    def add_worker(self, scheduler: Any, worker: str) -> None:
        """A worker registered: note its name's time."""
        ws = scheduler.workers.get(worker)
        if ws is not None:
            self.registrations.setdefault(str(ws.name), time.time())
