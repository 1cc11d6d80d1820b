"""The catalog's schema changes by migration: a catalog the release before this one
wrote (tests/data/catalogs, made by that release's own code) opens and is upgraded in
place, its runs show in `status` and the monitor; a newer one is refused in one line;
the migrations build exactly the tables the models declare."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, text

from snakemake_executor_context.catalog.migrations import runner
from snakemake_executor_context.catalog.models import SCHEMA_VERSION, Base
from snakemake_executor_context.catalog.reading import history
from snakemake_executor_context.catalog.store import (
    CatalogSchemaError,
    open_reader,
    open_store,
)
from tests.catalog.test_catalog_postgres import REQUIRED, URL, empty_database
from tests.conftest import BIN, TESTS

OLD = TESTS / "data" / "catalogs"
#: What the release before wrote into catalog-v1.sqlite (see its README).
OLD_RUNS, OLD_LOSSES, OLD_ATTEMPTS = 2, 4, 38


def _old_sqlite(tmp_path: Path) -> Path:
    path = tmp_path / "catalog.db"
    shutil.copy(OLD / "catalog-v1.sqlite", path)
    return path


def _scalars(url: str, query: str) -> list:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return list(connection.execute(text(query)).scalars())
    finally:
        engine.dispose()


def test_the_migrations_are_numbered_by_schema_version():
    script = ScriptDirectory(str(Path(runner.__file__).parent))
    assert script.get_heads() == [runner.HEAD] == [f"{SCHEMA_VERSION:04d}"]
    chain = [rev.revision for rev in script.walk_revisions()][::-1]
    assert chain == [f"{n:04d}" for n in range(1, SCHEMA_VERSION + 1)]


def test_the_migrations_build_what_the_models_declare(tmp_path):
    """The migrations alone, from the first, build what the models declare (a new
    catalog gets the models' tables at once, stamped as the newest revision)."""
    url = f"sqlite:///{tmp_path / 'migrated.db'}"
    engine = create_engine(url)
    runner.migrate(engine)
    with engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    engine.dispose()
    assert diff == []
    open_store(tmp_path / "new.db").close()
    for path in ("migrated.db", "new.db"):
        url = f"sqlite:///{tmp_path / path}"
        assert _scalars(url, "select version_num from alembic_version") == [runner.HEAD]
        assert _scalars(url, "select value from catalog_meta where key = 'schema_version'") == [
            str(SCHEMA_VERSION)
        ]


def test_a_catalog_of_the_release_before_is_upgraded_when_written(tmp_path):
    path = _old_sqlite(tmp_path)
    with pytest.raises(CatalogSchemaError) as refused:
        open_reader(path)  # a reader never migrates: it says how to
    assert "schema version 1" in str(refused.value) and "snakemake-context upgrade" in str(
        refused.value
    )
    assert "\n" not in str(refused.value)
    open_store(path).close()  # a writer upgrades in place
    url = f"sqlite:///{path}"
    assert _scalars(url, "select version_num from alembic_version") == [runner.HEAD]
    assert _scalars(url, "select count(*) from attempts") == [OLD_ATTEMPTS]
    with open_store(path).engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert diff == [], "an upgraded catalog has the new release's tables"
    reader = open_reader(path)
    with reader.session() as session:
        runs = history.runs(session, limit=10)
        losses = history.losses(session, limit=10)
    assert sorted(run.jobs_ok for run in runs) == [10, 24]
    assert len(losses) == OLD_LOSSES


#: Rows a catalog of schema version 3 held (one of each table the upgrade touches).
SCHEMA_3_ROWS: list[tuple[str, dict[str, object]]] = [
    (
        "servers",
        {
            "id": 1,
            "address": "tcp://a:1",
            "name": "gpu0",
            "host": "n1",
            "gpus": 1,
            "gpu_model": "h200",
            "is_mig": False,
            "slots": 1,
            "joined": 10.0,
        },
    ),
    (
        "contexts",
        {
            "id": 1,
            "identity": "abc",
            "name": "smollm2",
            "loader": "l",
            "arguments": "{}",
            "first_seen": 10.0,
        },
    ),
    (
        "placements",
        {
            "context_id": 1,
            "server_id": 1,
            "state": "ready",
            "loading_at": 11.0,
            "ready_at": 16.0,
            "load_seconds": 5.0,
            "from_cache": True,
            "conversions": 1,
            "reload_seconds": 2.0,
        },
    ),
    ("events", {"at": 16.0, "kind": "context-ready", "text": "smollm2 loaded"}),
]


def _alembic(url: str, command_name: str, revision: str) -> None:
    """Run one of Alembic's commands (upgrade, downgrade) to ``revision`` on ``url``."""
    from alembic import command
    from alembic.config import Config

    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            config = Config()
            config.set_main_option("script_location", str(Path(runner.__file__).parent))
            config.attributes["connection"] = connection
            getattr(command, command_name)(config, revision)
            connection.commit()
    finally:
        engine.dispose()


def test_a_schema_3_catalog_is_upgraded_to_the_newest_and_keeps_its_rows(tmp_path):
    """A catalog of schema version 3, its rows written in SQL: the writer upgrades it,
    its placements and events are kept (the new columns empty, the new table there and
    empty), and the downgrade goes back to 3 keeping them."""
    path = tmp_path / "three.db"
    url = f"sqlite:///{path}"
    _alembic(url, "upgrade", "0003")
    engine = create_engine(url)
    with engine.begin() as connection:
        for table, row in SCHEMA_3_ROWS:
            names = ", ".join(row)
            values = ", ".join(f":{name}" for name in row)
            connection.execute(text(f"insert into {table} ({names}) values ({values})"), row)
    engine.dispose()
    assert _scalars(url, "select value from catalog_meta where key = 'schema_version'") == ["3"]
    open_store(path).close()  # the writer upgrades it
    assert _scalars(url, "select version_num from alembic_version") == [runner.HEAD]
    assert _scalars(url, "select value from catalog_meta where key = 'schema_version'") == [
        str(SCHEMA_VERSION)
    ]
    placement = (
        "select load_seconds, conversions, reload_seconds, peer_seconds, ranks, gang "
        "from placements"
    )
    engine = create_engine(url)
    with engine.connect() as connection:
        found = [tuple(r) for r in connection.execute(text(placement))]
        assert found == [(5.0, 1, 2.0, None, None, None)]
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    engine.dispose()
    assert diff == []
    assert _scalars(url, "select count(*) from transfers") == [0]
    assert _scalars(url, "select count(*) from damaged_entries") == [0]
    assert _scalars(url, "select text from events") == ["smollm2 loaded"]
    _alembic(url, "downgrade", "0003")
    assert _scalars(url, "select value from catalog_meta where key = 'schema_version'") == ["3"]
    assert _scalars(url, "select load_seconds from placements") == [5.0]
    tables = _scalars(url, "select name from sqlite_master where type = 'table'")
    assert "transfers" not in tables and "damaged_entries" not in tables
    assert "placements" in tables


def test_status_and_the_monitor_show_the_runs_of_an_upgraded_catalog(tmp_path):
    path = _old_sqlite(tmp_path)
    upgrade = subprocess.run(
        [str(BIN / "snakemake-context"), "upgrade", "--catalog", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert upgrade.returncode == 0, upgrade.stderr
    status = subprocess.run(
        [str(BIN / "snakemake-context"), "status", "--catalog", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert len(report["runs"]) == OLD_RUNS
    from snakemake_context_monitor.data import CatalogSource

    source = CatalogSource(str(path))
    source.open()
    try:
        snapshot = source.fetch("all")
    finally:
        source.close()
    assert len(snapshot.runs) == OLD_RUNS


def test_a_newer_catalog_is_refused_in_one_line(tmp_path):
    path = tmp_path / "newer.db"
    open_store(path).close()
    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as connection:
        newer = f"{SCHEMA_VERSION + 1:04d}"
        connection.execute(text("update alembic_version set version_num = :v"), {"v": newer})
        connection.execute(
            text("update catalog_meta set value = :v where key = 'schema_version'"),
            {"v": str(SCHEMA_VERSION + 1)},
        )
    engine.dispose()
    for opener in (open_store, open_reader):
        with pytest.raises(CatalogSchemaError) as refused:
            opener(path)
        message = str(refused.value)
        assert f"has schema version {SCHEMA_VERSION + 1}" in message and "\n" not in message
        assert "upgrade snakemake-executor-plugin-context" in message


def test_a_release_before_the_migrations_refuses_an_upgraded_catalog(tmp_path):
    """Releases before Alembic compared catalog_meta's schema_version with 1 and refused
    any other in one line: every migration writes the new number there."""
    path = _old_sqlite(tmp_path)
    open_store(path).close()
    assert _scalars(f"sqlite:///{path}", "select value from catalog_meta")[0] == str(SCHEMA_VERSION)


@pytest.fixture
def postgres():
    if not URL:
        message = "SNAKEMAKE_CONTEXT_TEST_POSTGRES is not set (bash .ci/postgres gives one)"
        if REQUIRED:
            pytest.fail(message + ", and SNAKEMAKE_CONTEXT_REQUIRE_POSTGRES=1")
        pytest.skip(message)
    empty_database(URL)
    yield URL
    empty_database(URL)


def test_a_postgres_catalog_of_the_release_before_is_upgraded(postgres):
    """The release before wrote it (a pg_dump of its catalog); restored here, then
    opened by this release's writer, upgraded in place, and read."""
    import psycopg

    dump = (OLD / "catalog-v1.postgresql.sql").read_text()
    plain = postgres.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(plain, autocommit=True) as connection:
        connection.execute(dump)
        # pg_dump empties the search path for its session; later sessions keep theirs.
    with pytest.raises(CatalogSchemaError, match="schema version 1"):
        open_reader(postgres)
    open_store(postgres).close()
    assert _scalars(postgres, "select version_num from alembic_version") == [runner.HEAD]
    store = open_store(postgres)
    with store.engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    store.close()
    assert diff == []
    reader = open_reader(postgres)
    with reader.session() as session:
        assert len(history.runs(session, limit=10)) == 1
        assert len(history.losses(session, limit=10)) >= 1
    reader.close()


def test_two_writers_upgrade_one_postgres_catalog_once(postgres):
    """Writers of a database server open it at once: the advisory lock makes the
    upgrade happen once, the other writer finds it done."""
    import threading

    import psycopg

    dump = (OLD / "catalog-v1.postgresql.sql").read_text()
    with psycopg.connect(postgres.replace("+psycopg", ""), autocommit=True) as connection:
        connection.execute(dump)
    errors: list[BaseException] = []

    def open_it() -> None:
        try:
            open_store(postgres).close()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=open_it) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert _scalars(postgres, "select version_num from alembic_version") == [runner.HEAD]
