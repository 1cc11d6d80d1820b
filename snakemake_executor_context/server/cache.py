"""The contexts one server holds: loaded lazily in the job's thread, kept by identity,
evicted least recently used first when the server's memory budget is exceeded (by
the fleet's one eviction order, :func:`..fleet.eviction.to_evict`). From its load to
its eviction, a context's template is held in the node's model cache; before the
load it is checked (:func:`.templates.checked_load`)."""

from __future__ import annotations

import gc
import logging
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import jobhooks, loaders
from ..contexts import ContextDeclaration
from ..errors import ContextLoadError, JobCancelled
from ..fleet import events as ev
from ..fleet.eviction import Held, to_evict
from ..gang import GangOptions
from ..jobhooks import LoadRecord
from ..strays.jobsweep import context_processes, end_context_processes
from .config import resolve_budget
from .inventory import HeldContext, ServerStats
from .loadturns import LoadTurns
from .templates import checked_load, probe

__all__ = [
    "ContextCache",
    "JobTrace",
    "LoadedContext",
    "probe",
    "resolve_budget",
]

logger = logging.getLogger(__name__)


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
    #: Workflow modules first imported while it loaded: they go when it goes.
    modules: list[str] = field(default_factory=list)
    #: Whether its loader lets two jobs use it at once, and the working memory one
    #: job needs beside it (declared by the loader; None: not declared).
    shareable: bool = True
    job_bytes: int | None = None
    #: Its gang, when it spans several processes (:mod:`..gang`).
    gang: Any = None
    #: Ends its hold of its template in the node's cache (:func:`..loaders.hold_template`).
    release: Callable[[], None] = lambda: None


@dataclass
class JobTrace:
    """What one job's loads did on a server: evictions, conversions, and how long
    its converting load took after converting."""

    evicted: list[str] = field(default_factory=list)
    conversions: int = 0
    reload_seconds: float | None = None


