"""Opening a catalog: where it lives, its engine, and the schema version check.

A catalog is named by a path (SQLite) or any SQLAlchemy URL. SQLite runs in WAL mode
with a busy timeout, on node-local disk: when the requested path lies on a network
filesystem (:func:`is_network_fs`, from the mount table), or in a directory other
users may write to (SQLite would open its ``-wal``, ``-shm`` and journal files there
through whatever they planted), the live database stays in the private root
(:mod:`..paths`) and the writer publishes a snapshot to the requested path every few
seconds (:func:`publish_snapshot`, created exclusively and renamed into place);
readers open that snapshot immutable.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from .. import paths
from ..defaults import catalog_disabled
from ..errors import ContextExecutorError
from .migrations.runner import Revision, read_revision, upgrade
from .models import SCHEMA_VERSION

__all__ = [
    "MOUNT_TABLE",
    "NETWORK_FILESYSTEMS",
    "CatalogError",
    "CatalogLocation",
    "CatalogSchemaError",
    "CatalogStore",
    "EmptyCatalogError",
    "catalog_problem",
    "is_network_fs",
    "open_reader",
    "open_store",
    "publish_snapshot",
    "resolve_location",
]

#: Where the mount table is read from (tests point it at a file of their own).
MOUNT_TABLE = Path("/proc/self/mounts")
#: Filesystem types where SQLite's locking and WAL cannot be trusted.
NETWORK_FILESYSTEMS = ("nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "smbfs", "fuse")
#: Filesystems of the kernel's own (a file there is no disk file, whatever its mode).
KERNEL_FILESYSTEMS = (
    "proc",
    "sysfs",
    "devtmpfs",
    "devpts",
    "cgroup",
    "cgroup2",
    "debugfs",
    "tracefs",
    "securityfs",
    "configfs",
    "bpf",
    "pstore",
    "efivarfs",
    "mqueue",
)
#: Milliseconds a connection waits for a lock before it gives up.
BUSY_TIMEOUT_MS = 5000


class CatalogError(ContextExecutorError):
    """The catalog cannot be opened or written."""


class CatalogSchemaError(CatalogError):
    """The catalog was written with another schema version than this plugin's."""


class EmptyCatalogError(CatalogError):
    """A reader opened a catalog no run has written to yet."""


@dataclass(frozen=True)
class CatalogLocation:
    """Where a catalog lives.

    ``url`` is the live database's SQLAlchemy URL; for SQLite, ``path`` is its file
    and ``snapshot`` the requested path when that is on a network filesystem or in a
    directory other users may write (the live file then lies in the private root);
    ``why`` says which of the two.
    """

    requested: str
    url: str
    path: Path | None = None
    snapshot: Path | None = None
    why: str = ""

    def describe(self) -> str:
        """A short human form: the path (and where its live copy is), or the URL
        without its password."""
        if self.path is None:
            from sqlalchemy.engine import make_url

            return make_url(self.url).render_as_string(hide_password=True)
        if self.snapshot is not None:
            return f"{self.snapshot} ({self.why}: live copy {self.path})"
        return str(self.path)


def _mounts() -> list[tuple[str, str]]:
    """(mount point, filesystem type) of every mount, longest mount point first."""
    try:
        lines = MOUNT_TABLE.read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        parts = line.split()
        if len(parts) >= 3:
            point = parts[1].replace("\\040", " ")
            found.append((point, parts[2]))
    return sorted(found, key=lambda item: len(item[0]), reverse=True)


def _filesystem(path: str | os.PathLike[str]) -> str:
    """The type of the filesystem ``path`` (or the nearest existing directory above
    it) lies on, by the mount table, lower case ("" when none says)."""
    target = Path(os.path.abspath(path))
    while not target.exists() and target != target.parent:
        target = target.parent
    real = os.path.realpath(target)
    for point, fstype in _mounts():
        if real == point or real.startswith(point.rstrip("/") + "/"):
            return fstype.lower()
    return ""


