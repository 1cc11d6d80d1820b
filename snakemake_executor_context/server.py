"""The context server: the state of one Dask worker process that runs jobs.

It loads contexts lazily, in the job's thread (never on the worker's event loop, so
heartbeats go on during a long load), keeps them by identity, evicts the least
recently used one when a memory budget is exceeded, runs context jobs in-process and
plain jobs as subprocesses, and reports its inventory.

The module-level functions (:func:`execute_job`, :func:`cancel_jobs`,
:func:`server_inventory`, :func:`server_versions`) are what the executor submits
through Dask.
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from distributed.diagnostics.plugin import WorkerPlugin

from . import contexts
from ._version import __version__
from .catalog import events as ev
from .contexts import ContextDeclaration, JobHooks, LoadRecord
from .errors import ContextLoadError, JobCancelled
from .inprocess import RunningJob, run_context_job, torch_threads
from .jobspec import ContextJobSpec, JobResult, PlainJobSpec, ServerIdentity

__all__ = [
    "ContextServer",
    "ContextServerPlugin",
    "ServerConfig",
    "cancel_jobs",
    "execute_job",
    "probe_caches",
    "resolve_budget",
    "server_inventory",
    "server_versions",
]


@dataclass
class ServerConfig:
    """How a server is set up (passed to its worker process by the cluster)."""

    name: str = ""
    #: A fraction of the server's memory ("0.8") or a size ("6GB").
    memory_budget: str = "0.8"
    #: The GPU this server is pinned to, as a GpuInfo dict; None on a CPU server.
    gpu: dict[str, Any] | None = None
    #: Memory of the server in bytes (its share of RAM); 0 = ask the worker.
    memory_bytes: int = 0


def resolve_budget(spec: str | float, memory_bytes: int) -> int:
    """Bytes a server may fill with contexts: a fraction of its memory, or a size."""
    text = str(spec).strip()
    try:
        fraction = float(text)
    except ValueError:
        from dask.utils import parse_bytes

        return int(parse_bytes(text))
    if not 0 < fraction <= 1:
        raise ValueError(f"memory budget fraction must be in (0, 1], got {text}")
    return int(memory_bytes * fraction)


@dataclass
class LoadedContext:
    """A context held by a server."""

    identity: str
    names: set[str]
    loader: str
    obj: Any
    nbytes: int
    load_seconds: float
    loaded_at: float
    last_used: float
    hits: int = 0
    pins: int = 0
    conversions: int = 0


@dataclass
class ServerStats:
    """Counters a server reports in its inventory."""

    loads: int = 0
    load_seconds: float = 0.0
    hits: int = 0
    evictions: int = 0
    conversions: int = 0
    jobs: int = 0
    jobs_failed: int = 0
    jobs_cancelled: int = 0
    load_failures: int = 0
    evicted: list[str] = field(default_factory=list)


class ContextServer:
    """The contexts and running jobs of this process (one per Dask worker)."""

    _current: ClassVar[ContextServer | None] = None
    _current_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, config: ServerConfig, address: str = "", worker: Any = None) -> None:
        self.config = config
        self.config.gpu = _own_gpu(config.gpu)
        self._worker = worker
        self._local = threading.local()
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
        self._contexts: OrderedDict[str, LoadedContext] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self._lock = threading.RLock()
        self._load_locks: dict[str, threading.Lock] = {}
        self._running: dict[str, RunningJob] = {}

    # -- the process-wide instance -------------------------------------------------

    @classmethod
    def install(cls, config: ServerConfig, address: str = "", worker: Any = None) -> ContextServer:
        """Make a server for this process (replacing any earlier one)."""
        with cls._current_lock:
            cls._current = cls(config, address, worker)
            return cls._current

    @classmethod
    def current(cls) -> ContextServer:
        """This process's server; made with defaults on a worker without the plugin."""
        with cls._current_lock:
            if cls._current is None:
                name, address, memory, worker = "", "", 0, None
                try:
                    from distributed import get_worker

                    worker = get_worker()
                    name, address = str(worker.name), worker.address
                    memory = int(worker.memory_manager.memory_limit or 0)
                except ValueError:
                    pass
                config = ServerConfig(name=name, memory_bytes=memory)
                cls._current = cls(config, address, worker)
                cls._current.announce()
            return cls._current

    # -- events --------------------------------------------------------------------

    def emit(self, *events: ev.Event) -> None:
        """Send events to the scheduler (and so to the catalog); never raises."""
        worker = self._worker
        if worker is None:
            return
        try:
            worker.log_event(ev.TOPIC, ev.encode(events))
        except Exception:
            pass

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
        )

    def announce(self) -> None:
        """Describe this server to the scheduler (GPU record, budget, process)."""
        self.emit(self.described())

    @property
    def gpu_model(self) -> str:
        """The normalised model of its GPU, or 'cpu'."""
        from .fleet import model_of

        return model_of({}, self.config.gpu) if self.config.gpu else "cpu"

    # -- contexts ------------------------------------------------------------------

    def acquire(self, declaration: ContextDeclaration) -> tuple[Any, float, bool]:
        """The loaded object of a context, pinned until :meth:`release`:
        (object, load seconds, loaded now)."""
        identity = declaration.identity
        with self._lock:
            entry = self._contexts.get(identity)
            if entry is not None:
                return self._hit(entry, declaration), 0.0, False
            load_lock = self._load_locks.setdefault(identity, threading.Lock())
        with load_lock:
            with self._lock:
                entry = self._contexts.get(identity)
                if entry is not None:
                    return self._hit(entry, declaration), 0.0, False
                self._make_room(self._sizes.get(identity, 0), keep=None)
            return self._load(declaration)

    def _hit(self, entry: LoadedContext, declaration: ContextDeclaration) -> Any:
        entry.pins += 1
        entry.hits += 1
        entry.last_used = time.time()
        entry.names.add(declaration.name)
        self.stats.hits += 1
        self._contexts.move_to_end(entry.identity)
        return entry.obj

    def _load(self, declaration: ContextDeclaration) -> tuple[Any, float, bool]:
        record = LoadRecord()
        self.emit(
            ev.ContextLoading(
                address=self.identity.address,
                identity=declaration.identity,
                name=declaration.name,
                loader=declaration.loader,
                arguments=dict(declaration.kwargs),
                from_cache=_probe(declaration),
            )
        )
        before = self._memory_in_use()
        started = time.perf_counter()
        try:
            obj = contexts.call_loader(declaration, record)
        except (ContextLoadError, JobCancelled) as error:
            self.stats.load_failures += 1
            self._load_failed(declaration, error)
            raise
        except BaseException as error:
            self.stats.load_failures += 1
            self._load_failed(declaration, error)
            raise ContextLoadError(
                f"Context '{declaration.name}': loader '{declaration.loader}' raised "
                f"{type(error).__name__}: {error} on {self.identity.describe()}. The "
                "next job that needs this context tries the load again. Fix: see the "
                "loader's traceback in this job's log."
            ) from error
        seconds = time.perf_counter() - started
        nbytes = record.declared_bytes
        if nbytes is None:
            nbytes = max(0, self._memory_in_use() - before)
        now = time.time()
        entry = LoadedContext(
            identity=declaration.identity,
            names={declaration.name},
            loader=declaration.loader,
            obj=obj,
            nbytes=nbytes,
            load_seconds=seconds,
            loaded_at=now,
            last_used=now,
            conversions=record.conversions,
        )
        with self._lock:
            self._contexts[declaration.identity] = entry
            self._sizes[declaration.identity] = nbytes
            self.stats.loads += 1
            self.stats.load_seconds += seconds
            self.stats.conversions += record.conversions
            entry.pins += 1
            self._make_room(0, keep=declaration.identity)
        self.emit(
            ev.ContextReady(
                address=self.identity.address,
                identity=declaration.identity,
                load_seconds=seconds,
                bytes=nbytes,
                gpu_model=self.gpu_model,
            )
        )
        return obj, seconds, True

    def _load_failed(self, declaration: ContextDeclaration, error: BaseException) -> None:
        self.emit(
            ev.ContextLoadFailed(
                address=self.identity.address,
                identity=declaration.identity,
                error=f"{type(error).__name__}: {error}"[:1000],
            )
        )

    def _make_room(self, incoming: int, keep: str | None) -> None:
        """Evict least recently used, unpinned contexts until the budget holds."""
        while self._bytes_loaded() + incoming > self.budget:
            victim = next(
                (e for e in self._contexts.values() if e.pins == 0 and e.identity != keep),
                None,
            )
            if victim is None:
                return
            self._evict(victim)

    def _evict(self, entry: LoadedContext) -> None:
        del self._contexts[entry.identity]
        self.stats.evictions += 1
        self.stats.evicted.append(entry.identity)
        evicted = getattr(self._local, "evicted", None)
        if evicted is not None:
            evicted.append(entry.identity)
        self.emit(ev.ContextEvicted(address=self.identity.address, identity=entry.identity))
        close = getattr(entry.obj, "close", None)
        entry.obj = None
        if callable(close):
            try:
                close()
            except Exception:
                pass
        del close
        gc.collect()
        torch = sys.modules.get("torch")
        if torch is not None and self.config.gpu and torch.cuda.is_available():
            torch.cuda.empty_cache()

    def release(self, identity: str) -> None:
        """A job is done with a context it acquired: it may be evicted again."""
        with self._lock:
            entry = self._contexts.get(identity)
            if entry is not None:
                entry.pins -= 1

    def _bytes_loaded(self) -> int:
        return sum(entry.nbytes for entry in self._contexts.values())

    def _memory_in_use(self) -> int:
        torch = sys.modules.get("torch")
        if torch is not None and self.config.gpu and torch.cuda.is_available():
            return int(torch.cuda.memory_allocated())
        import psutil

        return int(psutil.Process().memory_info().rss)

    # -- jobs ----------------------------------------------------------------------

    def run(self, spec: ContextJobSpec | PlainJobSpec) -> JobResult:
        """Run one job and report its outcome; never raises for a job's own failure."""
        running = RunningJob(key=spec.key, thread_id=threading.get_ident())
        identity = spec.declaration.identity if isinstance(spec, ContextJobSpec) else None
        with self._lock:
            self._running[spec.key] = running
        self.emit(
            ev.JobStarted(
                run_id=spec.run_id, key=spec.key, address=self.identity.address, context=identity
            )
        )
        self._local.evicted = []
        try:
            if isinstance(spec, ContextJobSpec):
                result = self._run_context(spec, running)
            else:
                result = self._run_plain(spec, running)
            result.evicted = list(self._local.evicted)
        finally:
            self._local.evicted = None
            with self._lock:
                self._running.pop(spec.key, None)
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
        self.stats.jobs += 1
        if result.cancelled:
            self.stats.jobs_cancelled += 1
        elif not result.ok:
            self.stats.jobs_failed += 1
        return result

    def _run_context(self, spec: ContextJobSpec, running: RunningJob) -> JobResult:
        held: dict[str, Any] = {}  # identity -> object, pinned for this job
        loaded: list[str] = []
        reused: list[str] = []
        load_seconds = 0.0

        def acquire(declaration: ContextDeclaration) -> Any:
            nonlocal load_seconds
            if declaration.identity in held:
                return held[declaration.identity]
            obj, seconds, cold = self.acquire(declaration)
            held[declaration.identity] = obj
            (loaded if cold else reused).append(declaration.identity)
            load_seconds += seconds
            return obj

        hooks = JobHooks(provider=_Provider(acquire))
        contexts.set_current_job(hooks)
        try:
            result = run_context_job(spec, self.identity, acquire, running, torch_threads)
        finally:
            contexts.set_current_job(None)
            for identity in held:
                self.release(identity)
            held.clear()
        result.items = hooks.items
        result.loaded, result.reused = loaded, reused
        result.load_seconds = load_seconds
        return result

    def _run_plain(self, spec: PlainJobSpec, running: RunningJob) -> JobResult:
        started = time.time()
        log_path = os.path.join(spec.workdir, spec.log_path)
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                spec.command,
                shell=True,
                cwd=spec.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            running.process = process
            if running.cancel_requested:
                running.kill_process()
            returncode = process.wait()
        result = JobResult(
            key=spec.key,
            ok=returncode == 0,
            server=self.identity,
            started=started,
            finished=time.time(),
            log_path=log_path,
        )
        if running.cancel_requested:
            result.ok, result.cancelled = False, True
            result.message = f"{spec.title}: cancelled on {self.identity.describe()}."
        elif returncode != 0:
            result.message = (
                f"{spec.title}: the job's snakemake process exited with status "
                f"{returncode} on {self.identity.describe()}; its log is {log_path}."
            )
        return result

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
        """Stop every running job (the worker is closing)."""
        with self._lock:
            keys = list(self._running)
        if keys:
            self.cancel(keys, grace=5.0)

    def inventory(self) -> dict[str, Any]:
        """Contexts, load seconds, bytes, hits, evictions, conversions and jobs."""
        with self._lock:
            loaded = [
                {
                    "identity": e.identity,
                    "names": sorted(e.names),
                    "loader": e.loader,
                    "bytes": e.nbytes,
                    "load_seconds": round(e.load_seconds, 3),
                    "hits": e.hits,
                    "pins": e.pins,
                    "conversions": e.conversions,
                    "loaded_at": e.loaded_at,
                    "last_used": e.last_used,
                }
                for e in self._contexts.values()
            ]
            stats = asdict(self.stats)
            running = list(self._running)
        return {
            "server": asdict(self.identity),
            "gpu": self.config.gpu,
            "memory_bytes": self.memory_bytes,
            "memory_budget": self.budget,
            "bytes_loaded": sum(item["bytes"] for item in loaded),
            "contexts": loaded,
            "running": running,
            **stats,
        }