class ContextCache:
    """Loaded contexts by identity, pinned while jobs use them.

    ``emit`` sends the fleet's events (loading, ready, failed, evicted); ``where``
    names the server in error messages; ``memory_in_use`` measures a load's size when
    the loader does not declare it; ``turns`` spaces loads from a shared source.
    """

    def __init__(
        self,
        *,
        address: str,
        budget: int,
        stats: ServerStats,
        emit: Callable[..., None],
        where: str,
        gpu_model: str,
        memory_in_use: Callable[[], int],
        on_evict: Callable[[], None] = lambda: None,
        turns: LoadTurns | None = None,
        fetch: Callable[[ContextDeclaration], float | None] | None = None,
        gang: GangOptions | None = None,
        hold: Callable[[ContextDeclaration], Callable[[], None]] = loaders.hold_template,
    ) -> None:
        self.address = address
        self.budget = budget
        self.stats = stats
        self._emit = emit
        self._where = where
        self._gpu_model = gpu_model
        self._memory_in_use = memory_in_use
        self._on_evict = on_evict
        self._turns = turns or LoadTurns()
        self._fetch = fetch
        self._hold = hold
        #: How its gangs start (the devices it owns; a leader's also its members').
        self.gang = gang
        self._contexts: OrderedDict[str, LoadedContext] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self._lock = threading.RLock()
        self._load_locks: dict[str, threading.Lock] = {}
        self._local = threading.local()

    def acquire(self, declaration: ContextDeclaration) -> tuple[Any, float, bool]:
        """The loaded object of a context, pinned until :meth:`release`:
        (object, load seconds, loaded now)."""
        identity = declaration.identity
        with self._lock:
            entry = self._usable(identity)
            if entry is not None:
                return self._hit(entry, declaration), 0.0, False
            load_lock = self._load_locks.setdefault(identity, threading.Lock())
        with load_lock:
            with self._lock:
                entry = self._usable(identity)
                if entry is not None:
                    return self._hit(entry, declaration), 0.0, False
                self._make_room(self._sizes.get(identity, 0), keep=None)
            return self._load(declaration)

    def _usable(self, identity: str) -> LoadedContext | None:
        """The loaded context, unless its gang was torn down (then it goes: the next
        job loads it again)."""
        entry = self._contexts.get(identity)
        if entry is not None and entry.gang is not None and entry.gang.broken is not None:
            logger.warning("context %s: its gang is gone (%s)", identity, entry.gang.broken)
            self._evict(entry)
            return None
        return entry

    def release(self, identity: str, *, drop: bool = False) -> None:
        """A job is done with a context it acquired: it may be evicted again (at once
        with ``drop``, unless another job holds it: context-agnostic runs)."""
        with self._lock:
            entry = self._contexts.get(identity)
            if entry is not None:
                entry.pins -= 1
                if drop and entry.pins <= 0:
                    self._evict(entry)

    def track(self) -> JobTrace:
        """Start collecting, for the job of this thread, what it loads and evicts."""
        trace = JobTrace()
        self._local.trace = trace
        return trace

    def stop_tracking(self) -> None:
        """Stop collecting for this thread's job."""
        self._local.trace = None

    def _hit(self, entry: LoadedContext, declaration: ContextDeclaration) -> Any:
        entry.pins += 1
        entry.hits += 1
        entry.last_used = time.time()
        entry.names.add(declaration.name)
        self.stats.hits += 1
        self._contexts.move_to_end(entry.identity)
        return entry.obj

    def _load(self, declaration: ContextDeclaration) -> tuple[Any, float, bool]:
        modules_before = set(sys.modules)  # before the check, which imports the loader
        with checked_load(declaration, self.address, self._emit):
            return self._loaded(declaration, modules_before)

    def _loaded(
        self, declaration: ContextDeclaration, modules_before: set[str]
    ) -> tuple[Any, float, bool]:
        from .isolation import new_local_modules
        from .output import context_loading

        record = LoadRecord()
        from_cache = probe(declaration)
        self._emit(
            ev.ContextLoading(
                address=self.address,
                identity=declaration.identity,
                name=declaration.name,
                loader=declaration.loader,
                arguments=dict(declaration.kwargs),
                from_cache=from_cache,
            )
        )
        started = time.perf_counter()
        release = self._hold(declaration)
        try:
            peer_seconds = self._fetch(declaration) if self._fetch and not from_cache else None
        except BaseException:
            release()
            raise
        fetched = peer_seconds is not None
        turn = self._turns.around_load(declaration, record, cached=bool(from_cache) or fetched)
        before = self._memory_in_use()
        try:
            with context_loading(), context_processes(declaration.identity):
                obj = jobhooks.call_loader(declaration, record, self.gang)
        except (ContextLoadError, JobCancelled) as error:
            release()
            self._load_failed(declaration, error)
            raise
        except BaseException as error:
            release()
            self._load_failed(declaration, error)
            raise ContextLoadError(
                f"Context '{declaration.name}': loader '{declaration.loader}' raised "
                f"{type(error).__name__}: {error} on {self._where}. The next job that "
                "needs this context tries the load again. Fix: see the loader's traceback "
                "in this job's log."
            ) from error
        finally:
            turn.release()
        ended = time.perf_counter()
        seconds = ended - started
        reload = ended - record.converted_at if record.converted_at is not None else None
        nbytes = record.declared_bytes
        if nbytes is None:
            nbytes = max(0, self._memory_in_use() - before) + sum(record.rank_bytes)
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
            modules=new_local_modules(modules_before),
            shareable=record.shareable,
            job_bytes=record.job_bytes,
            gang=record.gang,
            release=release,
        )
        trace = getattr(self._local, "trace", None)
        if trace is not None:
            trace.conversions += record.conversions
            trace.reload_seconds = reload if reload is not None else trace.reload_seconds
        with self._lock:
            self._contexts[declaration.identity] = entry
            self._sizes[declaration.identity] = nbytes
            self.stats.loads += 1
            self.stats.load_seconds += seconds
            self.stats.conversions += record.conversions
            entry.pins += 1
            self._make_room(0, keep=declaration.identity)
        if record.gang is not None:
            self._emit(self._formed(declaration, record))
        self._emit(
            ev.ContextReady(
                address=self.address,
                identity=declaration.identity,
                load_seconds=seconds,
                bytes=nbytes,
                gpu_model=self._gpu_model,
                conversions=record.conversions,
                reload_seconds=reload,
                peer_seconds=peer_seconds,
                from_cache=from_cache,
            )
        )
        return obj, seconds, True

    def _formed(self, declaration: ContextDeclaration, record: LoadRecord) -> ev.GangFormed:
        gang = record.gang
        return ev.GangFormed(
            address=self.address,
            identity=declaration.identity,
            name=declaration.name,
            backend=gang.backend,
            devices=list(gang.devices),
            nodes=list(gang.nodes),
            pids=list(gang.pids),
            rank_bytes=list(record.rank_bytes),
        )

    def _load_failed(self, declaration: ContextDeclaration, error: BaseException) -> None:
        self.stats.load_failures += 1
        self._emit(
            ev.ContextLoadFailed(
                address=self.address,
                identity=declaration.identity,
                error=f"{type(error).__name__}: {error}"[:1000],
            )
        )

    def _make_room(self, incoming: int, keep: str | None) -> None:
        """Evict what the fleet's eviction order names, until the budget holds."""
        held = [
            Held(e.identity, e.last_used, e.nbytes, pinned=e.pins > 0 or e.identity == keep)
            for e in self._contexts.values()
        ]
        for identity in to_evict(held, incoming, self.budget):
            self._evict(self._contexts[identity])

    def _evict(self, entry: LoadedContext) -> None:
        del self._contexts[entry.identity]
        self.stats.evictions += 1
        self.stats.evicted.append(entry.identity)
        trace = getattr(self._local, "trace", None)
        if trace is not None:
            trace.evicted.append(entry.identity)
        self._emit(ev.ContextEvicted(address=self.address, identity=entry.identity))
        close = getattr(entry.obj, "close", None)
        entry.obj = None
        if callable(close):
            try:
                close()
            except Exception as error:
                logger.debug("closing %s: %r", entry.identity, error)
        del close
        if entry.gang is not None:
            entry.gang.close()
        end_context_processes(entry.identity)
        entry.release()
        for name in entry.modules:
            sys.modules.pop(name, None)
        gc.collect()
        self._on_evict()

    def owned_modules(self) -> set[str]:
        """Modules that live as long as a loaded context (see :func:`.isolation.fresh_modules`)."""
        with self._lock:
            return {name for entry in self._contexts.values() for name in entry.modules}

    def traits(self, identity: str) -> tuple[bool, int | None] | None:
        """Whether a loaded context may be shared, and its declared working memory
        per job (None: not loaded here)."""
        with self._lock:
            entry = self._contexts.get(identity)
            return None if entry is None else (entry.shareable, entry.job_bytes)

    def bytes_loaded(self) -> int:
        """Bytes of every loaded context."""
        with self._lock:
            return sum(entry.nbytes for entry in self._contexts.values())

    def inventory(self) -> tuple[HeldContext, ...]:
        """Every loaded context: identity, names, loader, bytes, load time, hits, pins."""
        with self._lock:
            return tuple(
                HeldContext(
                    identity=e.identity,
                    names=tuple(sorted(e.names)),
                    loader=e.loader,
                    bytes=e.nbytes,
                    load_seconds=round(e.load_seconds, 3),
                    hits=e.hits,
                    pins=e.pins,
                    conversions=e.conversions,
                    loaded_at=e.loaded_at,
                    last_used=e.last_used,
                )
                for e in self._contexts.values()
            )


def free_gpu_cache() -> None:
    """Give CUDA's cached blocks back after an eviction (when torch uses a GPU)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
