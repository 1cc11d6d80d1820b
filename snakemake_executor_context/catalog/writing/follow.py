"""A SQLite catalog deleted or replaced under its writer: noticed, and its records
put where the user will look.

SQLite writes on into a file that was deleted (or renamed over) while it was open,
without an error: the records would vanish with the last descriptor. The writer
compares the file it opened with what is at the path (:func:`moved`, pure), and when
they differ writes what the catalog holds to a new file (SQLite's backup API, from the
open database) and records there from then on (:func:`rescue`): at the path again
when the file was deleted, beside it (``catalog.<run>.db``) when another file took its
place, which is left as it is.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from dataclasses import dataclass
from pathlib import Path

from ... import paths
from ..store import CatalogLocation, CatalogStore, open_store, resolve_location
from .lease import sibling_path

__all__ = ["FileId", "Moved", "file_id", "moved", "rescue"]


@dataclass(frozen=True)
class FileId:
    """Which file a path names: its device and inode."""

    device: int
    inode: int


@dataclass(frozen=True)
class Moved:
    """What happened to the catalog under its writer, and where its records went."""

    what: str  # "deleted" or "replaced"
    path: str
    now: str

    def describe(self, run: str) -> str:
        """The one line a run shows."""
        if self.what == "deleted":
            return (
                f"The context catalog {self.path} was deleted while {run} wrote to it; "
                "the run wrote it again there, with all it held (earlier runs' records "
                "included), and records into it to its end."
            )
        return (
            f"The context catalog {self.path} was replaced by another file while {run} "
            f"wrote to it; that file is left as it is, and the run's records (with all "
            f"the catalog held) are in {self.now}, where it records to its end (read it "
            f"with `snakemake-context status --catalog {self.now}`)."
        )


def file_id(path: Path) -> FileId | None:
    """The file at ``path`` (None when there is none, or its directory is gone)."""
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return FileId(info.st_dev, info.st_ino)


def moved(opened: FileId, now: FileId | None) -> str | None:
    """What happened to the file a writer opened, given what is at its path now:
    ``deleted``, ``replaced`` (another file is there), or None (it is still there)."""
    if now is None:
        return "deleted"
    return None if now == opened else "replaced"


def rescue(store: CatalogStore, what: str, name: str) -> tuple[CatalogStore, Moved]:
    """Copy the open catalog of ``store`` to where its records go now (its path when it
    was ``deleted``, ``catalog.<name>.db`` beside it when it was ``replaced``, or when
    a file appeared at the path meanwhile) and open it there; ``store`` is closed."""
    old = store.location
    assert old.path is not None
    target = old if what == "deleted" else _beside(old, name)
    directory = _live(target).parent
    directory.mkdir(parents=True, exist_ok=True)
    temporary = paths.new_private_file(directory, f".{_live(target).name}.")
    try:
        _backup(store, temporary)
        held = _held_open()
        store.close()
        # SQLite leaves the -wal and -shm of a file that moved: a new file at the
        # path would read them as its own. Those this process held are stale.
        for suffix in ("-wal", "-shm"):
            sidecar = Path(f"{old.path}{suffix}")
            if file_id(sidecar) in held:
                sidecar.unlink(missing_ok=True)
        try:
            os.link(temporary, _live(target))
        except FileExistsError:
            if target is not old:
                raise
            what, target = "replaced", _beside(old, name)
            os.link(temporary, _live(target))
    finally:
        temporary.unlink(missing_ok=True)
    return open_store(target.requested), Moved(what, old.describe(), target.requested)


def _live(location: CatalogLocation) -> Path:
    assert location.path is not None
    return location.path


def _beside(location: CatalogLocation, name: str) -> CatalogLocation:
    beside = resolve_location(sibling_path(location.requested, name))
    if beside.snapshot is not None:
        paths.private_path("catalogs", _live(beside).parent.name)
    return beside


def _backup(store: CatalogStore, target: Path) -> None:
    """Everything the open database holds, into ``target``."""
    raw = store.engine.raw_connection()
    try:
        copy = sqlite3.connect(target)
        try:
            raw.driver_connection.backup(copy)  # type: ignore[union-attr]
        finally:
            copy.close()
    finally:
        raw.close()


def _held_open() -> set[FileId | None]:
    """The regular files this process holds open (Linux: ``/proc/self/fd``)."""
    found: set[FileId | None] = set()
    try:
        descriptors = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for fd in descriptors:
        try:
            info = os.stat(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode):
            found.add(FileId(info.st_dev, info.st_ino))
    return found
