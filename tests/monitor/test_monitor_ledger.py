"""The monitor's Ledger view, its window after a run, and server names cut to fit."""

from __future__ import annotations

from snakemake_context_monitor import CatalogSource
from snakemake_context_monitor.model import Memo
from snakemake_context_monitor.tables import clip_name
from snakemake_context_monitor.views import ledger

from tests.catalog_builder import EPOCH, CatalogBuilder


def test_server_names_keep_their_distinguishing_end() -> None:
    """At 10 columns the RQ4 pool's pilots were all `pilot-fak…`."""
    assert clip_name("pilot-fakea-0", 10) == "pilot-…a-0"
    assert clip_name("pilot-fakeb-5", 10) == "pilot-…b-5"
    assert clip_name("gpu0", 10) == "gpu0"
    assert len(clip_name("a-very-long-server-name-17", 12)) == 12


def _finished_run(path, minutes_ago: float) -> float:
    """A run of 10 jobs that ended ``minutes_ago``; returns the clock then."""
    with CatalogBuilder(path) as b:
        run = b.run("done", jobs_total=10)
        server = b.server("gpu0")
        model = b.context("smollm2")
        b.load(server, model, seconds=3)
        for _ in range(10):
            b.job(run, "score", server=server, context=model, seconds=6)
        b.leave(server)
        b.finish_run(run)
        end = b.now
    return end + 60 * minutes_ago


def test_after_a_run_the_window_covers_it_and_the_ledger_shows_it(tmp_path) -> None:
    """Opened 18 minutes after a run, the throughput chart is that run's (not a flat
    line over the last 15 minutes), and the Ledger view shows where its GPU-seconds
    went."""
    path = tmp_path / "catalog.db"
    now = _finished_run(path, 18)
    source = CatalogSource(path, clock=lambda: now)
    snapshot = source.fetch("15 min")
    source.close()
    assert snapshot.window == "last run"
    (overall,) = [s for s in snapshot.series if s.gpu_model == "all"]
    assert overall.start == EPOCH and sum(overall.jobs) == 10
    assert snapshot.ledger is not None and not snapshot.ledger.window.live
    model = ledger.page(snapshot, Memo())
    rows = model.tables["ledger-models"]
    assert set(rows) == {"h200", "all"}
    assert rows["h200"][2] == f"{100 * 60 / 63:.1f}%"  # useful: 60 s of 63
    assert rows["h200"][3] == f"{100 * 3 / 63:.1f}%"  # loading
    assert "Run done (ended)" in model.texts["ledger-summary"]


def test_the_ledger_view_shows_the_pools_books(tmp_path) -> None:
    path = tmp_path / "catalog.db"
    with CatalogBuilder(path) as b:
        run = b.run("pool-run")
        b.pilot("pilot-fakea-0", pilot_kind="fakea", submitted=b.now - 30, registered=b.now)
        b.server("pilot-fakea-0", allocated_at=b.now - 20)
        b.pilot("pilot-fakeb-1", pilot_kind="fakeb", submitted=b.now - 30)
        b.tick(60)
        b.pilot(
            "pilot-fakea-0",
            pilot_kind="fakea",
            submitted=b.now - 90,
            registered=b.now - 60,
            ended=b.now,
            released=True,
            busy_seconds=12.0,
        )
        b.finish_run(run)
        now = b.now
    source = CatalogSource(path, clock=lambda: now)
    snapshot = source.fetch("15 min")
    source.close()
    text = ledger.page(snapshot, Memo()).texts["ledger-summary"]
    assert "Pool: 2 pilot(s) submitted, 1 started, 0 running" in text, text
    assert "retired; pilot-seconds 60 (busy 12, idle 48)" in text, text
