"""The context server: the state of one Dask worker process that runs jobs.

It runs context jobs in-process against its :class:`~.cache.ContextCache` and plain
jobs as subprocesses, sends the fleet's events about them, and reports its
inventory. One instance per process (:meth:`ContextServer.current`).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from ..defaults import DEFAULT_MEMORY_BUDGET
from ..fleet import events as ev
from ..fleet.state import CPU_MODEL, model_of
from ..jobspec import ContextJobSpec, JobResult, PlainJobSpec, ServerIdentity
from .blackhole import gpu_failure, recycle
from .cache import ContextCache, ServerStats, free_gpu_cache, resolve_budget
from .concurrency import ServerSlots
from .contextjob import run_context
from .limits import MemoryWatchdog, ServerLimits, run_limited
from .pgroups import GroupRecord
from .plain import run_plain_job
from .running import RunningJob

__all__ = ["ContextServer", "ServerConfig"]

logger = logging.getLogger(__name__)


@dataclass
class ServerConfig:
    """How a server is set up (passed to its worker process by the cluster)."""

    name: str = ""
    #: A fraction of the server's memory ("0.8") or a size ("6GB").
    memory_budget: str = DEFAULT_MEMORY_BUDGET
    #: The GPU this server is pinned to, as a GpuInfo dict; None on a CPU server.
    gpu: dict[str, Any] | None = None
    #: Memory of the server in bytes (its share of RAM); 0 = ask the worker.
    memory_bytes: int = 0
    #: Seconds without its scheduler after which the server stops its jobs (0: never).
    lease: float = 30.0
    #: Seconds between SIGTERM and the server's exit (:mod:`.drain`).
    drain_grace: float = 30.0
    #: Start the plain-job zygote at once (a persistent cluster), not at a first job.
    warm_zygote: bool = False
    #: Cap of the server and its children ("8GB"; "": the environment's; see .limits).
    memory_cap: str = ""
    #: Restart after this many leaking jobs (0: never; -1: the environment's, or 3).
    recycle_after_leaks: int = -1
    #: When the server retires (a pilot, before its walltime); None: not planned.
    retires_at: float | None = None
    #: Jobs it runs at once (Dask's threads), and the thread pools' size of each
    #: in-process job (0: the rule's threads).
    slots: int = 1
    threads_per_slot: int = 0
    #: Defaults of the contexts' batched() functions (0: each function's own).
    batch_max: int = 0
    batch_wait: float = 0.0


class ContextServer:
    """The contexts and running jobs of this process (one per Dask worker)."""

    _current: ClassVar[ContextServer | None] = None
    _current_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, config: ServerConfig, address: str = "", worker: Any = None) -> None:
        from .nvml import own_gpu

        self.config = config
        self.config.gpu = own_gpu(config.gpu)
        self._worker = worker
        self.identity = ServerIdentity(
            name=config.name or f"server-{os.getpid()}",
            host=socket.gethostname(),
            pid=os.getpid(),
            address=address,
        )
        memory = config.memory_bytes or _total_memory()
        if config.gpu:
            memory = int(config.gpu.get("memory_bytes") or memory)
        self.memory_bytes = memory
        self.budget = resolve_budget(config.memory_budget, memory)
        self.stats = ServerStats()
        self.cache = ContextCache(
            address=address,
            budget=self.budget,
            stats=self.stats,
            emit=self.emit,
            where=self.identity.describe(),
            gpu_model=self.gpu_model,
            memory_in_use=self._memory_in_use,
            on_evict=free_gpu_cache if config.gpu else lambda: None,
        )
        self.slots = ServerSlots(
            config.slots,
            capacity=memory,
            gpu=bool(config.gpu),
            where=self.identity.describe(),
            loaded_bytes=self.cache.bytes_loaded,
            said=lambda identity, jobs: self.emit(
                ev.ContextShared(address=self.identity.address, identity=identity, jobs=jobs)
            ),
        )
        self._lock = threading.RLock()
        self._running: dict[str, RunningJob] = {}
        self.leaky_jobs = 0
        self.limits = ServerLimits.of(config.memory_cap, config.recycle_after_leaks)
        self._watchdog = (
            MemoryWatchdog(self.limits.memory_cap, self._memory_exceeded)
            if self.limits.memory_cap
            else None
        )
        #: Set on SIGTERM (:mod:`.drain`): no new job starts.
        self.draining = False
        self._durations: dict[str | None, tuple[int, float]] = {}
        #: The process groups of this server's plain jobs, on local disk.
        self.groups = GroupRecord.of_this_server(self.identity.name)

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
                config = ServerConfig(name=name, memory_bytes=memory, slots=slots)
                cls._current = cls(config, address, worker)
                cls._current.announce()
            return cls._current

    # -- events --------------------------------------------------------------------

    def emit(self, *events: ev.Event) -> None:
        """Send events to the scheduler (and so to the catalog). Best-effort: a job's
        outcome travels with its result, never only here; a failure is logged."""
        worker = self._worker
        if worker is None:
            return
        try:
            worker.log_event(ev.TOPIC, ev.encode(events))
        except Exception as error:
            logger.debug("could not send %d event(s): %r", len(events), error)

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

    def run_bounded(self, spec: ContextJobSpec | PlainJobSpec) -> JobResult:
        """Run one job under its limits (runtime, memory cap), if it has any."""
        if spec.runtime_minutes is None and self.limits.memory_cap is None:
            return self.run(spec)
        return run_limited(self, spec)

    def running_job(self, key: str) -> RunningJob | None:
        """The running job of that key, if it runs here."""
        with self._lock:
            return self._running.get(key)

    def _memory_exceeded(self, rss: int) -> None:
        with self._lock:
            jobs = [job for job in self._running.values() if not job.limit]
        for job in jobs:
            job.limit = self.limits.memory_message(rss)

    def restart_after(self, key: str, why: str) -> None:
        """Take no new job, and end this process once the executor has the result of
        ``key``; its nanny starts a fresh one (:func:`.blackhole.recycle`)."""
        if self._worker is None:
            logger.warning("cannot restart %s (%s): no worker", self.identity.describe(), why)
            return
        recycle(self._worker, self, key, why)

    def run(self, spec: ContextJobSpec | PlainJobSpec) -> JobResult:
        """Run one job and report its outcome; never raises for a job's own failure."""
        identity = spec.declaration.identity if isinstance(spec, ContextJobSpec) else None
        while self.draining:  # never started here: placed again once the server is gone
            time.sleep(1.0)
        running = RunningJob(
            spec.key, threading.get_ident(), identity=identity, started=time.time()
        )
        with self._lock:
            self._running[spec.key] = running
            self.groups.started(spec.key)
        self.emit(
            ev.JobStarted(
                run_id=spec.run_id, key=spec.key, address=self.identity.address, context=identity
            )
        )
        trace = self.cache.track()
        try:
            if isinstance(spec, ContextJobSpec):
                result = run_context(
                    spec,
                    running,
                    cache=self.cache,
                    slots=self.slots,
                    identity=self.identity,
                    threads_per_slot=self.config.threads_per_slot,
                )
            else:
                result = run_plain_job(spec, self.identity, running, self.groups)
            result.evicted = list(trace.evicted)
            result.conversions, result.reload_seconds = trace.conversions, trace.reload_seconds
        finally:
            running.leave_phase()
            self.cache.stop_tracking()
            with self._lock:
                self._running.pop(spec.key, None)
                self.groups.finished(spec.key)
            running.done.set()
        self.emit(
            ev.JobFinished(
                run_id=spec.run_id,
                key=spec.key,
                address=self.identity.address,
                ok=result.ok,
                cancelled=result.cancelled,
                started=result.started,
                finished=result.finished,
                items=result.items,
                load_seconds=result.load_seconds,
                loaded=list(result.loaded),
                context=identity,
                gpu_model=self.gpu_model,
            )
        )
        for warning in result.extra.get("warnings", ()):
            logger.warning("%s", warning)
        if result.extra.get("leaks", {}).get("threads"):
            self.leaky_jobs += 1
            if self.limits.recycle_after and self.leaky_jobs >= self.limits.recycle_after:
                result.extra.setdefault("warnings", []).append(
                    f"{self.identity.describe()} restarts: {self.leaky_jobs} jobs left "
                    "threads running (--context-recycle-after-leaks)."
                )
                self.restart_after(spec.key, f"{self.leaky_jobs} jobs left threads running")
        self.stats.jobs += 1
        if result.ok:
            count, total = self._durations.get(identity, (0, 0.0))
            self._durations[identity] = (count + 1, total + result.finished - result.started)
        if result.cancelled:
            self.stats.jobs_cancelled += 1
        elif not result.ok:
            self.stats.jobs_failed += 1
            self._after_failure(spec.key, result.message or "")
        return result

    def _after_failure(self, key: str, message: str) -> None:
        """A CUDA-fatal error recycles the server; a CUDA OOM frees the cache."""
        failure = gpu_failure(message)
        if failure == "fatal":
            text = message.strip().splitlines()[0][:200] if message.strip() else ""
            recycle(self._worker, self, key, f"recycled after a CUDA-fatal error: {text}")
        elif failure == "oom":
            self.stats.cuda_ooms += 1
            free_gpu_cache()

    def cancel(self, keys: list[str], grace: float = 10.0) -> dict[str, str]:
        """Stop the named jobs if they run here: 'stopped', 'running' (stuck) or absent."""
        with self._lock:
            targets = {key: self._running[key] for key in keys if key in self._running}
        for job in targets.values():
            job.request_cancel()
        deadline = time.monotonic() + grace
        outcome = {}
        for key, job in targets.items():
            finished = job.done.wait(max(0.0, deadline - time.monotonic()))
            outcome[key] = "stopped" if finished else "running"
        return outcome

    def shutdown(self) -> None:
        """Stop every running job and the memory watchdog (the worker is closing)."""
        if self._watchdog is not None:
            self._watchdog.stop()
        with self._lock:
            keys = list(self._running)
        if keys:
            self.cancel(keys, grace=5.0)

    def running_jobs(self) -> dict[str, RunningJob]:
        """The jobs running now, by key."""
        with self._lock:
            return dict(self._running)

    def mean_job_seconds(self, identity: str | None) -> float | None:
        """The mean time of this server's successful jobs of that context (None:
        none yet; ``identity`` None: plain jobs)."""
        count, total = self._durations.get(identity, (0, 0.0))
        return total / count if count else None

    def wait_done(self, key: str, timeout: float) -> bool:
        """Wait up to ``timeout`` s for job ``key`` to end; whether it has."""
        job = self.running_jobs().get(key)
        return job is None or job.done.wait(max(0.0, timeout))

    def stop_everything(self, why: str) -> None:
        """Stop every running job at once and kill its process group."""
        with self._lock:
            keys = list(self._running)
        logger.warning("stopping %d job(s): %s", len(keys), why)
        self.groups.kill_all()
        if keys:
            self.cancel(keys, grace=2.0)

    def inventory(self) -> dict[str, Any]:
        """Contexts, load seconds, bytes, hits, evictions, conversions and jobs."""
        loaded = self.cache.inventory()
        with self._lock:
            running = list(self._running)
        return {
            "server": asdict(self.identity),
            "gpu": self.config.gpu,
            "memory_bytes": self.memory_bytes,
            "memory_budget": self.budget,
            "bytes_loaded": sum(item["bytes"] for item in loaded),
            "contexts": loaded,
            "running": running,
            "slots": self.slots.snapshot(),
            **asdict(self.stats),
        }


def _total_memory() -> int:
    import psutil

    return int(psutil.virtual_memory().total)
