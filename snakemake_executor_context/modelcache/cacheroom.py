"""Room in a node-local model cache: its size limit, the entries in use, and the least
recently used ones removed to make room for a new one.

The limit is ``$SNAKEMAKE_CONTEXT_MODEL_CACHE_SIZE`` bytes of this user's entries in
one cache directory (a server sets it from ``--context-model-cache-size``; unset: no
limit). Where an entry enters the cache (a conversion, a template fetched from a
peer: :func:`..modelcache.convert_once`), :func:`make_room` first removes this user's
entries, least recently used first, until the new one fits, skipping every entry in
use on this node:

- a process uses an entry while it holds a shared ``flock`` of the entry's lock file
  in the private root (:func:`hold_entry`): a server for as long as it holds the
  entry's context loaded (and through its load), a holder for each transfer it
  serves, a reader inside :func:`..modelcache.open_entry`. A lock dies with its
  process: a killed server holds nothing.
- an entry is removed only under an exclusive lock of that file, taken without
  waiting (a use keeps it), renamed out of sight first (a reader never sees half an
  entry), then deleted with its recorded manifest.

The time of an entry's last use is its lock file's modification time (a hold touches
it as it begins and as it ends; an entry never held: its own). Entries of other
users are neither counted nor removed. A new entry larger than the limit still
enters (it is removed first the next time room is needed).

A damaged entry (:mod:`.cachecheck`) is renamed into ``.damaged-<name>.<random>/``
beside it (:func:`move_aside`), out of every reader's way but never deleted while a
process of the node holds the use lock of its name; each :func:`make_room` deletes
those no process holds (:func:`sweep_aside`). Standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from .. import paths
from ..defaults import MODEL_CACHE_SIZE_VARIABLE
from ..errors import UnsafePathError

__all__ = [
    "ASIDE_PREFIX",
    "MODEL_CACHE_SIZE_VARIABLE",
    "cache_limit",
    "entry_key",
    "hold_entry",
    "make_room",
    "move_aside",
    "sweep_aside",
]

logger = logging.getLogger(__name__)

#: How the name of a directory holding a damaged entry moved aside begins.
ASIDE_PREFIX = ".damaged-"


def entry_key(entry: Path) -> str:
    """The name of ``entry`` in the private root (its absolute path, hashed)."""
    return hashlib.sha256(str(Path(os.path.abspath(entry))).encode()).hexdigest()[:32]


def _lock_name(entry: Path) -> str:
    return f"use-{entry_key(entry)}.lock"


def cache_limit() -> int | None:
    """Bytes this user's entries of one cache may take (None: no limit), read as the
    start checks read ``$SNAKEMAKE_CONTEXT_MODEL_CACHE_SIZE`` (a size; a bad one,
    refused there: SettingError, one line)."""
    from ..settings.table import environment_value

    return environment_value(MODEL_CACHE_SIZE_VARIABLE) or None


def hold_entry(entry: Path) -> Callable[[], None]:
    """Use ``entry`` until the function returned is called: no :func:`make_room` on
    this node removes it meanwhile (it waits for one removing it now); its time of
    last use is when the use began, then when it ended. Releasing twice does nothing."""
    fd = paths.lock_descriptor(_lock_name(entry))
    fcntl.flock(fd, fcntl.LOCK_SH)
    os.utime(fd)
    held = [fd]

    def release() -> None:
        if held:
            fd = held.pop()
            with contextlib.suppress(OSError):
                os.utime(fd)
            paths.close_lock(fd)  # the lock goes with this description's last descriptor

    return release


@contextlib.contextmanager
def entry_in_use(entry: Path) -> Iterator[None]:
    """:func:`hold_entry` for the ``with`` block."""
    release = hold_entry(entry)
    try:
        yield
    finally:
        release()


def make_room(
    root: Path,
    incoming: int,
    *,
    keep: Path | None = None,
    recorded: Callable[[Path], Iterable[Path]] | None = None,
) -> list[Path]:
    """Remove this user's entries of the cache ``root`` not in use on this node,
    least recently used first, until ``incoming`` more bytes fit its limit (never
    ``keep``); ``recorded``: what this user recorded of an entry in the private root
    (removed with it). The entries removed (none without a limit). First, the damaged
    entries moved aside that nobody uses go (:func:`sweep_aside`)."""
    sweep_aside(root)
    limit = cache_limit()
    if limit is None:
        return []
    removed: list[Path] = []
    with paths.private_lock(f"room-{entry_key(root)}.lock"):
        entries = sorted(_entries(root))
        total = sum(size for _, _, size in entries)
        for _, entry, size in entries:
            if total + incoming <= limit:
                break
            if entry == keep or not _remove_unused(entry, recorded):
                continue
            removed.append(entry)
            total -= size
        if total + incoming > limit:
            logger.info("cache %s: %d bytes in use over its limit", root, total + incoming - limit)
    return removed


def _entries(root: Path) -> Iterator[tuple[float, Path, int]]:
    """(last use, entry, bytes) of this user's entries (real directories whose names
    do not start with a dot: those are conversions and transfers under way)."""
    try:
        found = list(os.scandir(root))
    except OSError:
        return
    uid = os.getuid()
    for item in found:
        if item.name.startswith("."):
            continue
        try:
            info = item.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid:
            continue
        entry = Path(item.path)
        try:
            used = os.stat(paths.lock_path(_lock_name(entry))).st_mtime
        except (OSError, UnsafePathError):
            used = info.st_mtime
        yield used, entry, _size(entry)


def _size(entry: Path) -> int:
    total = 0
    for top, _, files in os.walk(entry, followlinks=False):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(top, name)).st_size
    return total


def _remove_unused(entry: Path, recorded: Callable[[Path], Iterable[Path]] | None) -> bool:
    """Remove ``entry`` unless a process of this node uses it; whether it went."""
    fd = paths.lock_descriptor(_lock_name(entry))
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        aside = paths.new_private_dir(entry.parent, f".removing-{entry.name}.")
        try:
            os.rename(entry, aside / entry.name)
        except OSError as error:
            logger.info("could not remove %s from its cache: %s", entry, error)
            os.rmdir(aside)
            return False
        for path in recorded(entry) if recorded is not None else ():
            paths.remove_own(path)
        shutil.rmtree(aside, ignore_errors=True)
        logger.info("removed %s from its cache to make room", entry)
        return True
    finally:
        paths.close_lock(fd)


def move_aside(entry: Path, recorded: Iterable[Path]) -> Path | None:
    """Rename the damaged ``entry`` into a new private directory
    ``.damaged-<name>.<random>`` beside it and remove what this user recorded of it
    (``recorded``): where it went (None: it was gone already). :func:`sweep_aside`
    deletes it once no process of the node uses an entry of its name."""
    aside = paths.new_private_dir(entry.parent, f"{ASIDE_PREFIX}{entry.name}.")
    try:
        os.rename(entry, aside / entry.name)
    except FileNotFoundError:
        os.rmdir(aside)
        return None
    for path in recorded:
        paths.remove_own(path)
    logger.info("moved the damaged cache entry %s aside to %s", entry, aside / entry.name)
    return aside / entry.name


def sweep_aside(root: Path) -> list[Path]:
    """Delete the damaged entries moved aside in ``root`` (:func:`move_aside`) unless
    a process of this node holds the use lock of their name (a reader may still have
    one open): the ones deleted."""
    try:
        found = [item for item in os.scandir(root) if item.name.startswith(ASIDE_PREFIX)]
    except OSError:
        return []
    deleted = []
    for item in found:
        aside = Path(item.path)
        try:
            if item.is_symlink() or item.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            names = os.listdir(aside)
            fd = paths.lock_descriptor(_lock_name(root / names[0])) if names else None
        except (OSError, UnsafePathError):
            continue
        try:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(aside, ignore_errors=True)
            deleted.append(aside)
        except BlockingIOError:
            continue
        finally:
            if fd is not None:
                paths.close_lock(fd)
    return deleted