def is_network_fs(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` (or the nearest existing directory above it) is on a network
    filesystem: nfs, lustre, gpfs, beegfs, cifs or fuse, by the mount table."""
    kind = _filesystem(path)
    return any(kind == n or kind.startswith(n + ".") for n in NETWORK_FILESYSTEMS)


def others_may_write(directory: Path) -> str | None:
    """Why users other than this one (and root) may create files in ``directory`` (or
    the nearest existing directory above it): its mode lets group or others write, or
    it is another user's; None when they may not."""
    target = Path(os.path.abspath(directory))
    while not target.exists() and target != target.parent:
        target = target.parent
    try:
        info = target.stat()
    except OSError:
        return None
    if info.st_uid not in (os.getuid(), 0):
        return f"in {target}, a directory of uid {info.st_uid}"
    if info.st_mode & 0o022:
        mode = f"{info.st_mode & 0o7777:04o}"
        return f"in {target}, a directory other users may write (mode {mode})"
    return None


def resolve_location(spec: str | os.PathLike[str]) -> CatalogLocation:
    """Turn a catalog path or URL into a :class:`CatalogLocation`."""
    text = os.fspath(spec)
    if "://" in text and not text.startswith("sqlite"):
        return CatalogLocation(requested=text, url=text)
    if text.startswith("sqlite"):
        from sqlalchemy.engine import make_url

        database = make_url(text).database
        if not database or database == ":memory:":
            return CatalogLocation(requested=text, url=text)
        text = database
    requested = Path(text).expanduser().absolute()
    why = "on a network filesystem" if is_network_fs(requested) else None
    why = why or others_may_write(requested.parent)
    if why:
        digest = hashlib.sha256(str(requested).encode()).hexdigest()[:16]
        live = paths.root_path() / "catalogs" / digest / requested.name
        return CatalogLocation(
            requested=str(requested),
            url=f"sqlite:///{live}",
            path=live,
            snapshot=requested,
            why=why,
        )
    return CatalogLocation(requested=str(requested), url=f"sqlite:///{requested}", path=requested)


def catalog_problem(spec: str, flag: str = "--context-catalog") -> str | None:
    """Why ``spec``, the value of ``flag``, can never be a catalog, found at start
    without making anything (``snakemake -n`` makes nothing): a directory, a special
    file (a device, a pipe, a file of the kernel's such as /proc/self/mem), a URL
    SQLAlchemy cannot read, of a kind of database it does not know, or whose driver
    is not installed. One clause ending in the fix; None when it may be one (opening
    it may still fail later: the run then goes on without recording)."""
    text = spec.strip()
    if catalog_disabled(text):
        return None
    if "://" in text:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError, NoSuchModuleError

        example = "postgresql+psycopg://user@host/db"
        try:
            url = make_url(text)
            dialect = url.get_dialect()
        except NoSuchModuleError:
            return (
                f"SQLAlchemy knows no database {url.drivername!r}. Fix: give a path, a "
                f"sqlite:/// URL or one such as {example}"
            )
        except ArgumentError as error:
            return f"it is not a URL SQLAlchemy reads ({error}). Fix: give a path or {example}"
        if url.get_backend_name() == "sqlite":
            if not url.database or url.database == ":memory:":
                return None
            return _path_problem(Path(url.database), flag)
        try:
            dialect.import_dbapi()
        except ImportError as error:
            driver = url.get_driver_name()
            return (
                f"its driver {driver} is not installed ({error}). Fix: install it into this "
                f"environment (pip install {driver}), or name a driver that is installed "
                f"({url.get_backend_name()}+DRIVER://...)"
            )
        return None
    return _path_problem(Path(text), flag)


def _path_problem(path: Path, flag: str) -> str | None:
    """:func:`catalog_problem` of a path: it, or the directory it would be made in, is
    a disk file's."""
    path = path.expanduser().absolute()
    fix = f"Fix: name a file on a disk ({flag} ~/catalog.db, say)"
    kernel = _filesystem(path)
    if kernel in KERNEL_FILESYSTEMS:
        return f"it is on {kernel}, a filesystem of the kernel's, not on disk. {fix}"
    try:
        mode = path.stat().st_mode
    except OSError:
        return None  # missing (made later), or unreadable: opening it says why
    if stat.S_ISDIR(mode):
        return f"it is a directory. Fix: name a file in it ({flag} {path / 'catalog.db'})"
    if not stat.S_ISREG(mode):
        return f"it is a special file (a device, a pipe or a socket), not a disk file. {fix}"
    return None


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    # WAL: readers never block the writer nor see a half-written transaction;
    # NORMAL sync is safe from corruption in WAL mode (a crash loses at most the
    # last transactions, never the file).
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _reader_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA query_only=1")
    cursor.close()


class CatalogStore:
    """An open catalog: its engine and sessions, after the schema check."""

    def __init__(self, location: CatalogLocation, engine: Engine) -> None:
        self.location = location
        self.engine = engine
        self.sessions = sessionmaker(engine, expire_on_commit=False)

    def session(self) -> Session:
        """A new session (use as a context manager)."""
        return self.sessions()

    def close(self) -> None:
        """Release the engine's connections."""
        self.engine.dispose()


def open_store(spec: str | os.PathLike[str], *, create: bool = True) -> CatalogStore:
    """Open a catalog for writing: create its tables if it is new, check its schema
    version otherwise (:class:`CatalogSchemaError`), and for a SQLite catalog on a
    network filesystem start from the last published snapshot.

    Raises :class:`CatalogError` when it cannot be opened.
    """
    location = resolve_location(spec)
    try:
        if location.path is not None:
            if location.snapshot is not None:
                paths.private_path("catalogs", location.path.parent.name)
            location.path.parent.mkdir(parents=True, exist_ok=True)
            if location.snapshot is not None:
                location.snapshot.parent.mkdir(parents=True, exist_ok=True)
                _start_from_snapshot(location.path, location.snapshot)
            engine = create_engine(location.url, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000})
            event.listen(engine, "connect", _sqlite_pragmas)
        else:
            engine = create_engine(location.url, pool_pre_ping=True)
        store = CatalogStore(location, engine)
        check_schema(store, create=create)
    except ContextExecutorError:  # a CatalogError, or a path refused (one line each)
        raise
    except Exception as error:
        raise CatalogError(
            f"Cannot open the catalog {location.describe()}: {type(error).__name__}: "
            f"{error}. Fix: give a writable path or a reachable database URL "
            "(--context-catalog, or `snakemake-context up --catalog`)."
        ) from error
    return store


def _start_from_snapshot(live: Path, snapshot: Path) -> None:
    """Take the published snapshot as the live copy unless the local copy is newer
    (this node's own writer stopped before it published its last events): another
    node may have written the catalog since this node last did."""
    try:  # only a snapshot this user wrote: another user's may be planted
        fd = paths.open_trusted(snapshot, fix=_MOVE_CATALOG)
    except FileNotFoundError:
        return
    with os.fdopen(fd, "rb") as source:
        sidecars = [Path(f"{live}{suffix}") for suffix in ("-wal", "-shm")]
        local = [p.stat().st_mtime for p in (live, sidecars[0]) if p.exists()]
        if local and max(local) > os.fstat(source.fileno()).st_mtime:
            return
        for path in sidecars:
            path.unlink(missing_ok=True)
        paths.write_private(live, source.read())


def open_reader(spec: str | os.PathLike[str]) -> CatalogStore:
    """Open a catalog to read it: a snapshot on a network filesystem immutable, a
    live SQLite file read-only next to its writer, any other URL as it is."""
    text = os.fspath(spec)
    location = resolve_location(text)
    try:
        if location.path is not None:
            target = location.snapshot or location.path
            if not target.exists():
                raise CatalogError(f"No catalog at {target}.")
            if location.snapshot is not None:
                # A snapshot is replaced by rename, never changed in place: immutable
                # reads need no locks (which network filesystems do not honour).
                url = f"sqlite:///file:{target}?immutable=1&uri=true"
                engine = create_engine(url)
            else:
                engine = create_engine(
                    f"sqlite:///{target}", connect_args={"timeout": BUSY_TIMEOUT_MS / 1000}
                )
                event.listen(engine, "connect", _reader_pragmas)
        else:
            engine = create_engine(location.url, pool_pre_ping=True)
        store = CatalogStore(location, engine)
        check_schema(store, create=False)
    except CatalogError:
        raise
    except Exception as error:
        raise CatalogError(
            f"Cannot read the catalog {location.describe()}: {type(error).__name__}: {error}."
        ) from error
    return store


def check_schema(store: CatalogStore, *, create: bool) -> None:
    """Bring a writer's catalog to this release's schema (create a new one, upgrade
    an older one in place: :mod:`.migrations`), or check a reader's; refuse a newer
    or a foreign one, and a reader's older one, in one line each."""
    with store.engine.connect() as connection:
        found = read_revision(connection)
    if found.current and found.missing:
        where = store.location.snapshot or store.location.path or store.location.describe()
        raise CatalogError(
            f"The catalog {store.location.describe()} lacks the table"
            f"{'s' if len(found.missing) > 1 else ''} {', '.join(found.missing)} of its "
            f"schema version {found.version}: it is damaged (or was changed by hand). "
            f"Fix: restore it from a copy, or move it aside (mv {where} {where}.damaged) "
            "and let the next run start a new one."
        )
    if found.current:
        return
    if found.version is None and not found.foreign:
        if not create:
            raise EmptyCatalogError(f"The catalog {store.location.describe()} is empty.")
    elif not found.older:
        raise _schema_error(store.location, found)
    elif not create:
        raise CatalogSchemaError(
            f"The catalog {store.location.describe()} has schema version {found.version}, "
            f"written by an older release; this plugin ({_version()}) reads schema version "
            f"{SCHEMA_VERSION}. Fix: upgrade it in place with `snakemake-context upgrade "
            f"--catalog {store.location.requested}` (the next run that writes to it does too)."
        )
    try:
        upgrade(store.engine)
    except Exception as error:
        raise CatalogError(
            f"Cannot bring the catalog {store.location.describe()} to schema version "
            f"{SCHEMA_VERSION}: {type(error).__name__}: {error}. Fix: use a new catalog path "
            "(--context-catalog NEW.db) or move this one aside, and report this with it."
        ) from error


