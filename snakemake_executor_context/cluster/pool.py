"""A pool of pilots that follows the run's demand (runs in the cluster process).

:class:`DemandAdaptive` replaces Dask's task-count target with
:func:`~..fleet.pool.pilots_wanted` over the demand the executor publishes in the
scheduler's metadata (:data:`DEMAND_KEY`), releases only pilots idle longer than the
idle timeout, and forgets pilots that left (retired at their lifetime, preempted,
cancelled) so that the pool submits replacements while work remains: dask-jobqueue
never resubmits a retired job itself (its issue #691).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from distributed.deploy.adaptive import Adaptive
from distributed.diagnostics.plugin import SchedulerPlugin

from ..fleet.pilotbook import PilotRecord, account
from ..fleet.pool import (
    PoolDemand,
    PoolShape,
    growth_limit,
    pilots_to_release,
    pilots_wanted,
)
from .batchstate import batch_state

__all__ = ["DEMAND_KEY", "POOL_KEY", "DemandAdaptive", "demand_from_metadata", "kind_wanted"]

logger = logging.getLogger(__name__)

#: Where the executor publishes its demand in the scheduler's metadata.
DEMAND_KEY = ["snakemake-context", "demand"]
#: Where the pool publishes its books (:mod:`..fleet.pilotbook`) for ``status``.
POOL_KEY = ["snakemake-context", "pool"]
#: Seconds the pool keeps asking the batch system how a departed pilot ended.
_STATE_PATIENCE = 60.0


def demand_from_metadata(published: Any, tasks_waiting: int) -> PoolDemand:
    """The pool's demand: what the executor published, else the scheduler's tasks
    (a run with ``placement=dask``, or none attached)."""
    if isinstance(published, dict) and published:
        return PoolDemand(
            ready=int(published.get("ready", 0)),
            remaining=int(published.get("remaining", 0)),
            job_seconds=float(published.get("job_seconds", 0.0)),
            load_seconds=float(published.get("load_seconds", 0.0)),
        )
    return PoolDemand(ready=tasks_waiting, remaining=tasks_waiting)


class DemandAdaptive(Adaptive):
    """Adaptive scaling of pilots by the run's demand, not Dask's task count."""

    def __init__(
        self,
        cluster: Any,
        *,
        shape: PoolShape,
        idle_timeout: float = 120.0,
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
        self._sampled = time.time()
        cluster.scheduler.add_plugin(_Registrations(self.registrations))

    @property
    def _cluster(self) -> Any:
        """The dask-jobqueue cluster (typed loosely: its attributes are SpecCluster's)."""
        return self.cluster

    async def target(self) -> int:
        """The number of pilots the demand asks for."""
        scheduler = self._cluster.scheduler
        published = scheduler.get_metadata(keys=DEMAND_KEY, default=None)
        waiting = len(scheduler.unrunnable) + sum(
            len(ws.processing) for ws in scheduler.workers.values()
        )
        wanted = pilots_wanted(demand_from_metadata(published, waiting), self.shape)
        return min(wanted, growth_limit(self._useful(), self._unregistered(), self.shape))

    def _useful(self) -> int:
        """Pilots that are proving useful: busy within the idle timeout, or registered
        so recently that they may still get their first job."""
        now = time.time()
        useful = 0
        for record in self.book.values():
            if record.registered is None or record.ended is not None:
                continue
            idle_since = self._idle_since.get(record.name)
            recent = now - record.registered < self.idle_timeout
            if recent or idle_since is None or now - idle_since < self.idle_timeout:
                useful += 1
        return useful

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
        """Keep the books, forget pilots that left, then scale as Dask's Adaptive does."""
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

    def _keep_books(self) -> None:
        now = time.time()
        elapsed, self._sampled = now - self._sampled, now
        cluster = self._cluster
        for name, job in list(cluster.workers.items()):
            record = self.book.get(name)
            if record is None:
                kind = name.split("-")[1] if name.startswith("pilot-") else ""
                record = self.book[name] = PilotRecord(name=name, kind=kind, submitted=now)
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
        books = {
            "records": [record.to_wire() for record in self.book.values()],
            "account": account(self.book.values(), time.time()),
            "kinds": self.kinds,
            "minimum": self.minimum,
            "maximum": self.maximum,
        }
        self._cluster.scheduler.set_metadata(keys=POOL_KEY, value=books)

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
                try:
                    await job.close()
                except Exception as error:  # the batch job is already gone
                    logger.debug("closing departed pilot %s: %r", name, error)


def kind_wanted(cluster: Any, kinds: list[Any]) -> int:
    """Which kind of pilot to submit next: the GPU type with the most ready jobs per
    pilot of that type (as published by the executor), else the kind with fewest."""
    from ..fleet.pool import next_kind

    held = [0] * len(kinds)
    for name in cluster.worker_spec:
        index = cluster.pilot_kinds.get(name)
        if index is not None:
            held[index] += 1
    published = None
    if cluster.scheduler is not None:
        published = cluster.scheduler.get_metadata(keys=DEMAND_KEY, default=None)
    by_model = published.get("by_gpu_model", {}) if isinstance(published, dict) else {}
    wanted = [int(by_model.get(kind.gpu_type or "", 0)) for kind in kinds]
    return next_kind(wanted, held)


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
