"""What revision a catalog is at, and bringing it to this release's (see the package).

Reading the revision is plain SQL (two small tables), so a catalog already at the
newest revision costs no Alembic import; the upgrade runs Alembic's own commands on
the writer's connection, in one transaction (on PostgreSQL under an advisory lock,
taken before the revision is read, so that concurrent writers upgrade once), with
:mod:`.env` as its environment.

A new catalog is all or nothing too: pysqlite begins no transaction before DDL (each
``CREATE TABLE`` would commit on its own, and a run killed meanwhile left some tables
and no version stamp), so on SQLite the upgrade opens one itself (``BEGIN
IMMEDIATE``). What such an interrupted creation left, by releases before this one
(only tables of this schema, with its columns, all empty: :func:`leftovers`), is
dropped and built again in that transaction, not refused as a foreign database.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Connection, Engine, insert, inspect, text

from ..models import SCHEMA_VERSION, Base

__all__ = ["HEAD", "Revision", "leftovers", "migrate", "read_revision", "upgrade"]

#: PostgreSQL's advisory lock of an upgrade ("smkctx" in hex).
ADVISORY_LOCK = 0x736D6B637478
#: The newest revision, which this release writes: revision "0002" is schema version 2.
HEAD = f"{SCHEMA_VERSION:04d}"
#: Alembic's own table, which a new catalog gets beside the models' tables.
ALEMBIC_TABLE = "alembic_version"


@dataclass(frozen=True)
class Revision:
    """Where a catalog stands, as a schema version: None is an empty database;
    ``foreign``: tables that are not a catalog of this plugin; ``stamped``: Alembic's
    own table names it (catalogs of schema version 1 predate it); ``missing``: tables
    of this release's schema the catalog lacks (a damaged one, when it is current);
    ``unfinished``: the empty tables an interrupted creation left (version None)."""

    version: int | None
    foreign: bool = False
    stamped: bool = True
    missing: tuple[str, ...] = ()
    unfinished: tuple[str, ...] = ()

    @property
    def current(self) -> bool:
        """At this release's schema."""
        return self.version == SCHEMA_VERSION and self.stamped

    @property
    def older(self) -> bool:
        """An older schema this release upgrades: version 1, or a stamped older one."""
        if self.version is None or self.foreign or self.version >= SCHEMA_VERSION:
            return False
        return self.stamped or self.version == 1

    @property
    def newer(self) -> bool:
        """A schema newer than this release's (a newer release wrote it)."""
        return self.version is not None and self.version > SCHEMA_VERSION


def read_revision(connection: Connection) -> Revision:
    """The schema of the catalog on ``connection`` (plain SQL, no Alembic). The
    number in ``catalog_meta`` wins over Alembic's: every migration writes both, so
    they differ only when something else changed one."""
    inspector = inspect(connection)
    tables = set(inspector.get_table_names())
    if not tables:
        return Revision(None)
    meta = None
    if "catalog_meta" in tables:
        meta = connection.execute(
            text("SELECT value FROM catalog_meta WHERE key = 'schema_version'")
        ).scalar()
    if meta is None:
        columns = {t: [c["name"] for c in inspector.get_columns(t)] for t in tables}
        if leftovers(columns) and not _rows(connection, tables):
            return Revision(None, unfinished=tuple(sorted(tables)))
        return Revision(None, foreign=True)
    if not str(meta).lstrip("-").isdigit():
        return Revision(None, foreign=True)
    stamped = ALEMBIC_TABLE in tables
    if stamped:
        found = connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
        stamped = found is not None and str(found).isdigit() and int(found) == int(meta)
    missing = tuple(sorted(set(Base.metadata.tables) - tables))
    return Revision(int(meta), stamped=stamped, missing=missing)


def leftovers(columns: Mapping[str, Collection[str]]) -> bool:
    """Whether tables (name -> column names) are each one of this release's catalog,
    with exactly its columns: what an interrupted creation leaves (a foreign database
    that happens to have a table ``runs`` has other columns)."""
    ours = {name: {c.name for c in table.columns} for name, table in Base.metadata.tables.items()}
    ours[ALEMBIC_TABLE] = {"version_num"}
    return all(set(found) == ours.get(name) for name, found in columns.items())


def _rows(connection: Connection, tables: Collection[str]) -> bool:
    """Whether any of ``tables`` (this catalog's names, never a user's) holds a row."""
    return any(
        connection.execute(text(f'SELECT 1 FROM "{table}" LIMIT 1')).first() is not None
        for table in tables
    )


def upgrade(engine: Engine) -> Revision:
    """Bring the catalog to :data:`HEAD`; where it was. An empty database gets the
    models' tables at once and Alembic's stamp (what the migrations build, a test
    checks; this skips importing Alembic on a run's first start), in place of what an
    interrupted creation left. All in one transaction. The caller checks first that it
    is empty, unfinished or :attr:`Revision.older`."""
    with engine.connect() as connection:
        if connection.dialect.name == "postgresql":
            # Writers of a database server may open a catalog at once: one creates
            # or upgrades it, the others wait here and then find it current.
            lock = text("SELECT pg_advisory_xact_lock(:key)")
            connection.execute(lock, {"key": ADVISORY_LOCK})
        elif connection.dialect.name == "sqlite":
            # pysqlite begins none before DDL: without this, each CREATE commits alone.
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        before = read_revision(connection)
        if before.version is None and not before.foreign:
            _create(connection, before.unfinished)
        elif not before.current:
            _migrate(connection, before)
        connection.commit()
    return before


def _create(connection: Connection, unfinished: Collection[str]) -> None:
    """The newest schema in an empty database, stamped with :data:`HEAD`, in place of
    the ``unfinished`` tables an interrupted creation left."""
    from sqlalchemy import Column, MetaData, PrimaryKeyConstraint, String, Table

    from ..models import Meta

    if unfinished:
        connection.exec_driver_sql(f"DROP TABLE IF EXISTS {ALEMBIC_TABLE}")
        Base.metadata.drop_all(connection)
    Base.metadata.create_all(connection)
    version = Table(
        ALEMBIC_TABLE,
        MetaData(),
        Column("version_num", String(32), nullable=False),
        PrimaryKeyConstraint("version_num", name="alembic_version_pkc"),
    )
    version.create(connection)
    connection.execute(version.insert().values(version_num=HEAD))
    connection.execute(insert(Meta).values(key="schema_version", value=str(SCHEMA_VERSION)))
    connection.execute(insert(Meta).values(key="created", value=json.dumps(time.time())))


def migrate(engine: Engine) -> None:
    """Build an empty database by the migrations alone, from the first (tests compare
    what they build with the models)."""
    with engine.connect() as connection:
        _migrate(connection, read_revision(connection))
        connection.commit()


def _migrate(connection: Connection, before: Revision) -> None:
    """Alembic's upgrade to :data:`HEAD` on ``connection`` (a catalog of schema
    version 1 is stamped first: it predates Alembic's table)."""
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(Path(__file__).parent))
    config.attributes["connection"] = connection
    if before.version is not None and not before.stamped:
        command.stamp(config, f"{before.version:04d}")
    command.upgrade(config, "head")
