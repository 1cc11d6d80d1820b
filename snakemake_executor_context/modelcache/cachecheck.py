"""Whether a model-cache entry of this user's still holds what its recorded manifest
says: checked before every load that uses it (:mod:`..modelcache`), and a damaged one
moved aside.

- The set of files and their sizes, always: one ``lstat`` of each file.
- Digests (sha256), only of the files whose stat changed since the entry was last
  verified (size, inode, modification and status-change times: ``st_ctime`` cannot be
  set back, so a file rewritten and given its old ``mtime`` again with ``utime`` is
  read again), and of every file when no verification is recorded (never verified
  here, or a peer that fetched it found a file whose digest differs: :func:`forget`).
  Each file's stat at its last verification is kept in the private root
  (``verified/``), never beside the files.
- A conversion or a transfer records the verification as it makes the entry
  (:func:`record`, with the stat taken before the manifest's digests were: what a
  transfer digested as it wrote, what a conversion read once after writing), so the
  first load reads nothing a second time.

A damaged entry is renamed out of the way (:func:`.cacheroom.move_aside`; deleted once
no process of the node uses it), with one line on stderr (on a server: the job's log)
and a :class:`Damaged` for whoever watches in that thread (:func:`watching`: a server
turns each into an event, and so a catalog row).

Not caught: a change that leaves the files' sizes, inodes and times as they were (bit
rot on the medium; a write within the timestamp granularity of the filesystem right
after a check), until digests are next taken. Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .. import paths
from ..errors import ManifestError, UnsafePathError
from . import cacheroom
from .manifest import Manifest, digest_file, walk_files

__all__ = [
    "DIFFERS",
    "Damage",
    "Damaged",
    "FileStat",
    "check",
    "conversion_lock",
    "file_stats",
    "forget",
    "manifest_path",
    "own_damage",
    "plan",
    "record",
    "recorded_files",
    "set_aside",
    "verified_path",
    "watching",
]

#: What is compared of a file between two checks: size, inode, device, mtime, ctime (ns).
FileStat = tuple[int, int, int, int, int]


@dataclass(frozen=True)
class Damaged:
    """A damaged entry, moved aside: where it was, where it went ("" when another
    process had moved it already), and what differed (one line)."""

    entry: str
    aside: str
    problem: str


#: What a damaged entry does (a :class:`Damage` begins with it).
DIFFERS = "differs from what you recorded when it was written"


class Damage(str):
    """Why an entry of this user's may not be used: it differs from the manifest
    recorded when it was written (it goes aside, :func:`set_aside`)."""


_watchers = threading.local()


def manifest_path(entry: Path) -> Path:
    """Where the manifest this user recorded for ``entry`` lies (private root)."""
    return paths.private_path("manifests") / f"{cacheroom.entry_key(entry)}.json"


def verified_path(entry: Path) -> Path:
    """Where the stat of ``entry``'s files at their last verification lies."""
    return paths.private_path("verified") / f"{cacheroom.entry_key(entry)}.json"


def recorded_files(entry: Path) -> list[Path]:
    """What this user records of ``entry`` in the private root (removed with it)."""
    return [manifest_path(entry), verified_path(entry)]


def conversion_lock(entry: Path) -> str:
    """The name of the lock under which ``entry`` is made, or moved aside, on a node."""
    return f"convert-{cacheroom.entry_key(entry)}.lock"


def file_stats(directory: Path) -> dict[str, FileStat]:
    """The stat of each file under ``directory`` by relative path (no symlink
    followed: :class:`ManifestError`)."""
    found = {}
    for name in walk_files(directory):
        info = os.lstat(directory / name)
        found[name] = (info.st_size, info.st_ino, info.st_dev, info.st_mtime_ns, info.st_ctime_ns)
    return found


def plan(
    manifest: Manifest, found: dict[str, FileStat], seen: dict[str, FileStat] | None
) -> tuple[str | None, list[str]]:
    """The pure decision: (what differs from ``manifest`` by names and sizes alone,
    or None; the files whose digests must be taken: all without ``seen``, else those
    whose stat is not the one ``seen`` at the last verification)."""
    listed = {entry.path: entry for entry in manifest.files}
    for name, entry in listed.items():
        if name not in found:
            return f"{name}: missing (the manifest lists it)", []
        if found[name][0] != entry.size:
            return f"{name}: {found[name][0]} bytes, the manifest says {entry.size}", []
    extra = sorted(set(found) - set(listed))
    if extra:
        return f"{extra[0]}: not in the manifest", []
    return None, [name for name in sorted(listed) if seen is None or seen.get(name) != found[name]]


