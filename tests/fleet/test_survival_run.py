"""Survival placement on a real embedded cluster: two servers of very different
survival (by the catalog's history of their groups), a real snakemake run."""

from __future__ import annotations

import sqlite3

from tests.catalog_builder import CatalogBuilder
from tests.conftest import context_run

FAST = {"TOY_LOAD_SECONDS": "1"}


def _history(workdir) -> None:
    """The run's catalog, made before it: servers of group 'short' lost within 10 s,
    servers of group 'long' closed after two hours (censored)."""
    private = workdir / ".snakemake" / "context"
    private.mkdir(parents=True, mode=0o700)
    (workdir / ".snakemake").chmod(0o700)
    builder = CatalogBuilder(private / "catalog.db")
    for n in range(6):
        short = builder.server(f"old-short-{n}", gpu=None, group="short")
        long_lived = builder.server(f"old-long-{n}", gpu=None, group="long")
        builder.tick(5 + n)
        builder.lose_server(short)
        builder.tick(7200)
        builder.leave(long_lived)
    builder.commit()
    builder.close()


def test_the_load_goes_to_the_long_lived_server_and_short_jobs_still_run_on_the_other(
    workflow,
):
    workdir = workflow("placement")
    _history(workdir)
    context_run(
        workdir,
        "--context-servers",
        "2",
        "--context-tuning",
        "server_group=short:1,long:1",
        "survival_placement",
        "--config",
        "count=16",
        "sleep=0.3",
        "contexts=A",
        env=FAST,
    ).check()
    with sqlite3.connect(workdir / ".snakemake" / "context" / "catalog.db") as db:
        rows = db.execute(
            "select s.group_label, a.placed_by from attempts a "
            "join servers s on a.server_id = s.id "
            "where s.name not like 'old-%' order by a.dispatched"
        ).fetchall()
        groups = dict(
            db.execute("select name, group_label from servers where name not like 'old-%'")
        )
    assert sorted(groups.values()) == ["long", "short"], groups
    first_group, first_step = rows[0]
    # The first load: the long-lived server, chosen for its survival.
    assert (first_group, first_step) == ("long", "liveliest"), rows[:3]
    # The short-lived server is not left idle: it takes jobs too.
    assert any(group == "short" for group, _ in rows), rows
