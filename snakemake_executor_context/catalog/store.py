"""Opening a catalog: where it lives, its engine, and the schema version check.

A catalog is named by a path (SQLite) or any SQLAlchemy URL. SQLite runs in WAL mode
with a busy timeout, on node-local disk: when the requested path lies on a network
filesystem (:func:`is_network_fs`, from the mount table), the live database stays on
local disk and the writer publishes a snapshot to the requested path every few
seconds (:func:`publish_snapshot`); readers open that snapshot immutable.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, inspect, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from ..errors import ContextExecutorError
from ..privacy import private_dir as _private_dir
from .models import SCHEMA_VERSION, Base, Meta

__all__ = [
    "MOUNT_TABLE",
    "NETWORK_FILESYSTEMS",
    "CatalogError",
    "CatalogLocation",
    "CatalogSchemaError",
    "CatalogStore",
    "EmptyCatalogError",
    "is_network_fs",
    "open_reader",
    "open_store",
    "private_dir",
    "publish_snapshot",
    "resolve_location",
]

#: Where the mount table is read from (tests point it at a file of their own).
MOUNT_TABLE = Path("/proc/self/mounts")
#: Filesystem types where SQLite's locking and WAL cannot be trusted.
NETWORK_FILESYSTEMS = ("nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "smbfs", "fuse")
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
    and ``snapshot`` the requested path when that is on a network filesystem (the
    live file then lies on local disk).
    """

    requested: str
    url: str
    path: Path | None = None
    snapshot: Path | None = None

    def describe(self) -> str:
        """A short human form: the path (and where its live copy is), or the URL
        without its password."""
        if self.path is None:
            from sqlalchemy.engine import make_url

            return make_url(self.url).render_as_string(hide_password=True)
        if self.snapshot is not None:
            return f"{self.snapshot} (network filesystem: live copy {self.path})"
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


def is_network_fs(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` (or the nearest existing directory above it) is on a network
    filesystem: nfs, lustre, gpfs, beegfs, cifs or fuse, by the mount table."""
    target = Path(os.path.abspath(path))
    while not target.exists() and target != target.parent:
        target = target.parent
    real = os.path.realpath(target)
    for point, fstype in _mounts():
        if real == point or real.startswith(point.rstrip("/") + "/"):
            kind = fstype.lower()
            return any(kind == n or kind.startswith(n + ".") for n in NETWORK_FILESYSTEMS)
    return False


def _local_dir() -> Path:
    """Where live copies of network catalogs go: $SNAKEMAKE_CONTEXT_LOCAL_DIR, else
    $XDG_RUNTIME_DIR (private to the user), else the temporary directory."""
    base = os.environ.get("SNAKEMAKE_CONTEXT_LOCAL_DIR") or ""
    runtime = os.environ.get("XDG_RUNTIME_DIR") or ""
    if not base and runtime and os.path.isdir(runtime):
        base = runtime
    return Path(base or tempfile.gettempdir()) / f"snakemake-context-{os.getuid()}"


def private_dir(path: Path) -> Path:
    """Create ``path`` 0700, or check the one there (:mod:`..privacy`): another user
    could otherwise plant it to read or redirect what is written inside."""
    return _private_dir(
        path,
        CatalogError,
        "remove it (another user may have planted it), or set SNAKEMAKE_CONTEXT_LOCAL_DIR "
        "to a directory of your own; it must be yours and mode 0700.",
        tighten=False,
    )


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
    if is_network_fs(requested):
        digest = hashlib.sha256(str(requested).encode()).hexdigest()[:16]
        live = _local_dir() / digest / requested.name
        return CatalogLocation(
            requested=str(requested), url=f"sqlite:///{live}", path=live, snapshot=requested
        )
    return CatalogLocation(requested=str(requested), url=f"sqlite:///{requested}", path=requested)


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
                private_dir(location.path.parent.parent)
                private_dir(location.path.parent)
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
    except CatalogError:
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
    if not snapshot.exists():
        return
    sidecars = [Path(f"{live}{suffix}") for suffix in ("-wal", "-shm")]
    local = [p.stat().st_mtime for p in (live, sidecars[0]) if p.exists()]
    if local and max(local) > snapshot.stat().st_mtime:
        return
    for path in sidecars:
        path.unlink(missing_ok=True)
    shutil.copyfile(snapshot, live)


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
    """Create the tables of a new catalog, or refuse one of another schema version."""
    names = set(inspect(store.engine).get_table_names())
    if Meta.__tablename__ not in names:
        if names - {Meta.__tablename__}:
            raise _schema_error(store.location, None)
        if not create:
            raise EmptyCatalogError(f"The catalog {store.location.describe()} is empty.")
        Base.metadata.create_all(store.engine)
        try:
            with store.session() as session, session.begin():
                session.add(Meta(key="schema_version", value=str(SCHEMA_VERSION)))
                session.add(Meta(key="created", value=json.dumps(time.time())))
        except IntegrityError:
            pass  # another writer created it at the same moment
    with store.session() as session:
        found = session.scalar(select(Meta.value).where(Meta.key == "schema_version"))
    if found is None or found != str(SCHEMA_VERSION):
        raise _schema_error(store.location, found)


def _schema_error(location: CatalogLocation, found: str | None) -> CatalogSchemaError:
    from .._version import __version__

    where = location.describe()
    what = "is not a catalog of this plugin" if found is None else f"has schema version {found}"
    newer = found is not None and found.isdigit() and int(found) > SCHEMA_VERSION
    upgrade = (
        " or upgrade snakemake-executor-plugin-context to the version that wrote it;"
        if newer
        else ";"
    )
    aside = (
        f" or move the old file aside (mv {location.snapshot or location.path} "
        f"{location.snapshot or location.path}.old) to start a new one;"
        if location.path is not None
        else ""
    )
    return CatalogSchemaError(
        f"The catalog {where} {what}; this plugin ({__version__}) reads and writes "
        f"schema version {SCHEMA_VERSION}, and no migration between them exists. "
        "Nothing was written to it. Fix: use a new catalog path "
        "(--context-catalog NEW.db, or `snakemake-context up --catalog NEW.db`)"
        f"{aside}{upgrade} the old catalog stays readable by the version that wrote it."
    )


def publish_snapshot(live: Path, target: Path) -> None:
    """Copy the live SQLite catalog to ``target`` atomically: SQLite's backup API
    into a temporary file beside it, then a rename over the old snapshot."""
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(handle)
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
        os.replace(temporary, target)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
