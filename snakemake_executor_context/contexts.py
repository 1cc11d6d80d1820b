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
import operator
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import jobhooks
from .errors import ContextDeclarationError, JobValueError
from .loaders import declaration_identity, staged_names
from .modelcache.staging import declared_sources

__all__ = [
    "CONFIG_KEY",
    "ContextDeclaration",
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
    #: Processes it spans, one per device (a gang: tensor parallelism); 1: the
    #: loader's object lives in the server's own process.
    ranks: int = 1
    #: The arguments staged into the node-local model cache before the loader runs
    #: (:mod:`.modelcache.staging`), each with its source's identity when it was declared.
    stage: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def to_config(self) -> dict[str, Any]:
        """The plain-data form stored in the workflow's config."""
        return {
            "loader": self.loader,
            "kwargs": dict(self.kwargs),
            "identity": self.identity,
            "loader_path": self.loader_path,
            "shareable": self.shareable,
            "ranks": self.ranks,
            **({"stage": dict(self.stage)} if self.stage else {}),
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
            ranks=int(data.get("ranks", 1)),
            stage=dict(data.get("stage") or {}),
        )


def declare_context(
    config: dict[str, Any],
    name: str,
    loader: str,
    /,
    *,
    shareable: bool = True,
    ranks: int = 1,
    stage: str | Iterable[str] | None = None,
    **kwargs: Any,
) -> ContextDeclaration:
    """Declare a context named ``name`` in the workflow's ``config``.

    ``loader`` is ``package.module:function`` (an importable module) or
    ``path/to/file.py:function`` (relative to the Snakefile that declares it). The
    keyword arguments are passed to the loader; they must be JSON values (``Path``
    objects are turned into strings). ``shareable=False`` (not passed to the loader):
    the loaded object cannot serve two jobs at once, so each of its jobs gets a whole
    server (see also :func:`loader`). ``ranks=k`` (not passed to the loader either):
    the context spans k processes, one per device of its server, in one
    ``torch.distributed`` group (tensor parallelism); its loader names a shard loader
    (``@loader(shard=...)``), and its rules ask for ``gpu=k``. ``stage="model"`` (or a
    list of names; not passed to the loader): those arguments are paths (or Hugging
    Face repository ids) whose files are copied once into each node's model cache,
    shared between peers, and handed to the loader as the local copy (see
    :mod:`.modelcache.staging`); a loader may name its own (``@loader(stage=...)``: the built-in
    :func:`snakemake_executor_context.hf.causal_lm` stages ``model``). Returns the
    declaration.
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
    if isinstance(ranks, bool) or not isinstance(ranks, int) or not 1 <= ranks <= 1024:
        raise ContextDeclarationError(
            f"Context '{name}': ranks={ranks!r} is not a whole number of processes from 1 "
            "to 1024. Fix: ranks=k for a context split over k devices (1: not split)."
        )
    basedir = _caller_basedir()
    decl = make_declaration(name, loader, kwargs, basedir, ranks=ranks, stage=stage)
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
    name: str,
    loader: str,
    kwargs: Mapping[str, Any],
    basedir: str | os.PathLike[str],
    *,
    ranks: int = 1,
    stage: str | Iterable[str] | None = None,
) -> ContextDeclaration:
    """Build a declaration without touching any config (see :func:`declare_context`)."""
    staged = staged_names(name, loader, stage)
    if staged and ranks > 1:
        raise ContextDeclarationError(
            f"Context '{name}': stage={list(staged)} with ranks={ranks}: a gang's shards do "
            "not get staged copies yet. Fix: drop stage (the shards read the source) or "
            "use ranks=1."
        )
    kwargs = {
        key: os.path.abspath(os.path.expanduser(os.fspath(value)))
        if key in staged
        and isinstance(value, (str, os.PathLike))
        and os.path.exists(os.path.expanduser(os.fspath(value)))
        else value
        for key, value in kwargs.items()
    }
    sources = declared_sources(name, kwargs, staged)
    identity, canonical, path = declaration_identity(
        name, loader, kwargs, Path(basedir), ranks=ranks, sources=sources
    )
    return ContextDeclaration(
        name=name,
        loader=loader,
        kwargs=json.loads(canonical),
        identity=identity,
        loader_path=str(path) if path else None,
        ranks=ranks,
        stage=sources,
    )


def declarations_from_config(config: Mapping[str, Any]) -> dict[str, ContextDeclaration]:
    """All declarations stored in a workflow config, by name."""
    raw = config.get(CONFIG_KEY) or {}
    return {name: ContextDeclaration.from_config(name, data) for name, data in raw.items()}


# --------------------------------------------------------------------------------------
# Using a context from a script.


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
    hooks = jobhooks.current_job()
    if hooks is not None and hooks.provider is not None:
        return hooks.provider.acquire(declaration)
    with _local_lock:
        if declaration.identity not in _local_objects:
            record = jobhooks.LoadRecord()
            _local_objects[declaration.identity] = jobhooks.call_loader(declaration, record)
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

    The count lands in the job's result; outside a context server it is ignored. A count
    that is not a whole number from 0 to 2**63-1 raises :class:`~.errors.JobValueError`.
    """
    count = _whole("report_items", n, "count")
    hooks = jobhooks.current_job()
    if hooks is not None:
        if hooks.items + count > _MAX_WHOLE:
            raise JobValueError(
                f"report_items({count}): the job's items would reach {hooks.items + count}, "
                "beyond 2**63-1. Fix: report the items done, not a running total or a size."
            )
        hooks.items += count


def declare_size(nbytes: int) -> None:
    """Called by a loader: the loaded context takes ``nbytes`` of memory.

    Without it, a server measures the growth of its RSS (CPU) or of allocated CUDA
    memory (GPU) during the load. ``nbytes`` is a whole number from 0 to 2**63-1.
    """
    size = _whole("declare_size", nbytes, "size")
    record = jobhooks.current_load()
    if record is not None:
        record.declared_bytes = size


def declare_job_memory(nbytes: int) -> None:
    """Called by a loader: each job needs ``nbytes`` of working memory beside the
    loaded object (a server with slots runs as many jobs at once as its memory holds;
    without this, it measures the first job's peak and runs one at a time until then).
    ``nbytes`` is a whole number from 0 to 2**63-1."""
    size = _whole("declare_job_memory", nbytes, "size")
    record = jobhooks.current_load()
    if record is not None:
        record.job_bytes = size


def note_conversion() -> None:
    """Called by a loader when it has converted weights (for example GGUF to
    safetensors), right after the conversion: the rest of the load then measures what
    a load from the converted cache costs, which placement uses for other servers."""
    record = jobhooks.current_load()
    if record is not None:
        record.conversions += 1
        record.converted_at = time.perf_counter()


def loader(
    *,
    cache_probe: Callable[..., bool] | None = None,
    shareable: bool = True,
    job_memory: int | None = None,
    template: Callable[..., str | os.PathLike[str] | None] | None = None,
    shard: Callable[..., Any] | None = None,
    stage: str | tuple[str, ...] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a loader function: a cache probe, its template, how its object may be
    shared, and its shard loader when the context spans several processes.

    ``cache_probe`` is called with the loader's keyword arguments and answers whether
    the weights are already on this machine's local disk (so a load would be cheap).
    Placement uses it to prefer servers whose cache holds a context.
    ``shareable=False``: the object cannot serve two jobs at once (not thread-safe),
    so a server runs its jobs alone. ``job_memory``: bytes of working memory one job
    needs beside the object (see :func:`declare_job_memory`).

    ``template`` is called with the loader's keyword arguments and names the local
    directory whose files recreate the context on another node, once copied into the
    same place there (a converted-weights entry of :mod:`.modelcache`, a checkpoint
    directory; None: nothing to copy for these arguments). A server that lacks it
    fetches it from a peer that holds it (peer-to-peer transfer), checked against its
    :class:`~.modelcache.manifest.Manifest`, before calling the loader, which then finds it.
    The directory must be one :func:`.modelcache.convert_once` could have made: a
    cache entry (its files and their digests are the user's own).

    ``shard`` makes it a gang's loader (``declare_context(..., ranks=k)``): ``shard`` is
    called once in each of the k rank processes, as ``shard(**kwargs, rank=rank)``
    with a :class:`~.gang.Rank` (rank, world size, device, backend) and the
    ``torch.distributed`` group already joined, and returns that rank's part of the
    model. The decorated function is then called once, in the server's process, as
    ``function(**kwargs, gang=gang)``, and returns what the jobs' scripts see: it
    reaches the shards only through ``gang.call("method", ...)``, which runs the
    method on every rank at once and returns rank 0's value (one driver, so every
    rank issues its collectives in the same order).

    ``stage`` names the arguments staged by default (see :func:`declare_context`); it
    is read where the workflow is declared only for loaders of this package, which are
    cheap to import there.
    """

    if job_memory is not None:
        job_memory = _whole("@loader", job_memory, "size", "job_memory=")

    def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
        function.shard = shard  # type: ignore[attr-defined]
        function.template = template  # type: ignore[attr-defined]
        function.cache_probe = cache_probe  # type: ignore[attr-defined]
        function.shareable = shareable  # type: ignore[attr-defined]
        function.job_memory = job_memory  # type: ignore[attr-defined]
        function.stage = stage  # type: ignore[attr-defined]
        return function

    return wrap


# --------------------------------------------------------------------------------------
# Helpers.


#: The largest count or size the plugin takes: what its records and Dask's messages hold.
_MAX_WHOLE = 2**63 - 1


def _whole(call: str, value: Any, what: str, keyword: str = "") -> int:
    """``value`` as a whole number from 0 to 2**63-1 (an int, or int-like such as a numpy
    integer; not a bool), or the error that names ``call`` and what it got."""
    try:
        number = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        number = None
    if number is None or not 0 <= number <= _MAX_WHOLE:
        fix = "the bytes as an int (8 * 10**9)" if what == "size" else "the items done as an int"
        raise JobValueError(
            f"{call}({keyword}{_shown(value)}): the {what} must be a whole number from 0 "
            f"to 2**63-1. Fix: pass {fix}."
        )
    return number


def _shown(value: Any) -> str:
    """The value as a refusal quotes it: its repr, cut short (its type if that fails)."""
    try:
        text = repr(value)
    except Exception:
        return f"<{type(value).__name__}>"
    return text if len(text) <= 60 else f"{text[:60]}..."


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
