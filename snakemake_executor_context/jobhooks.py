"""The per-job hooks a context server installs for the job running in a thread.

A script calls the public API (:mod:`.contexts`): :func:`~.contexts.load_context`,
:func:`~.contexts.report_items`, and a loader :func:`~.contexts.declare_size` and its
kin. On a context server those calls land in the hooks of the job running in the
calling thread (:class:`JobHooks`, installed by the server with
:func:`set_current_job`), and a load in the :class:`LoadRecord` of the load in
progress (:func:`call_loader`). Outside a server there are no hooks and the API
falls back to loading in the job's own process.

Standard library only: the public API imports this in every job Snakemake spawns.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from .callmerge import observe as observe_merged_calls
from .defaults import DEVICES_VARIABLE
from .errors import ContextLoadError
from .gang import GangOptions, server_devices, start_gang
from .loaders import LoaderRef, import_loader
from .modelcache import staging

__all__ = [
    "ContextProvider",
    "JobHooks",
    "LoadRecord",
    "call_loader",
    "current_job",
    "current_load",
    "own_process_gang",
    "set_current_job",
]


class ContextProvider(Protocol):
    """What a context server offers to the job running in the current thread."""

    def acquire(self, declaration: Any) -> Any:
        """Return the loaded object, loading it first if needed."""
        ...


@dataclass(eq=False)
class JobHooks:
    """Per-job state a running script reports into (see :func:`report_items`)."""

    provider: ContextProvider | None = None
    items: int = 0
    #: Calls of batched functions (:mod:`.callmerge`) this job's thread led, by size.
    batches: Counter[int] = field(default_factory=Counter)

    def report_into(self, result: Any) -> None:
        """Copy what the job reported into its result (a :class:`~.jobspec.JobResult`):
        ``items``, and ``extra["batches"]`` (size -> calls) when it led any batch (also
        in its outcome, which the catalog records)."""
        result.end(items=self.items, batches=tuple(sorted(self.batches.items())))
        if self.batches:
            result.extra["batches"] = dict(sorted(self.batches.items()))


@dataclass
class LoadRecord:
    """What a loader reported about one load (see :func:`declare_size`)."""

    declared_bytes: int | None = None
    #: Working memory one job of it needs beside the loaded object (declared).
    job_bytes: int | None = None
    #: False when the loader says its object cannot serve two jobs at once.
    shareable: bool = True
    conversions: int = 0
    started: float = field(default_factory=time.time)
    #: ``time.perf_counter()`` when the loader last reported a conversion done: what
    #: the load took after it is what a load from the converted cache takes.
    converted_at: float | None = None
    #: The gang of a context that spans several processes (:mod:`.gang`), and the
    #: bytes each of its ranks' shards took.
    gang: Any = None
    rank_bytes: list[int] = field(default_factory=list)
    #: Takes a turn at the context's source for a staging copy (a server's limit of
    #: concurrent reads; None: no limit) and returns the function that ends it.
    source_turn: Callable[[], Callable[[], None]] | None = None


_state = threading.local()
#: Fallback for threads a job starts itself: the single job running in this process.
_process_job: JobHooks | None = None
_running_jobs: list[JobHooks] = []
_jobs_lock = threading.Lock()


def _count_batch(size: int) -> None:
    """Batching observer: a batched call of ``size`` items, in the job that led it."""
    hooks = current_job()
    if hooks is not None:
        hooks.batches[size] += 1


observe_merged_calls(_count_batch, name=f"{__name__}.batches")


def current_job() -> JobHooks | None:
    """The hooks of the job running in this thread, if a server runs one."""
    hooks = getattr(_state, "job", None)
    return hooks if hooks is not None else _process_job


def set_current_job(hooks: JobHooks | None) -> None:
    """Install (or clear) the hooks of the job running in this thread; threads the
    job starts itself see them too while it is the only job running (slots: with
    several, only the job's own thread reports)."""
    global _process_job
    previous = getattr(_state, "job", None)
    _state.job = hooks
    with _jobs_lock:
        if hooks is not None:
            _running_jobs.append(hooks)
        elif previous is not None and previous in _running_jobs:
            _running_jobs.remove(previous)
        _process_job = _running_jobs[0] if len(_running_jobs) == 1 else None


def call_loader(declaration: LoaderRef, record: LoadRecord, gang: GangOptions | None = None) -> Any:
    """Import the loader and call it with the declared arguments.

    Staged arguments (:mod:`.modelcache.staging`) are copied into the node's model cache first,
    taking ``record.source_turn`` around a copy from the source, and the loader gets
    the local copies. A loader with a shard loader (``@loader(shard=...)``) spans
    ``declaration.ranks`` processes: they are started and loaded first (on the devices
    ``gang`` names; by default those of this process, :func:`.gang.server_devices`),
    then the loader is called with ``gang=`` the :class:`~.gang.Gang` (kept in ``record.gang``).
    """
    function = import_loader(declaration)
    record.shareable = bool(getattr(function, "shareable", True))
    declared = getattr(function, "job_memory", None)
    if declared is not None:
        record.job_bytes = declared  # checked by @loader
    ranks = int(getattr(declaration, "ranks", 1) or 1)
    if getattr(function, "shard", None) is None:
        if ranks > 1:
            raise ContextLoadError(
                f"Context '{declaration.name}' is declared with ranks={ranks}, but its "
                f"loader '{declaration.loader}' names no shard loader. Fix: decorate it "
                "with @loader(shard=load_shard), a function called once per rank."
            )
        with staging.staged_arguments(declaration, record.source_turn) as kwargs:
            return _called(function, kwargs, record)
    options = gang if gang is not None else own_process_gang(ranks)
    record.gang = start_gang(declaration, ranks, options, cwd=os.getcwd())
    record.rank_bytes = list(record.gang.rank_bytes)
    try:
        return _called(function, {**declaration.kwargs, "gang": record.gang}, record)
    except BaseException:
        record.gang.close()
        raise


def own_process_gang(ranks: int) -> GangOptions:
    """A gang's devices in a process that is not a server (another executor's job):
    its GPUs, or, on a machine without one, a CPU for each rank."""
    devices = server_devices()
    if all(device == "cpu" for device in devices) and not os.environ.get(DEVICES_VARIABLE):
        devices = ["cpu"] * ranks
    return GangOptions(devices=tuple(devices))


def _called(function: Callable[..., Any], kwargs: Mapping[str, Any], record: LoadRecord) -> Any:
    _state.load = record
    try:
        return function(**kwargs)
    finally:
        _state.load = None


def current_load() -> LoadRecord | None:
    """The record of the load in progress in this thread (a loader reports into it)."""
    return getattr(_state, "load", None)
