"""A context job on its server: a slot, the contexts it acquires, and its run.

Waits at the server's slot gate (:mod:`.slots`), pins each context the job
acquires for the job's length, and runs the script in-process (:mod:`.inprocess`)
with the process state it shares with the jobs beside it.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from ..contexts import ContextDeclaration
from ..errors import JobCancelled
from ..fleet.outcome import Outcome, ServerIdentity
from ..jobhooks import JobHooks, set_current_job
from ..jobspec import ContextJobSpec, JobResult
from ..strays.jobsweep import JobSpans
from .cache import ContextCache
from .inprocess import run_context_job
from .isolation import torch_threads
from .running import RunningJob
from .slots.serverslots import ServerSlots

__all__ = ["run_context"]


def run_context(
    spec: ContextJobSpec,
    running: RunningJob,
    *,
    cache: ContextCache,
    slots: ServerSlots,
    identity: ServerIdentity,
    threads_per_slot: int = 0,
    spans: JobSpans | None = None,
) -> JobResult:
    """Run one context job once a slot lets it; a cancellation while it waits ends it
    as cancelled. What it leaves running is ended once no in-process job runs
    (``spans``, :mod:`..strays.jobsweep`)."""
    if threads_per_slot > 0:
        spec = dataclasses.replace(spec, threads=threads_per_slot)
    waited = time.time()
    try:
        with slots.admitted(spec, running):
            result = _run_spanned(spec, running, cache, slots, identity, spans)
        notes = slots.take_notes(spec.key)
        if notes:
            result.extra.setdefault("notes", []).extend(notes)
        return result
    except JobCancelled:
        now = time.time()
        return JobResult(
            Outcome(spec.key, identity, cancelled=True, started=waited, finished=now),
            message=f"{spec.title}: cancelled on {identity.describe()} while it waited for a slot.",
        )


def _run_spanned(
    spec: ContextJobSpec,
    running: RunningJob,
    cache: ContextCache,
    slots: ServerSlots,
    identity: ServerIdentity,
    spans: JobSpans | None,
) -> JobResult:
    if spans is None:
        return _run_admitted(spec, running, cache, slots, identity)
    spans.enter(spec)
    try:
        result = _run_admitted(spec, running, cache, slots, identity)
    finally:
        sweep = spans.leave(spec)
    if sweep is not None:
        spans.tell(sweep, result)
    return result


def _run_admitted(
    spec: ContextJobSpec,
    running: RunningJob,
    cache: ContextCache,
    slots: ServerSlots,
    identity: ServerIdentity,
) -> JobResult:
    held: dict[str, Any] = {}  # identity -> object, pinned for this job
    loaded: list[str] = []
    reused: list[str] = []
    load_seconds = 0.0

    def acquire(declaration: ContextDeclaration) -> Any:
        nonlocal load_seconds
        if declaration.identity in held:
            return held[declaration.identity]
        obj, seconds, cold = cache.acquire(declaration)
        held[declaration.identity] = obj
        (loaded if cold else reused).append(declaration.identity)
        load_seconds += seconds
        slots.loaded(spec.key, declaration.identity, cache.traits(declaration.identity))
        return obj

    hooks = JobHooks(provider=_Provider(acquire))
    set_current_job(hooks)
    try:
        result = run_context_job(
            spec, identity, acquire, running, torch_threads, cache.owned_modules, slots.group
        )
    finally:
        set_current_job(None)
        for context in held:
            cache.release(context, drop=not spec.reuse)
        held.clear()
    hooks.report_into(result)  # items, and forward batches (extra["batches"])
    result.end(loaded=tuple(loaded), reused=tuple(reused), load_seconds=load_seconds)
    return result


class _Provider:
    def __init__(self, acquire: Any) -> None:
        self._acquire = acquire

    def acquire(self, declaration: ContextDeclaration) -> Any:
        return self._acquire(declaration)
