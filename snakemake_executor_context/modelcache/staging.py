"""Staging: a loader's model argument copied once into the node-local model cache,
and the loader handed the copy.

A declaration names the keyword arguments that are paths to stage
(``declare_context(..., stage="model")``; the built-in loader
:func:`snakemake_executor_context.hf.causal_lm` stages its ``model``). Each such
value is a *source*:

- a local directory (a checkpoint on a shared filesystem): its files, hidden ones
  (``.git``, ``.cache``) left out;
- a local file (a GGUF): that one file;
- a Hugging Face repository id (``org/name``) that is not a local path: its snapshot
  in the local Hugging Face cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
  ``~/.cache/huggingface/hub``) at the declaration's ``revision`` argument, else
  ``main``; its files are symlinks into ``blobs/``, and what they point to is copied.
  Nothing is ever downloaded.

A source's *identity* (:func:`source_identity`) is taken when the workflow declares
the context: the path, and each file's relative path, size and modification time (a
snapshot: the repository id, its commit and the files' sizes). It is part of the
context's identity, so a changed source is a new context (a persistent cluster does
not go on serving the old one from memory), and it names the cache entry
(``staged-<name>-<identity>``), so a changed source makes a new entry and never
serves a stale one.

Before the loader runs (:func:`staged_arguments`), each source is checked against
its declared identity (changed since: one line, the fix is to run again), then its
entry is made by :func:`.entries.convert_once` unless it is there: one copy per
node and user (a lock), into a private directory, every file's sha256 taken as it is
written and recorded as the entry's manifest, checked against the source's identity
again at the end (a source that changed during the copy is not kept), then renamed
into place. The copy alone holds a *turn* at the source (the caller's ``turn``: for
pilots, a limit of concurrent reads per context). Reads from the source are capped at
``$SNAKEMAKE_CONTEXT_SOURCE_MBPS`` megabytes a second when set, shared by this user's
processes of a node reading that source (a site's way to spare its shared
filesystem). A disk too full for the copy: one line, and the
loader reads the source itself, inside the turn. Nothing is written into the source.

The entry is the context's template (:func:`..loaders.template_dir`): a server that
lacks it fetches it from a peer that holds it, as for any template. Standard library
only: the declaration runs in every job Snakemake spawns.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import paths
from ..defaults import SOURCE_MBPS_VARIABLE
from ..errors import ContextDeclarationError, ContextLoadError
from ..terminal import format_bytes
from . import entries
from .manifest import Manifest, ManifestEntry

__all__ = [
    "Source",
    "Turn",
    "entry_for",
    "hub_cache",
    "is_staged",
    "resolve",
    "source_identity",
    "staged_arguments",
]

#: Takes a turn at a source and returns the function that ends it.
Turn = Callable[[], Callable[[], None]]

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_CHUNK = 8 << 20
#: Seconds between two progress lines of a long copy.
_PROGRESS_SECONDS = 10.0


@dataclass(frozen=True)
class Source:
    """One argument's source, resolved on this machine."""

    #: The keyword argument, and its value as declared.
    argument: str
    value: str
    #: The directory or file whose bytes are staged.
    path: Path
    #: The repository id when the value names one (else None).
    repo: str | None = None

    @property
    def name(self) -> str:
        """A readable part of the entry's name."""
        base = self.repo.replace("/", "--") if self.repo else self.path.name
        return re.sub(r"[^\w.-]", "_", base)[:80] or "source"

    def files(self) -> list[str]:
        """The relative paths of the files to stage, sorted (a file source: its name)."""
        if self.path.is_file():
            return [self.path.name]
        found = []
        for top, dirs, names in os.walk(self.path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            relative = os.path.relpath(top, self.path)
            for name in names:
                if not name.startswith("."):
                    found.append(name if relative == "." else f"{relative}/{name}")
        return sorted(found)

    def file_path(self, relative: str) -> Path:
        """Where the file ``relative`` is read from."""
        return self.path if self.path.is_file() else self.path / relative


def hub_cache() -> Path:
    """The local Hugging Face cache: ``$HF_HUB_CACHE``, ``$HF_HOME/hub``, or
    ``~/.cache/huggingface/hub`` (as ``huggingface_hub`` reads it)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface"
    )
    return Path(home).expanduser() / "hub"


def resolve(context: str, argument: str, value: Any, *, revision: str | None = None) -> Source:
    """The source ``value`` names (a path, or a repository id in the local Hugging
    Face cache); :class:`ContextDeclarationError` naming the context and the fix."""
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise ContextDeclarationError(
            f"Context '{context}': {argument}={value!r} is to be staged, so it must be a "
            "path or a Hugging Face repository id. Fix: pass a string."
        )
    text = os.fspath(value)
    path = Path(text).expanduser()
    if path.exists():
        return Source(argument, text, path.absolute())
    if not _REPO_ID.match(text) or text.startswith("."):
        raise ContextDeclarationError(
            f"Context '{context}': {argument}={text!r} does not exist. Fix: give an existing "
            "directory or file, or a Hugging Face repository id (org/name) in the local "
            "Hugging Face cache."
        )
    repo_dir = hub_cache() / f"models--{text.replace('/', '--')}"
    wanted = revision or "main"
    commit = wanted if _COMMIT.match(wanted) else _read_ref(repo_dir / "refs" / wanted)
    snapshot = repo_dir / "snapshots" / commit if commit else None
    if snapshot is None or not snapshot.is_dir():
        raise ContextDeclarationError(
            f"Context '{context}': {argument}={text!r} (revision {wanted}) is neither a local "
            f"path nor in the Hugging Face cache {hub_cache()}; nothing is downloaded. Fix: "
            f"fetch it once where there is internet (`hf download {text}` with the same "
            "HF_HUB_CACHE), or give the model's directory."
        )
    return Source(argument, text, snapshot.absolute(), repo=text)


def _read_ref(path: Path) -> str | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return text if _COMMIT.match(text) else None


def source_identity(source: Source) -> str:
    """The source's identity: its path (a snapshot: repository id and commit) and
    each file's relative path, size and modification time (a snapshot's files are
    named by their content: sizes only)."""
    digest = hashlib.sha256()
    where = f"{source.repo}@{source.path.name}" if source.repo else str(source.path)
    digest.update(where.encode() + b"\0")
    for relative in source.files():
        info = os.stat(source.file_path(relative))
        stamp = "" if source.repo else f":{info.st_mtime_ns}"
        digest.update(f"{relative}:{info.st_size}{stamp}\0".encode())
    return digest.hexdigest()


def entry_for(source: Source, identity: str) -> Path:
    """The cache entry of a source of that identity (in :func:`.entries.cache_root`)."""
    return entries.cache_root() / f"staged-{source.name}-{identity[:16]}"


def declared_sources(
    context: str, kwargs: Mapping[str, Any], stage: tuple[str, ...]
) -> dict[str, str]:
    """Each staged argument's source identity, as the declaration records it."""
    sources = {}
    for argument in stage:
        if argument not in kwargs:
            raise ContextDeclarationError(
                f"Context '{context}': stage names {argument!r}, which is not one of its "
                f"arguments ({', '.join(sorted(kwargs)) or 'none'}). Fix: pass "
                f"{argument}=<path> or drop it from stage."
            )
        sources[argument] = source_identity(_argument_source(context, kwargs, argument))
    return sources