class _Provider:
    def __init__(self, acquire: Any) -> None:
        self._acquire = acquire

    def acquire(self, declaration: ContextDeclaration) -> Any:
        return self._acquire(declaration)


# ------------------------------------------------------------------------------------
# Entry points submitted through Dask.


def execute_job(spec: ContextJobSpec | PlainJobSpec) -> JobResult:
    """Run a job on the server of the worker this task landed on."""
    return ContextServer.current().run(spec)


async def cancel_jobs(keys: list[str], grace: float = 10.0) -> dict[str, str]:
    """Stop the named jobs on this server (run on every worker by the executor).

    A coroutine, so that waiting for the jobs to stop does not block the worker's
    event loop (heartbeats, the job's own completion message).
    """
    import asyncio

    return await asyncio.to_thread(ContextServer.current().cancel, keys, grace)


def probe_caches(declarations: list[ContextDeclaration]) -> list[str]:
    """The identities whose weights this server's local disk holds (cache probes)."""
    return [d.identity for d in declarations if _probe(d)]


def server_inventory() -> dict[str, Any]:
    """This server's inventory."""
    return ContextServer.current().inventory()


def server_versions() -> dict[str, str]:
    """The versions that must agree between the executor and its servers."""
    import distributed
    import snakemake

    return {
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "snakemake": snakemake.__version__,
        "snakemake-executor-plugin-context": __version__,
        "distributed": distributed.__version__,
    }


