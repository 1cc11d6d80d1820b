"""Declaring a context once and using it from a rule's script.

A *context* is an expensive object (an LLM and its tokenizer, an embedding model)
that many jobs use. It is declared once in the Snakefile, by a name, a loader and
keyword arguments::

    from snakemake_executor_context import declare_context

    declare_context(config, "smollm2", "loaders/llm.py:load_model", model="...")

    rule score:
        input: "claims/{shard}.jsonl"
        output: "scores/{shard}.tsv"
        resources: context="smollm2", gpu=1
        script: "scripts/score.py"

and the rule's script gets the loaded object with one call::

    from snakemake_executor_context import load_context
    model = load_context(snakemake)

Under ``--executor context`` the script runs inside a context server that keeps the
object loaded for the next job; under any other executor the call loads it in the
job's own process (the context-agnostic baseline). The declaration travels inside
the workflow's ``config`` under :data:`CONFIG_KEY`, because a script under
``--executor local`` or slurm runs in a fresh interpreter that only sees the pickled
``snakemake`` object.

This module is imported by every Snakefile that declares a context, in every job
Snakemake spawns: it imports nothing beyond the standard library at import time.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from . import batching
from .errors import ContextDeclarationError
from .loaders import declaration_identity, import_loader

__all__ = [
    "CONFIG_KEY",
    "ContextDeclaration",
    "LoadRecord",
    "declare_context",
    "declare_job_memory",
    "declare_size",
    "load_context",
    "loader",
    "note_conversion",
    "report_items",
]

#: The reserved key of the workflow's ``config`` that holds the declarations.
CONFIG_KEY = "__snakemake_contexts__"


@dataclass(frozen=True)
class ContextDeclaration:
    """One declared context: what to call, with which arguments, and its identity.

    ``identity`` is the sha256 of the loader spec, the canonical JSON of the keyword
    arguments and a fingerprint of the loader's code (the content hash of its file, or
    its distribution's version when it is an installed package). Two names declared
    with equal loaders and arguments share one identity, and so one load.
    """

    name: str
    loader: str
    kwargs: Mapping[str, Any]
    identity: str
    #: Absolute path of a file loader (``path/to/file.py:function``); None for modules.
    loader_path: str | None = None
    #: False: its jobs get a whole server, never running beside another job.
    shareable: bool = True

    def to_config(self) -> dict[str, Any]:
        """The plain-data form stored in the workflow's config."""
        return {
            "loader": self.loader,
            "kwargs": dict(self.kwargs),
            "identity": self.identity,
            "loader_path": self.loader_path,
            "shareable": self.shareable,
        }

    @classmethod
    def from_config(cls, name: str, data: Mapping[str, Any]) -> ContextDeclaration:
        """Rebuild a declaration from its config form."""
        return cls(
            name=name,
            loader=data["loader"],
            kwargs=dict(data.get("kwargs", {})),
            identity=data["identity"],
            loader_path=data.get("loader_path"),
            shareable=bool(data.get("shareable", True)),
        )


def declare_context(
    config: dict[str, Any], name: str, loader: str, /, *, shareable: bool = True, **kwargs: Any
) -> ContextDeclaration:
    """Declare a context named ``name`` in the workflow's ``config``.

    ``loader`` is ``package.module:function`` (an importable module) or
    ``path/to/file.py:function`` (relative to the Snakefile that declares it). The
    keyword arguments are passed to the loader; they must be JSON values (``Path``
    objects are turned into strings). ``shareable=False`` (not passed to the loader):
    the loaded object cannot serve two jobs at once, so each of its jobs gets a whole
    server (see also :func:`loader`). Returns the declaration.
    """
    if not isinstance(config, dict):
        raise ContextDeclarationError(
            f"declare_context({name!r}, ...): the first argument must be the "
            "workflow's `config` dict. Fix: call declare_context(config, name, loader, ...)."
        )
    if not isinstance(name, str) or not name or any(c in name for c in " \t\n/:"):
        raise ContextDeclarationError(
            f"Context name {name!r} is invalid: use a non-empty name without "
            "spaces, '/' or ':' (for example 'smollm2')."
        )
    basedir = _caller_basedir()
    decl = make_declaration(name, loader, kwargs, basedir)
    if not shareable:
        decl = dataclasses.replace(decl, shareable=False)
    existing = config.setdefault(CONFIG_KEY, {})
    previous = existing.get(name)
    if previous is not None and previous.get("identity") != decl.identity:
        raise ContextDeclarationError(
            f"Context '{name}' is declared twice with different loaders or "
            f"arguments ({previous.get('loader')} and {decl.loader}). Fix: give "
            "the second declaration its own name."
        )
    existing[name] = decl.to_config()
    return decl