def _argument_source(context: str, kwargs: Mapping[str, Any], argument: str) -> Source:
    """The source of one staged argument (a repository id at the ``revision`` argument)."""
    return resolve(context, argument, kwargs[argument], revision=kwargs.get("revision"))


def _sources(declaration: Any) -> list[tuple[Source, str]]:
    """Each staged argument's source, with the identity declared for it."""
    return [
        (_argument_source(declaration.name, declaration.kwargs, argument), identity)
        for argument, identity in dict(getattr(declaration, "stage", None) or {}).items()
    ]


def template_entry(declaration: Any) -> Path | None:
    """The entry of the declaration's first staged argument (None: it stages none)."""
    sources = _sources(declaration)
    if not sources:
        return None
    source, identity = sources[0]
    return entry_for(source, identity)


def is_staged(declaration: Any) -> bool:
    """Cache probe: is every staged argument's entry on this node and usable?"""
    return all(entries.is_cached(entry_for(s, i)) for s, i in _sources(declaration))


@contextlib.contextmanager
def staged_arguments(declaration: Any, turn: Turn | None = None) -> Iterator[dict[str, Any]]:
    """The declaration's arguments with each staged one replaced by its local copy,
    valid inside the block (each entry held open). ``turn`` is taken around each copy
    from a source (and around the whole block when a full disk sends the loader to
    the source itself)."""
    kwargs = dict(declaration.kwargs)
    with contextlib.ExitStack() as stack:
        for source, identity in _sources(declaration):
            now = source_identity(source)
            if now != identity:
                raise ContextLoadError(
                    f"Context '{declaration.name}': its {source.argument} {source.value} "
                    "changed after the workflow declared it (files, sizes or times differ). "
                    "Fix: run snakemake again, which declares the new files (a new context)."
                )
            entry = entry_for(source, identity)
            try:
                _stage(declaration.name, source, identity, entry, turn)
            except OSError as error:
                if error.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                _say(
                    f"Context '{declaration.name}': staging {source.value} into {entry.parent} "
                    f"failed ({os.strerror(error.errno)}): the loader reads the source itself. "
                    "Fix: free space there, or move the cache (SNAKEMAKE_CONTEXT_MODEL_CACHE, "
                    "--context-model-cache-size)."
                )
                if turn is not None:
                    stack.callback(turn())
                kwargs[source.argument] = str(source.path)
                continue
            local = Path(stack.enter_context(entries.open_entry(entry)))
            kwargs[source.argument] = str(
                local if source.path.is_dir() else local / source.path.name
            )
        yield kwargs


