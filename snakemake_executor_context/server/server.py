"""The context server: the state of one Dask worker process that runs jobs.

It holds the contexts (:class:`~.cache.ContextCache`), the slots
(:class:`~.slots.serverslots.ServerSlots`) and the jobs (:class:`~.jobs.ServerJobs`)
of its process, sends the fleet's events, and reports its inventory. It owns its
life: every way a server ends early (a drain on SIGTERM, a recycle after a CUDA-fatal
error, a leak count or a job that will not stop) goes through
:meth:`ContextServer.leave`, which the policies of :mod:`.policy` only inform with their
decisions. One instance per process (:meth:`ContextServer.current`).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, ClassVar

from ..defaults import NODE_VARIABLE
from ..fleet import events as ev
from ..fleet.gpus import GpuInfo, stands_in
from ..fleet.losses import LossKind, classify
from ..fleet.outcome import ServerIdentity
from ..fleet.state import CPU_MODEL, model_of
from ..fleet.survival import survival_group
from ..gang import GangOptions, RankLoss
from ..gang.devices import device_list
from ..gang.start import RemoteDevice
from ..settings.shape import Shape
from ..strays.processgroups import GroupRecord
from .cache import ContextCache, free_gpu_cache, resolve_budget
from .config import ServerConfig
from .inventory import ServerInventory, ServerStats, SlotState, fields_of
from .jobs import ServerJobs
from .loadturns import LoadTurns
from .memwatch import MemoryWatchdog
from .outbox import Outbox
from .peers.holder import TemplateHolder
from .peers.reach import DaskPeers
from .peers.receiver import PeerFetch
from .policy import DRAINED_EXIT, RECYCLE_GRACE, ServerLimits, plan_drain
from .slots.serverslots import ServerSlots

__all__ = ["ContextServer", "survival_group_here"]

logger = logging.getLogger(__name__)

#: Seconds a leaving server waits for a job's result to be taken by the executor.
RESULT_TAKEN_SECONDS = 30.0


class ContextServer:
    """The contexts and running jobs of this process (one per Dask worker)."""

    _current: ClassVar[ContextServer | None] = None
    _current_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, config: ServerConfig, address: str = "", worker: Any = None) -> None:
        from .nvml import own_gpu

        self.config = config
        self.config.gpu = own_gpu(config.gpu)
        self._worker = worker
        self._outbox = Outbox(worker)
        self.identity = ServerIdentity(
            name=config.name or f"server-{os.getpid()}",
            host=os.environ.get(NODE_VARIABLE) or socket.gethostname(),
            pid=os.getpid(),
            address=address,
        )
        memory = config.memory_bytes or _total_memory()
        if config.gpu and config.gpu.get("memory_bytes"):
            # Its GPUs' memory: a server of k GPUs (one model per server) holds k times one.
            memory = int(config.gpu["memory_bytes"]) * max(1, config.devices)
        self.memory_bytes = memory
        self.budget = resolve_budget(config.memory_budget, memory)
        self.stats = ServerStats()
        #: The devices it owns, in order: one rank of a gang on each (:mod:`..gang`).
        cuda = config.gpu is not None and not stands_in(config.gpu)
        self.devices = device_list(config.devices if cuda else 0, config.devices)
        self.cache = ContextCache(
            address=address,
            budget=self.budget,
            stats=self.stats,
            emit=self.emit,
            where=self.identity.describe(),
            gpu_model=self.gpu_model,
            memory_in_use=self._memory_in_use,
            on_evict=free_gpu_cache if config.gpu else lambda: None,
            turns=LoadTurns(config.loads_per_source),
            fetch=self._peer_fetch(config, address, worker),
            gang=GangOptions(
                devices=tuple(self.devices),
                timeout=config.shape.gang_timeout,
                on_broken=self.gang_lost,
                node=self.identity.host,
                shard_budget=self.budget // max(1, len(self.devices)),
            ),
        )
        self.slots = ServerSlots(
            config.shape.slots,
            capacity=memory,
            gpu=bool(config.gpu),
            where=self.identity.describe(),
            loaded_bytes=self.cache.bytes_loaded,
            said=lambda identity, jobs: self.emit(
                ev.ContextShared(address=self.identity.address, identity=identity, jobs=jobs)
            ),
        )
        self._lock = threading.RLock()
        #: Set once it leaves (or drains): no new job starts.
        self.draining = False
        self._leaving = False
        #: Jobs it handed back as it left: they run again elsewhere, so their
        #: results never leave this process.
        self._handed_back: set[str] = set()
        #: The process groups of this server's plain jobs, on local disk.
        self.groups = GroupRecord.of_this_server(self.identity.name)
        limits = ServerLimits.from_environment()
        self.jobs = ServerJobs(
            identity=self.identity,
            cache=self.cache,
            slots=self.slots,
            groups=self.groups,
            stats=self.stats,
            limits=limits,
            gpu_model=self.gpu_model,
            threads_per_slot=config.shape.threads_per_slot,
            emit=self.emit,
            recycle=self.recycle,
            draining=lambda: self.draining,
            abandoned=self._handed_back.__contains__,
        )
        self._watchdog = (
            MemoryWatchdog(limits.memory_cap, self.jobs.memory_exceeded)
            if limits.memory_cap
            else None
        )

    def _peer_fetch(self, config: ServerConfig, address: str, worker: Any) -> PeerFetch | None:
        """Serve templates to peers and fetch missing ones from them (on a worker)."""
        if worker is None or config.shape.peer_transfers <= 0:
            return None
        holder = TemplateHolder(
            config.shape.peer_transfers, config.shape.peer_rate, address=address, emit=self.emit
        )
        holder.install(worker)
        return PeerFetch(address, DaskPeers(worker), emit=self.emit, model=self.gpu_model)

    # -- the process-wide instance -------------------------------------------------

    @classmethod
    def install(cls, config: ServerConfig, address: str = "", worker: Any = None) -> ContextServer:
        """Make a server for this process (replacing any earlier one)."""
        with cls._current_lock:
            cls._current = cls(config, address, worker)
            # What a dead predecessor of this server left running dies now.
            killed = cls._current.groups.kill_all()
            if killed:
                logger.warning("killed the process groups %s of a lost predecessor", killed)
            return cls._current

    @classmethod
    def current(cls) -> ContextServer:
        """This process's server; made with defaults on a worker without the plugin."""
        with cls._current_lock:
            if cls._current is None:
                name, address, memory, worker, slots = "", "", 0, None, 1
                try:
                    from distributed import get_worker

                    worker = get_worker()
                    name, address = str(worker.name), worker.address
                    memory = int(worker.memory_manager.memory_limit or 0)
                    slots = max(1, int(getattr(worker.state, "nthreads", 1) or 1))
                except ValueError:
                    slots = 1
                config = ServerConfig(name=name, memory_bytes=memory, shape=Shape(slots=slots))
                cls._current = cls(config, address, worker)
                cls._current.announce()
            return cls._current

    # -- events --------------------------------------------------------------------

    def emit(self, *events: ev.Event, now: bool = False) -> None:
        """Send events to the scheduler (and so to the catalog), with the others of
        their tick (:mod:`.outbox`); ``now``: at once, with all queued before."""
        self._outbox.put(events, now=now)

    def described(self) -> ev.ServerDescribed:
        """This server as a ServerDescribed event."""
        return ev.ServerDescribed(
            address=self.identity.address,
            name=self.identity.name,
            host=self.identity.host,
            pid=self.identity.pid,
            memory_bytes=self.memory_bytes,
            memory_budget=self.budget,
            gpu=self.config.gpu,
            retires_at=self.config.retires_at,
            allocated_at=self.config.allocated_at,
            group=self.config.group,
            partition=self.config.partition,
            pool=self.config.pool,
        )

    def announce(self) -> None:
        """Describe this server to the scheduler (GPU record, budget, process)."""
        self.emit(self.described())

    @property
    def gpu_model(self) -> str:
        """The normalised model of its GPU, or 'cpu'."""
        return model_of({}, self.config.gpu) if self.config.gpu else CPU_MODEL

    def _memory_in_use(self) -> int:
        torch = sys.modules.get("torch")
        if torch is not None and self.config.gpu and torch.cuda.is_available():
            return int(torch.cuda.memory_allocated())
        import psutil

        return int(psutil.Process().memory_info().rss)

    # -- jobs ----------------------------------------------------------------------

    def stop_everything(self, why: str) -> None:
        """Stop every running job at once and kill its process group (its lease on
        the scheduler ran out: the executor has requeued them)."""
        keys = list(self.jobs.running())
        logger.warning("stopping %d job(s): %s", len(keys), why)
        self.groups.kill_all()
        if keys:
            self.jobs.cancel(keys, grace=2.0)

    def shutdown(self) -> None:
        """Stop every running job and the memory watchdog (the worker is closing)."""
        if self._watchdog is not None:
            self._watchdog.stop()
        keys = list(self.jobs.running())
        if keys:
            self.jobs.cancel(keys, grace=5.0)

    # -- its end -------------------------------------------------------------------

    def drain(self, grace: float) -> None:
        """SIGTERM: finish the running jobs that fit ``grace`` (:mod:`.policy`), hand
        the others back at once, and leave."""
        with self._lock:
            if self.draining:
                return
        finishing, handed_back = plan_drain(
            {key: (job.identity, job.started) for key, job in self.jobs.running().items()},
            self.jobs.mean_job_seconds,
            time.time(),
            grace,
        )
        logger.warning(
            "SIGTERM: draining; finishing %s, handing back %s (grace %.0f s)",
            finishing,
            handed_back,
            grace,
        )
        # A job handed back runs elsewhere at once: nothing is worth waiting for then.
        wait = 0.0 if handed_back else max(0.0, grace - 2.0)
        self.leave(
            "SIGTERM",
            grace=grace,
            finishing=finishing,
            handed_back=handed_back,
            wait=wait,
            keep_running=True,
        )

    def recycle(self, key: str, why: str) -> None:
        """Take no new job and leave once the executor has job ``key``'s result (and
        the jobs in other slots have ended, :data:`.policy.RECYCLE_GRACE` at most);
        its nanny starts a fresh process."""
        if self._worker is None:
            logger.warning("cannot restart %s (%s): no worker", self.identity.describe(), why)
            return
        logger.error("recycling this server: %s", why)
        others = [k for k in self.jobs.running() if k != key]
        self.leave(why, finishing=[key, *others], wait=RESULT_TAKEN_SECONDS + RECYCLE_GRACE)

    def lead(self, remote: Sequence[RemoteDevice], spawn_remote: Any) -> None:
        """It leads servers on other nodes (pilots started as a gang): its gangs put
        ranks on their devices too, after its own."""
        assert self.cache.gang is not None  # every server's cache starts gangs
        self.cache.gang = replace(self.cache.gang, remote=tuple(remote), spawn_remote=spawn_remote)
        logger.warning(
            "leading %d device(s) on other servers: %s",
            len(remote),
            ", ".join(f"{d.device}@{d.node}" for d in remote),
        )

    def gang_lost(self, loss: RankLoss) -> None:
        """A rank of a gang died: the context is lost, and with it every job running
        here (a job's forward pass may have been mid-collective): they are handed
        back and run again, charged as the rank's end classifies it (a crash when it
        died by itself or of a SIGKILL nobody announced)."""
        cause = classify(exit_code=loss.exit_code)
        logger.error("gang lost: %s (%s)", loss.describe(), cause.kind)
        self.leave(
            f"gang lost: {loss.describe()}",
            handed_back=list(self.jobs.running()),
            keep_running=True,  # the record of what ran: the hub charges those jobs
            crashed=cause.kind == LossKind.CRASH,
        )

    def leave(
        self,
        why: str,
        *,
        finishing: Sequence[str] = (),
        handed_back: Sequence[str] = (),
        grace: float = 0.0,
        wait: float = 0.0,
        keep_running: bool = False,
        crashed: bool = False,
    ) -> None:
        """The one way out: take no new job, say why (:class:`~..fleet.events.
        ServerDraining`; ``crashed``: it was a crash, not a preemption), wait up to
        ``wait`` seconds for the ``finishing`` jobs to end and for the executor to take
        their results, kill the plain jobs' process groups (``keep_running``: not the
        ones still running) and exit. The ``handed_back`` jobs' results never leave."""
        with self._lock:
            if self._leaving:
                return
            self._leaving = self.draining = True
            self._handed_back.update(handed_back)
        event = ev.ServerDraining(
            address=self.identity.address,
            name=self.identity.name,
            why=why,
            crashed=crashed,
            grace=grace,
            finishing=list(finishing),
            handed_back=list(handed_back),
        )
        self.emit(event, now=True)
        threading.Thread(
            target=self._exit_after,
            args=(list(finishing), time.monotonic() + wait, keep_running),
            name="snakemake-context leaving",
            daemon=True,
        ).start()

    def _exit_after(self, finishing: list[str], deadline: float, keep_running: bool) -> None:
        for key in finishing:
            if self._worker is None:
                job = self.jobs.running().get(key)
                if job is not None:
                    job.done.wait(max(0.0, deadline - time.monotonic()))
            # A task's result leaves when its job ends, or at once when the job was
            # given up (stuck in C past its limit, its thread never ends): waiting for
            # the executor to take the result covers both, the thread only the first.
            while time.monotonic() < deadline and self._result_pending(key):
                time.sleep(0.05)
        self.groups.kill_all(keep_running=keep_running)
        time.sleep(0.3)  # let the batched stream carry the last events
        os._exit(DRAINED_EXIT)

    def _result_pending(self, key: str) -> bool:
        """Whether the executor has yet to take job ``key``'s result (the worker
        forgets the task once it has)."""
        worker = self._worker
        return worker is not None and key in worker.state.tasks

    def inventory(self) -> ServerInventory:
        """Contexts, load seconds, bytes, hits, evictions, conversions and jobs."""
        loaded = self.cache.inventory()
        gpu = self.config.gpu
        return ServerInventory(
            server=self.identity,
            gpu=GpuInfo(**gpu) if gpu else None,
            memory_bytes=self.memory_bytes,
            memory_budget=self.budget,
            bytes_loaded=sum(context.bytes for context in loaded),
            contexts=loaded,
            running=tuple(self.jobs.running()),
            slots=fields_of(SlotState, self.slots.snapshot()),
            counts=replace(self.stats, evicted=list(self.stats.evicted)),
        )


def survival_group_here() -> str:
    """The survival group (:func:`~..fleet.survival.survival_group`) of this process's
    server, '' where it has none or no server runs here (the injector's ``--group``
    asks each worker with it)."""
    server = ContextServer._current
    if server is None:
        return ""
    config = server.config
    return survival_group(config.group, config.partition, config.pool)


def _total_memory() -> int:
    import psutil

    return int(psutil.virtual_memory().total)