def _version() -> str:
    from .._version import __version__

    return __version__


def _schema_error(location: CatalogLocation, found: Revision) -> CatalogSchemaError:
    where = location.describe()
    what = (
        "is not a catalog of this plugin"
        if found.foreign
        else f"has schema version {found.version}"
    )
    aside = (
        f" or move the old file aside (mv {location.snapshot or location.path} "
        f"{location.snapshot or location.path}.old) to start a new one;"
        if location.path is not None
        else ""
    )
    upgrade = (
        " or upgrade snakemake-executor-plugin-context to the release that wrote it;"
        if found.newer
        else ";"
    )
    return CatalogSchemaError(
        f"The catalog {where} {what}; this plugin ({_version()}) reads and writes schema "
        f"version {SCHEMA_VERSION} and upgrades older ones it knows. Nothing was written "
        "to it. Fix: use a new catalog path (--context-catalog NEW.db, or `snakemake-context "
        f"up --catalog NEW.db`){aside}{upgrade} the catalog stays readable by the release "
        "that wrote it."
    )


#: The fix for a catalog path another user planted.
_MOVE_CATALOG = (
    "remove it (another user may have planted it), or choose another catalog path "
    "(--context-catalog, or `snakemake-context up --catalog`)"
)


def publish_snapshot(live: Path, target: Path) -> None:
    """Copy the live SQLite catalog to ``target`` atomically: SQLite's backup API
    into a new file created exclusively beside it, then a rename over the old
    snapshot (never over another user's file)."""
    if not target.parent.exists():
        paths.private_dir(target.parent, _MOVE_CATALOG)
    temporary = str(paths.new_private_file(target.parent, f".{target.name}."))
    try:
        source = sqlite3.connect(f"file:{live}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_MS / 1000)
        try:
            copy = sqlite3.connect(temporary)
            try:
                source.backup(copy)
                # A snapshot is a plain rollback-journal file: readers open it
                # immutable, and a WAL file would never reach them.
                copy.execute("PRAGMA journal_mode=DELETE")
            finally:
                copy.close()
        finally:
            source.close()
        paths.replace_private(Path(temporary), target, _MOVE_CATALOG)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