def _seen(entry: Path) -> dict[str, FileStat] | None:
    try:
        data = json.loads(paths.read_trusted(verified_path(entry)) or b"null")
        return None if data is None else {k: tuple(v) for k, v in data["files"].items()}
    except (OSError, UnsafePathError, ValueError, KeyError, TypeError, AttributeError):
        return None


def record(entry: Path, seen: dict[str, FileStat]) -> None:
    """Record ``seen`` (:func:`file_stats` taken before the files were digested) as
    ``entry``'s last verification."""
    with contextlib.suppress(OSError, UnsafePathError):
        paths.write_private(verified_path(entry), json.dumps({"files": seen}))


def forget(entry: Path) -> None:
    """Forget ``entry``'s last verification: its next check takes every digest."""
    with contextlib.suppress(OSError, UnsafePathError):
        paths.remove_own(verified_path(entry))


def check(entry: Path, where: Path, manifest: Manifest, *, digests: bool) -> str | None:
    """What differs between ``entry`` (read through ``where``) and ``manifest``, or
    None: names and sizes always; with ``digests``, the sha256 of the files
    :func:`plan` names (then the verification is recorded)."""
    try:
        found = file_stats(where)
    except ManifestError as error:
        return str(error).rstrip(".")
    problem, stale = plan(manifest, found, _seen(entry))
    if problem or not stale or not digests:
        return problem
    expected = {e.path: e.sha256 for e in manifest.files}
    for name in stale:
        try:
            _, sha256 = digest_file(where / name)
        except ManifestError as error:
            return str(error).rstrip(".")
        if sha256 != expected[name]:
            return f"{name}: sha256 {sha256[:16]}..., the manifest says {expected[name][:16]}..."
    try:
        after = file_stats(where)
    except ManifestError as error:
        return str(error).rstrip(".")
    if after != found:
        return "its files changed while they were checked"
    record(entry, found)
    return None


def own_damage(entry: Path, where: Path, *, digests: bool) -> str | None:
    """How an entry of this user's that nobody else could write differs from the
    manifest recorded when it was written (:func:`check`: a :class:`Damage`), or None
    (also when none was recorded: an entry written by other means)."""
    try:
        manifest = Manifest.read(manifest_path(entry))
    except (ManifestError, UnsafePathError) as error:
        return f"has recorded digests that cannot be read ({error})"
    if manifest is None:
        return None
    problem = check(entry, where, manifest, digests=digests)
    return None if problem is None else Damage(f"{DIFFERS} ({problem})")


@contextlib.contextmanager
def watching() -> Iterator[list[Damaged]]:
    """The damaged entries this thread moves aside inside the block."""
    found: list[Damaged] = []
    outer = getattr(_watchers, "lists", [])
    _watchers.lists = [*outer, found]
    try:
        yield found
    finally:
        _watchers.lists = outer


def set_aside(
    entry: Path, problem: str, found: tuple[int, int] | None, *, locked: bool
) -> Damaged | None:
    """Move the damaged ``entry`` aside (what was recorded of it removed), if it is
    still the directory found damaged (``found``: its device and inode; None: the
    caller holds the conversion lock since it looked), under its conversion lock
    (unless ``locked``: the caller holds it); say so in one line on stderr, and tell
    this thread's watchers. None: it was replaced or gone meanwhile."""
    lock = contextlib.nullcontext() if locked else paths.private_lock(conversion_lock(entry))
    with lock:
        try:
            info = os.lstat(entry)
        except FileNotFoundError:
            return None
        if found is not None and (info.st_dev, info.st_ino) != found:
            return None
        aside = cacheroom.move_aside(entry, recorded_files(entry))
    damaged = Damaged(str(entry), str(aside or ""), problem)
    where = f"moved aside to {aside}" if aside else "moved aside by another process"
    print(
        f"[snakemake-context] the model-cache entry {entry} {problem}: {where}; nothing "
        "was loaded from it, it is made again (from a peer or the source).",
        file=sys.stderr,
        flush=True,
    )
    for watcher in getattr(_watchers, "lists", []):
        watcher.append(damaged)
    return damaged
