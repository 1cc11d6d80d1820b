"""Servers' lives where people look: each live server's expected life left in
``status`` and the monitor, and a run's lives against the prediction in the report.

Catalogs are built with the catalog's own builder; expected values are computed by
hand, and checked against :func:`~snakemake_executor_context.fleet.survival.kaplan_meier`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from snakemake_executor_context.catalog.reading import status as queries
from snakemake_executor_context.catalog.reading.ledger import export_json, window_of
from snakemake_executor_context.catalog.reading.lives import (
    catalog_lives_left,
    group_lives,
    lives_text,
    median_life,
)
from snakemake_executor_context.catalog.reading.overview import format_overview
from snakemake_executor_context.catalog.store import open_reader
from snakemake_executor_context.fleet.survival import (
    PRIOR_MEAN_LIFE,
    REFRESH_SECONDS,
    Life,
    kaplan_meier,
)
from snakemake_executor_context.report.reportcommand import read_report
from tests.catalog_builder import EPOCH, CatalogBuilder
from tests.monitor.test_monitor import drive, make_app, rows, text

#: The live server's age when it is looked at (``NOW`` falls on a multiple of
#: REFRESH_SECONDS: the monitor estimates as of the last one).
AGE = 40.0
NOW = EPOCH + 180 + AGE
#: Its expected life left, by hand: lives 40 (alive), 60 and 120 (died), 180 (closed);
#: Kaplan-Meier 1 to 60, 2/3 to 120, 1/3 to 180, then a constant hazard of 2 deaths
#: in 400 s: 20 + 40 + 20 + 200/3 seconds.
LEFT = 20 + 2 / 3 * 60 + 1 / 3 * 60 + 1 / 3 * 200


@pytest.fixture
def history(tmp_path: Path) -> Path:
    """Three servers of group 'short': lost at 60 and 120 s, the third closed at 180 s;
    then a fourth joins."""
    path = tmp_path / "catalog.db"
    with CatalogBuilder(path) as b:
        first, second, third = (b.server(f"s{i}", group="short") for i in range(3))
        b.tick(60)
        b.lose_server(first, reason="lost (preempted)")
        b.tick(60)
        b.lose_server(second)
        b.tick(60)
        b.leave(third)
        b.server("s3", group="short")
    return path


def _read(path: Path, what: Any) -> Any:
    store = open_reader(str(path))
    try:
        with store.session() as session:
            return what(session)
    finally:
        store.close()


def test_a_live_servers_life_left_is_its_groups_kaplan_meier_at_its_age(history):
    assert NOW % REFRESH_SECONDS == 0
    lives = [Life(AGE, False), Life(60, True), Life(120, True), Life(180, False)]
    assert kaplan_meier(lives).remaining(AGE) == pytest.approx(LEFT)
    ((server, life),) = _read(history, lambda s: catalog_lives_left(s, now=NOW))
    assert (server.name, server.group) == ("s3", "short")
    assert life.seconds == pytest.approx(LEFT)
    assert (life.source, life.lives, life.deaths, life.known) == ("group short", 4, 2, True)
    assert life.text() == "~2 min (group short, 4 lives)"


def test_status_shows_each_live_servers_life_left(history):
    report = _read(history, lambda s: queries.overview(s, now=NOW))
    (row,) = report["lives"]
    assert row["seconds"] == pytest.approx(LEFT) and row["age"] == pytest.approx(AGE)
    assert json.loads(json.dumps(row))["text"] == "~2 min (group short, 4 lives)"
    shown = format_overview(str(history), report)
    assert "s3 tcp://10.0.0.4:40004 (group short, h200), 40 s old: ~2 min (group short, " in shown


def test_without_lives_the_estimate_is_the_prior_and_says_so(tmp_path):
    path = tmp_path / "catalog.db"
    with CatalogBuilder(path) as b:
        b.server("alone", group="new")
    ((_, life),) = _read(path, lambda s: catalog_lives_left(s, now=EPOCH + 10))
    assert (life.source, life.known, life.short(), life.text()) == (
        "prior",
        False,
        "prior",
        "- (prior)",
    )
    assert life.seconds == pytest.approx(PRIOR_MEAN_LIFE)
    report = _read(path, lambda s: queries.overview(s, now=EPOCH + 10))
    assert "alone tcp://10.0.0.1:40001 (group new, h200), 10 s old: - (prior)" in (
        format_overview(str(path), report)
    )


def test_the_monitor_shows_life_left_in_the_fleet_and_on_the_servers_page(history):
    app = make_app(history, NOW)

    async def script(pilot: Any) -> None:
        (cells,) = rows(app, "fleet-servers").values()
        assert cells[0] == "s3" and cells[8] == "~2 min", cells
        table = app.query_one("#fleet-servers")
        table.focus()
        await pilot.press("enter")
        await pilot.pause()
        assert "expected life left ~2 min (group short, 4 lives)" in text(app, "server-title")

    drive(app, script)


def test_the_monitor_shows_the_prior_as_the_prior(tmp_path):
    path = tmp_path / "catalog.db"
    with CatalogBuilder(path) as b:
        b.server("alone")
    app = make_app(path, EPOCH + 10)

    async def script(pilot: Any) -> None:
        (cells,) = rows(app, "fleet-servers").values()
        assert cells[8] == "prior", cells

    drive(app, script)


@pytest.fixture
def two_runs(tmp_path: Path) -> Path:
    """Run r1: three servers of group 'short', lost at 60 and 120 s, the third closed
    at 180 s. Run r2 (from 190 s to 390 s): two more of 'short', one lost after 30 s,
    one alive at its end; and one of group 'long', alive at its end."""
    path = tmp_path / "catalog.db"
    with CatalogBuilder(path) as b:
        r1 = b.run("r1")
        first, second, third = (b.server(f"s{i}", group="short") for i in range(3))
        b.tick(60)
        b.lose_server(first)
        b.tick(60)
        b.lose_server(second)
        b.tick(60)
        b.leave(third)
        b.finish_run(r1)
        b.tick(10)
        r2 = b.run("r2")
        doomed = b.server("s3", group="short")
        b.server("s4", group="short")
        b.server("l0", group="long")
        b.tick(30)
        b.lose_server(doomed)
        b.tick(170)
        b.finish_run(r2)
    return path


def test_the_ledger_compares_predicted_and_actual_lives_per_group(two_runs):
    rows_ = _read(two_runs, lambda s: group_lives(s, *_span(s, "r2")))
    short, long_ = sorted(rows_, key=lambda row: row.group != "short")
    # Predicted, from r1's lives (60 and 120 died, 180 closed): KM 2/3 from 60, 1/3
    # from 120 to 180, then 2 deaths in 360 s: 60 + 40 + 20 + 180/3 = 180 s; median 120.
    history = kaplan_meier([Life(60, True), Life(120, True), Life(180, False)])
    assert history.mean() == pytest.approx(180.0) and median_life(history) == 120
    assert (short.group, short.source, short.history) == ("short", "group short", 3)
    assert short.predicted_mean == pytest.approx(180.0) and short.predicted_median == 120
    # Actual: 30 s (died), 200 s (alive at the end): KM 1/2 from 30; 1 death in 230 s.
    assert (short.servers, short.deaths, short.longest) == (2, 1, 200.0)
    assert short.actual_mean == pytest.approx(30 + 0.5 * 170 + 0.5 * 230)
    assert short.past_median == pytest.approx(0.5)
    # 'long' has no history of its own: the prediction is every server's.
    assert (long_.group, long_.source, long_.history) == ("long", "all servers", 3)
    assert (long_.servers, long_.deaths, long_.actual_mean, long_.past_median) == (
        1,
        0,
        None,
        1.0,
    )
    assert lives_text(rows_)[1:] == [
        "  long: predicted mean life 3 min, median 2 min (all servers, 3 lives); here 1 "
        "server(s), none died (watched up to 3 min), 100% outlived the predicted median",
        "  short: predicted mean life 3 min, median 2 min (group short, 3 lives); here 2 "
        "server(s), 1 died, mean life 4 min, 50% outlived the predicted median",
    ]


def test_the_first_runs_prediction_is_the_prior(two_runs):
    (short,) = _read(two_runs, lambda s: group_lives(s, *_span(s, "r1")))
    assert (short.source, short.history, short.servers, short.deaths) == ("prior", 0, 3, 2)
    assert short.predicted_mean == pytest.approx(PRIOR_MEAN_LIFE)
    assert short.predicted_median == pytest.approx(PRIOR_MEAN_LIFE * math.log(2))
    assert short.past_median is None  # nobody was watched for 2.8 h
    assert "(prior)" in short.text() and "none watched as long" in short.text()


def test_the_reports_json_and_page_hold_the_lives(two_runs):
    ledger, render = read_report(str(two_runs), run="r2")
    data = json.loads(export_json(ledger))
    assert [(row["group"], row["servers"], row["deaths"]) for row in data["lives"]] == [
        ("long", 1, 0),
        ("short", 2, 1),
    ]
    page = render()
    assert "Server lives: predicted and actual" in page and "group short, 3" in page


def _span(session: Any, run: str) -> tuple[float, float]:
    window = window_of(session, run=run)
    return window.start, window.end