def make_declaration(
    name: str, loader: str, kwargs: Mapping[str, Any], basedir: str | os.PathLike[str]
) -> ContextDeclaration:
    """Build a declaration without touching any config (see :func:`declare_context`)."""
    identity, canonical, path = declaration_identity(name, loader, kwargs, Path(basedir))
    return ContextDeclaration(
        name=name,
        loader=loader,
        kwargs=json.loads(canonical),
        identity=identity,
        loader_path=str(path) if path else None,
    )


def declarations_from_config(config: Mapping[str, Any]) -> dict[str, ContextDeclaration]:
    """All declarations stored in a workflow config, by name."""
    raw = config.get(CONFIG_KEY) or {}
    return {name: ContextDeclaration.from_config(name, data) for name, data in raw.items()}


# --------------------------------------------------------------------------------------
# Using a context from a script.


class ContextProvider(Protocol):
    """What a context server offers to the job running in the current thread."""

    def acquire(self, declaration: ContextDeclaration) -> Any:
        """Return the loaded object, loading it first if needed."""
        ...


@dataclass(eq=False)
class JobHooks:
    """Per-job state a running script reports into (see :func:`report_items`)."""

    provider: ContextProvider | None = None
    items: int = 0
    #: Calls of batched functions (:mod:`.batching`) this job's thread led, by size.
    batches: Counter[int] = field(default_factory=Counter)

    def report_into(self, result: Any) -> None:
        """Copy what the job reported into its result (a :class:`~.jobspec.JobResult`):
        ``items``, and ``extra["batches"]`` (size -> calls) when it led any batch."""
        result.items = self.items
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


_state = threading.local()
#: Fallback for threads a job starts itself: the single job running in this process.
_process_job: JobHooks | None = None
_running_jobs: list[JobHooks] = []
_jobs_lock = threading.Lock()
#: Contexts loaded in this process when no server runs the job (the baseline).
_local_objects: dict[str, Any] = {}
_local_lock = threading.Lock()


def load_context(snakemake: Any, name: str | None = None) -> Any:
    """Return the loaded object of the context the job names.

    ``snakemake`` is the script's ``snakemake`` object; ``name`` defaults to the
    rule's ``context`` resource. Inside a context server the object is the server's
    (loaded once, kept for later jobs); anywhere else it is loaded in this process.
    """
    declaration = resolve_declaration(
        getattr(snakemake, "config", {}),
        name if name is not None else _resource(snakemake, "context"),
        rule=str(getattr(snakemake, "rule", "?")),
    )
    hooks = current_job()
    if hooks is not None and hooks.provider is not None:
        return hooks.provider.acquire(declaration)
    with _local_lock:
        if declaration.identity not in _local_objects:
            _local_objects[declaration.identity] = call_loader(declaration, LoadRecord())
        return _local_objects[declaration.identity]


def resolve_declaration(config: Mapping[str, Any], name: Any, *, rule: str) -> ContextDeclaration:
    """Find the declaration called ``name``; a clear error names what is missing."""
    if not name:
        raise ContextDeclarationError(
            f"Rule '{rule}' asked for its context, but it names none. Fix: add "
            '`context="<name>"` to the rule\'s resources, or pass the name: '
            'load_context(snakemake, "<name>").'
        )
    declared = (config or {}).get(CONFIG_KEY) or {}
    if name not in declared:
        raise undeclared(rule, name, declared)
    return ContextDeclaration.from_config(name, declared[name])