def _stage(context: str, source: Source, identity: str, entry: Path, turn: Turn | None) -> bool:
    """Make the source's entry unless it is there (True: this call copied it)."""
    copied: list[Manifest] = []

    def copy(into: Path) -> None:
        release = turn() if turn is not None else (lambda: None)
        try:
            copied.append(_copy(context, source, identity, into))
        finally:
            release()

    started = time.perf_counter()
    # The digests taken during the copy are the manifest: no second read.
    wrote = entries.convert_once(entry, copy, manifest=lambda into: copied[-1])
    if wrote:
        nbytes = copied[-1].total_bytes
        _say(
            f"Context '{context}': its {source.argument} {source.value} ({format_bytes(nbytes)}) "
            f"was staged from its source into {entry.parent} in "
            f"{time.perf_counter() - started:.1f} s."
        )
    return wrote


def _say(line: str) -> None:
    """A line in the job's log (a server sends a job's stderr there)."""
    print(line, file=sys.stderr, flush=True)


def _copy(context: str, source: Source, identity: str, into: Path) -> Manifest:
    """Copy the source's files into ``into`` (a new private directory), at most
    ``$SNAKEMAKE_CONTEXT_SOURCE_MBPS`` MB/s, taking each file's sha256 as it goes."""
    pace = _Pace(_rate(), identity)
    started, copied = time.monotonic(), 0
    shown = started
    names = source.files()
    total = sum(os.stat(source.file_path(name)).st_size for name in names)
    entries = []
    for relative in names:
        target = into / relative
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        digest, size = hashlib.sha256(), 0
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with open(source.file_path(relative), "rb") as reading, os.fdopen(fd, "wb") as writing:
            while chunk := reading.read(_CHUNK):
                writing.write(chunk)
                digest.update(chunk)
                size += len(chunk)
                copied += len(chunk)
                pace.wait(len(chunk))
                if time.monotonic() - shown >= _PROGRESS_SECONDS:
                    shown = time.monotonic()
                    _say(
                        f"Context '{context}': staging {source.value}: {format_bytes(copied)} of "
                        f"{format_bytes(total)} in {shown - started:.0f} s."
                    )
        entries.append(ManifestEntry(relative, size, digest.hexdigest()))
    if source_identity(source) != identity:
        raise ContextLoadError(
            f"Context '{context}': its {source.argument} {source.value} changed while it was "
            "staged; the copy is discarded. Fix: let the writer finish, then run snakemake "
            "again."
        )
    return Manifest(tuple(sorted(entries)))


class _Pace:
    """Reads of one source by this user's processes on this node, together at most
    ``rate`` bytes a second (0: no cap): each chunk books the next free slot of the
    source's timeline, a file in the private root, under a lock, and waits for its
    end. So six servers of a node staging at once share the cap, as readers of a
    loaded shared filesystem share its bandwidth."""

    def __init__(self, rate: float, identity: str) -> None:
        self.rate = rate
        self.name = f"source-rate-{identity[:16]}"

    def wait(self, nbytes: int) -> None:
        """Wait until ``nbytes`` more may have been read."""
        if not self.rate:
            return
        timeline = paths.private_path("source-rates") / self.name
        with paths.private_lock(self.name):
            booked = (paths.read_trusted(timeline) or b"").decode().strip()
            now = time.time()
            ends = max(now, float(booked) if booked else 0.0) + nbytes / self.rate
            paths.write_private(timeline, repr(ends))
        time.sleep(max(0.0, ends - now))


def _rate() -> float:
    """Bytes a second of ``$SNAKEMAKE_CONTEXT_SOURCE_MBPS`` (0: no cap), read as the
    start checks read it; a bad value (refused there) fails the load in one line."""
    from ..errors import SettingError
    from ..settings.table import environment_value

    try:
        mbps = environment_value(SOURCE_MBPS_VARIABLE)
    except SettingError as error:
        raise ContextLoadError(str(error)) from None
    return float(mbps or 0.0) * 1e6