class ContextServerPlugin(WorkerPlugin):
    """Turns a Dask worker into a context server."""

    name = "snakemake-context-server"

    def __init__(self, config: ServerConfig) -> None:
        self.config = config

    def setup(self, worker: Any) -> None:
        """Install the server; leave the terminal's Ctrl-C to the Snakemake process."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        config = ServerConfig(**asdict(self.config))
        config.name = config.name or str(worker.name)
        if not config.memory_bytes:
            config.memory_bytes = int(worker.memory_manager.memory_limit or 0)
        server = ContextServer.install(config, worker.address, worker)
        # Worker plugins are set up before the worker registers with the scheduler,
        # and events sent before that are dropped: announce once it is connected.
        worker.loop.add_callback(_announce_when_connected, worker, server)

    def teardown(self, worker: Any) -> None:
        """Stop running jobs before the worker goes."""
        server = ContextServer._current
        if server is not None:
            server.shutdown()


async def _announce_when_connected(worker: Any, server: ContextServer) -> None:
    import asyncio

    for _ in range(600):
        stream = getattr(worker, "batched_stream", None)
        if stream is not None and stream.comm is not None and not stream.comm.closed():
            server.announce()
            return
        await asyncio.sleep(0.05)


def _own_gpu(configured: dict[str, Any] | None) -> dict[str, Any] | None:
    """This server's GPU record, read through NVML by the UUID it is pinned to.

    CUDA and NVML may number devices differently: only the UUID is trusted. Without
    a configured GPU, a single visible GPU is taken; a CPU server (no
    ``CUDA_VISIBLE_DEVICES`` GPU, no NVML) has none.
    """
    from .gpus import discover_gpus, gpu_by_uuid

    try:
        if configured and configured.get("uuid"):
            found = gpu_by_uuid(str(configured["uuid"]))
            return asdict(found) if found is not None else configured
        if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
            return None
        visible = discover_gpus()
        return asdict(visible[0]) if len(visible) == 1 else configured
    except Exception:
        return configured


def _probe(declaration: ContextDeclaration) -> bool | None:
    """The loader's cache probe (None without one, or if it fails)."""
    try:
        return contexts.cache_probe(declaration)
    except Exception:
        return None


def _total_memory() -> int:
    import psutil

    return int(psutil.virtual_memory().total)