def undeclared(rule: str, name: object, declared: Iterable[str]) -> ContextDeclarationError:
    """The error for a rule that names a context no ``declare_context`` made."""
    known = ", ".join(sorted(declared)) or "none"
    return ContextDeclarationError(
        f"Rule '{rule}' uses context '{name}', which is not declared (declared: {known}). "
        f'Fix: add declare_context(config, "{name}", "module:function", ...) to the '
        f"Snakefile, or correct the name (--set-resources {rule}:context=<name>)."
    )


def report_items(n: int) -> None:
    """Record that the running job has done ``n`` more items of work (claims, prompts).

    The count lands in the job's result; outside a context server it is ignored.
    """
    hooks = current_job()
    if hooks is not None:
        hooks.items += int(n)


def _count_batch(size: int) -> None:
    """Batching observer: a batched call of ``size`` items, in the job that led it."""
    hooks = current_job()
    if hooks is not None:
        hooks.batches[size] += 1


batching.observe(_count_batch, name=f"{__name__}.batches")


def declare_size(nbytes: int) -> None:
    """Called by a loader: the loaded context takes ``nbytes`` of memory.

    Without it, a server measures the growth of its RSS (CPU) or of allocated CUDA
    memory (GPU) during the load.
    """
    record = getattr(_state, "load", None)
    if record is not None:
        record.declared_bytes = int(nbytes)


def declare_job_memory(nbytes: int) -> None:
    """Called by a loader: each job needs ``nbytes`` of working memory beside the
    loaded object (a server with slots runs as many jobs at once as its memory holds;
    without this, it measures the first job's peak and runs one at a time until then)."""
    record = getattr(_state, "load", None)
    if record is not None:
        record.job_bytes = int(nbytes)


def note_conversion() -> None:
    """Called by a loader when it has converted weights (for example GGUF to
    safetensors), right after the conversion: the rest of the load then measures what
    a load from the converted cache costs, which placement uses for other servers."""
    record = getattr(_state, "load", None)
    if record is not None:
        record.conversions += 1
        record.converted_at = time.perf_counter()


def loader(
    *,
    cache_probe: Callable[..., bool] | None = None,
    shareable: bool = True,
    job_memory: int | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a loader function: a cache probe, and how its object may be shared.

    ``cache_probe`` is called with the loader's keyword arguments and answers whether
    the weights are already on this machine's local disk (so a load would be cheap).
    Placement uses it to prefer servers whose cache holds a context.
    ``shareable=False``: the object cannot serve two jobs at once (not thread-safe),
    so a server runs its jobs alone. ``job_memory``: bytes of working memory one job
    needs beside the object (see :func:`declare_job_memory`).
    """

    def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
        function.cache_probe = cache_probe  # type: ignore[attr-defined]
        function.shareable = shareable  # type: ignore[attr-defined]
        function.job_memory = job_memory  # type: ignore[attr-defined]
        return function

    return wrap


# --------------------------------------------------------------------------------------
# Used by the context server.


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


def call_loader(declaration: ContextDeclaration, record: LoadRecord) -> Any:
    """Import the loader and call it with the declared arguments."""
    function = import_loader(declaration)
    record.shareable = bool(getattr(function, "shareable", True))
    declared = getattr(function, "job_memory", None)
    if declared is not None:
        record.job_bytes = int(declared)
    _state.load = record
    try:
        return function(**declaration.kwargs)
    finally:
        _state.load = None


# --------------------------------------------------------------------------------------
# Helpers.


def _resource(snakemake: Any, name: str) -> Any:
    resources = getattr(snakemake, "resources", None)
    if resources is None:
        return None
    getter = getattr(resources, "get", None)
    return getter(name) if getter else getattr(resources, name, None)


def _caller_basedir() -> Path:
    """The directory of the Snakefile that called declare_context (cwd as fallback)."""
    frame = sys._getframe(2)
    filename = frame.f_code.co_filename
    if filename and os.path.isfile(filename):
        return Path(filename).resolve().parent
    return Path.cwd()
