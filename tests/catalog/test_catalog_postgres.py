"""The catalog on PostgreSQL: any SQLAlchemy URL works, and it may have several
writers.

Set SNAKEMAKE_CONTEXT_TEST_POSTGRES to a URL (``bash .ci/postgres`` starts a server
and prints one) to run these; CI also sets SNAKEMAKE_CONTEXT_REQUIRE_POSTGRES=1, which
turns their skip into a failure.
"""

from __future__ import annotations

import os
import threading

import pytest

from snakemake_executor_context.catalog.models import SCHEMA_VERSION, Base, Meta
from snakemake_executor_context.catalog.reading import status as queries
from snakemake_executor_context.catalog.store import CatalogSchemaError, open_reader, open_store
from snakemake_executor_context.catalog.writing.writer import CatalogWriter
from snakemake_executor_context.fleet import events as ev
from tests.conftest import context_run

URL = os.environ.get("SNAKEMAKE_CONTEXT_TEST_POSTGRES")
REQUIRED = os.environ.get("SNAKEMAKE_CONTEXT_REQUIRE_POSTGRES") == "1"
MODEL = "p" * 64


@pytest.fixture
def postgres():
    """A PostgreSQL URL whose database holds no catalog tables yet."""
    if not URL:
        message = "SNAKEMAKE_CONTEXT_TEST_POSTGRES is not set (bash .ci/postgres gives one)"
        if REQUIRED:
            pytest.fail(message + ", and SNAKEMAKE_CONTEXT_REQUIRE_POSTGRES=1")
        pytest.skip(message)
    empty_database(URL)
    yield URL
    empty_database(URL)


def empty_database(url: str) -> None:
    """Drop the catalog's tables and Alembic's version table."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    Base.metadata.drop_all(engine)
    with engine.begin() as connection:
        connection.execute(text("DROP TABLE IF EXISTS alembic_version"))
    engine.dispose()


def test_four_writers_share_servers_and_contexts(postgres):
    """Four runs write at once; all see the same server and context rows, and their
    transactions that cross (a deadlock PostgreSQL breaks) are retried, not warned of."""
    warnings: list[str] = []
    writers = [CatalogWriter(open_store(postgres), warn=warnings.append) for _ in range(4)]

    def run(index: int, catalog: CatalogWriter) -> None:
        run_id = f"run{index}"
        catalog.submit(ev.RunStarted(run_id=run_id))
        catalog.submit(ev.ServerJoined(address="tcp://shared", name="gpu0", slots=2))
        catalog.submit(ev.ContextReady(address="tcp://shared", identity=MODEL, load_seconds=3))
        for i in range(50):
            key = f"use-{i}-a1-{index:04x}{i:04x}"
            catalog.submit(
                ev.JobDispatched(
                    run_id=run_id,
                    key=key,
                    jobid=str(i),
                    rule="use",
                    context=MODEL,
                    target="tcp://shared",
                )
            )
            catalog.submit(ev.JobStarted(run_id=run_id, key=key, address="tcp://shared"))
            catalog.submit(
                ev.JobFinished(
                    run_id=run_id,
                    key=key,
                    address="tcp://shared",
                    context=MODEL,
                    started=1.0,
                    finished=2.0,
                    items=1,
                )
            )
            catalog.submit(ev.JobReported(run_id=run_id, key=key, jobid=str(i), rule="use"))
        catalog.submit(ev.RunFinished(run_id=run_id, ok=True))

    threads = [threading.Thread(target=run, args=(i, w)) for i, w in enumerate(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for catalog in writers:
        assert catalog.flush(60)
        catalog.close()
    assert not warnings, warnings
    with open_reader(postgres).session() as session:
        counts = queries.counts(session)
        runs = queries.runs(session)
        speed = queries.throughput(session)
    assert (counts.runs, counts.jobs, counts.attempts) == (4, 200, 200)
    assert counts.contexts == 1 and counts.servers == 1
    assert sorted((r.run_id, r.jobs_ok, r.items, r.state) for r in runs) == [
        (f"run{i}", 50, 50, "finished") for i in range(4)
    ]
    assert speed[0].jobs == 200


def test_schema_version_is_checked_on_postgres(postgres):
    catalog = open_store(postgres)
    with catalog.session() as session, session.begin():
        session.get(Meta, "schema_version").value = str(SCHEMA_VERSION + 5)
    catalog.close()
    with pytest.raises(CatalogSchemaError, match=r"--context-catalog NEW\.db"):
        open_store(postgres)


def test_one_live_row_per_address_is_a_partial_index_on_postgres(postgres):
    """The index's PostgreSQL condition is given when the table is created there (the
    models do not name it, so that SQLite runs never import PostgreSQL's dialect)."""
    from sqlalchemy import text

    catalog = open_store(postgres)
    with catalog.session() as session:
        definition = session.execute(
            text("SELECT indexdef FROM pg_indexes WHERE indexname = 'ux_servers_live_address'")
        ).scalar_one()
    catalog.close()
    assert definition.endswith('WHERE ("left" IS NULL)'), definition


@pytest.mark.slow
def test_a_run_records_into_postgres(workflow, postgres):
    workdir = workflow("placement")
    run = context_run(
        workdir,
        "--context-catalog",
        postgres,
        "--config",
        "count=4",
        "sleep=0",
        env={"TOY_LOAD_SECONDS": "0"},
    ).check()
    assert "cannot be written" not in run.output and "Cannot open the catalog" not in run.output
    assert not (workdir / ".snakemake" / "context" / "catalog.db").exists()
    with open_reader(postgres).session() as session:
        (row,) = queries.runs(session)
        assert (row.jobs_ok, row.items, row.state, row.workdir) == (4, 4, "finished", str(workdir))
        assert [c.name for c in queries.contexts(session)] == ["A"]
