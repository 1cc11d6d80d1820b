"""The terminal monitor: every view, bad input, 80x24, snapshots, and a live writer.

Catalogs are built only through the catalog's own builder (tests/monitor/monitor_catalogs.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from snakemake_context_monitor import VIEWS, CatalogSource, MonitorApp
from snakemake_context_monitor.statusbar import StatusBar
from snakemake_context_monitor.views.help import HelpScreen
from snakemake_context_monitor.views.server import ServerScreen
from textual.widgets import DataTable, Sparkline, Static, TabbedContent

from snakemake_executor_context.catalog.store import open_store
from tests.catalog_builder import EPOCH, CatalogBuilder
from tests.monitor.monitor_catalogs import DEMO_NOW, demo_catalog, demo_history

TAB_KEYS = {view.key: view.tab for view in VIEWS}


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    return demo_catalog(tmp_path / "catalog.db")


def make_app(spec: Path | str, now: float = DEMO_NOW) -> MonitorApp:
    """The app on a fixed clock, reading once per action instead of on a timer."""
    clock = lambda: now  # noqa: E731
    return MonitorApp(CatalogSource(spec, clock=clock), live=False, clock=clock)


def drive(
    app: MonitorApp, script: Callable[[Any], Awaitable[None]], size: tuple[int, int] = (120, 36)
) -> None:
    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            await script(pilot)

    asyncio.run(main())


def rows(app: MonitorApp, table_id: str) -> dict[str, list[Any]]:
    """A table's cells as the text they show (cells are Rich Text: no markup read)."""
    table = app.screen.query_one(f"#{table_id}", DataTable)
    return {key.value: [str(cell) for cell in table.get_row(key)] for key in table.rows}


def drawn(app: MonitorApp, table_id: str, key: str) -> list[str]:
    """A row's cells as its table draws them now, one word each (from what the table
    has rendered, its caches, as when it paints the screen)."""
    table = app.screen.query_one(f"#{table_id}", DataTable)
    y = table.get_row_index(key) + table.header_height - table.scroll_offset.y
    return table.render_line(y).text.split()


def text(app: MonitorApp, widget_id: str) -> str:
    return str(app.screen.query_one(f"#{widget_id}", Static).render())


# ----------------------------------------------------------------------------------
# Each view on a built catalog.


def test_the_fleet_shows_each_servers_busy_time_and_an_idle_one_at_a_glance(tmp_path):
    """When an idle server's last job ended ('never' for one that ran nothing, '-' for
    a busy one), and busy and idle seconds on a server's page."""
    with CatalogBuilder(tmp_path / "c.db", start=EPOCH) as b:
        worker = b.server("worker", gpu="NVIDIA H200")
        b.server("idler", gpu="NVIDIA H200")
        model = b.context("smollm2")
        run = b.run(jobs_total=3)
        b.load(worker, model, seconds=1.0)
        for _ in range(3):
            b.job(run, "score", server=worker, context=model, seconds=2.0)
        last = b.now
        b.tick(60.0)
        now = b.now
    app = make_app(tmp_path / "c.db", now=now)

    async def script(pilot):
        servers = {cells[0]: cells for cells in rows(app, "fleet-servers").values()}
        assert servers["worker"][-1] == time.strftime("%H:%M:%S", time.localtime(last))
        assert servers["idler"][-1] == "never"
        table = app.query_one("#fleet-servers", DataTable)
        table.focus()
        table.move_cursor(row=list(servers).index("worker"))
        await pilot.press("enter")
        await pilot.pause()
        title = text(app, "server-title")
        idle = now - EPOCH - 6.0
        assert "busy 6.0 s, idle " in title and f"{int(idle // 60)} min" in title, title

    drive(app, script)


def test_fleet_groups_servers_by_gpu_model_and_opens_a_server_page(catalog):
    app = make_app(catalog)

    async def script(pilot):
        models = rows(app, "fleet-models")
        assert set(models) == {"h200", "cpu"}  # the A100 was lost
        assert models["h200"][:4] == ["h200", "3", "1", "2"]  # servers, busy, free
        assert models["h200"][4] == "141 GB"
        servers = rows(app, "fleet-servers")
        assert len(servers) == 4
        gpu0 = next(cells for cells in servers.values() if cells[0] == "gpu0")
        assert gpu0[1] == "node1" and gpu0[3:6] == ["1/1", "smollm2", "12"]
        assert gpu0[-1] == "-"  # busy: not idle
        assert "4 servers of 2 GPU model(s), 1 of 4 slots busy" in text(app, "fleet-summary")

        table = app.query_one("#fleet-servers", DataTable)
        table.focus()
        table.move_cursor(row=[c[0] for c in servers.values()].index("gpu0"))
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, ServerScreen)
        assert "gpu0 on node1" in text(app, "server-title")
        assert "NVIDIA H200" in text(app, "server-title")
        assert [c[0] for c in rows(app, "server-contexts").values()] == ["smollm2"]
        assert len(rows(app, "server-jobs")) >= 1
        # Enter on a job tells its story (read off the UI thread).
        jobs = app.screen.query_one("#server-jobs", DataTable)
        jobs.focus()
        jobs.move_cursor(row=0)
        await pilot.press("enter")
        for _ in range(50):
            await pilot.pause(0.05)
            if "placed" in text(app, "server-story"):
                break
        story = text(app, "server-story")
        assert "of run" in story and "placed" in story and "started" in story, story
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, ServerScreen)

    drive(app, script)


def test_after_a_run_the_fleet_shows_its_servers_as_ended(tmp_path):
    """When no run and no server is live, the fleet view shows the last run's servers,
    ended (when each left, the jobs it ran), labelled as the other views label the last
    run; not a server of an earlier run. Once a run is live again, it shows what is live."""
    from snakemake_context_monitor.model import Memo
    from snakemake_context_monitor.views import fleet

    path = tmp_path / "c.db"
    now = [EPOCH]
    source = CatalogSource(path, clock=lambda: now[0])

    def fleet_rows() -> dict[str, tuple[str, ...]]:
        snapshot = source.fetch()
        fresh = CatalogSource(path, clock=lambda: now[0]).fetch()
        assert snapshot.ended == fresh.ended  # read incrementally or from scratch
        return dict(fleet.page(snapshot, Memo()).tables["fleet-servers"])

    with CatalogBuilder(path, start=EPOCH) as b:
        earlier = b.run("earlier")
        old = b.server("old", gpu="NVIDIA A100-SXM4-80GB")
        b.job(earlier, "score", server=old, seconds=2.0)
        b.leave(old)
        b.finish_run(earlier)
        b.tick(60.0)
        run = b.run("last", jobs_total=5)
        gpu0, gpu1 = b.server("gpu0"), b.server("gpu1")
        model = b.context("smollm2")
        b.load(gpu0, model, seconds=1.0)
        b.load(gpu1, model, seconds=1.0)
        for _ in range(3):
            b.job(run, "score", server=gpu0, context=model, seconds=2.0, items=4)
        b.job(run, "score", server=gpu1, context=model, seconds=2.0, items=4)
        b.job(run, "score", server=gpu1, context=model, seconds=1.0, ok=False)
        b.commit()
        now[0] = b.now
        live = fleet_rows()  # the run is live: its servers, live
        assert set(live) == {gpu0, gpu1} and live[gpu0][3] == "0/1"
        b.tick(5.0)
        b.leave(gpu0)
        left = {gpu0: b.now, gpu1: b.tick(1.0)}
        b.leave(gpu1)
        b.finish_run(run)
        b.commit()
        now[0] = b.tick(30.0)
        assert set(fleet_rows()) == {gpu0, gpu1}
        app = make_app(path, now=now[0])

        async def script(pilot):
            servers = rows(app, "fleet-servers")
            at = {a: time.strftime("%H:%M:%S", time.localtime(t)) for a, t in left.items()}
            assert servers == {
                gpu0: ["gpu0", "node1", "h200", "-", "smollm2", "3", "0", "12", "left", at[gpu0]],
                gpu1: ["gpu1", "node1", "h200", "-", "smollm2", "1", "1", "4", "left", at[gpu1]],
            }
            models = rows(app, "fleet-models")
            assert list(models) == ["h200"]  # not the earlier run's A100
            assert models["h200"][:7] == ["h200", "2", "-", "-", "141 GB", "1", "4"]
            summary = text(app, "fleet-summary")
            assert "2 servers of 1 GPU model(s) in the last run (no run is live)" in summary
            assert "all ended; throughput over that run." in summary

        drive(app, script)
        b.run("next")  # live, before its servers join: nothing to show yet
        b.commit()
        now[0] = b.now
        assert fleet_rows() == {}
        gpu2 = b.server("gpu2")
        b.commit()
        assert list(fleet_rows()) == [gpu2]
    source.close()


def test_contexts_view_shows_where_each_context_is_warm(catalog):
    app = make_app(catalog)

    async def script(pilot):
        await pilot.press("c")
        await pilot.pause()
        assert app.query_one("#views", TabbedContent).active == "contexts"
        table = rows(app, "contexts-table")
        by_pair = {(c[0], c[1]): c for c in table.values()}
        assert by_pair[("smollm2", "gpu0")][2:5] == ["ready", "12.0", "miss"]
        assert by_pair[("smollm2", "gpu1")][2:5] == ["ready", "3.0", "hit"]
        assert by_pair[("embedder", "cpu0")][2] == "evicted"
        assert by_pair[("embedder", "cpu0")][6] == "1"  # evictions
        assert ("smollm2", "gpu2") not in by_pair  # lost with its server
        summary = text(app, "contexts-summary")
        assert "2 context(s)" in summary and "1 eviction(s)" in summary

    drive(app, script)


def test_losses_view_has_a_timeline_and_running_totals(catalog):
    app = make_app(catalog)

    async def script(pilot):
        await pilot.press("l")
        await pilot.pause()
        summary = text(app, "losses-summary")
        assert "Lost 1 server(s): 1 job(s) sent back, 40 s of work lost" in summary
        assert "5 joined, 1 left" in summary
        events = list(rows(app, "losses-table").values())
        kinds = [cells[1] for cells in events]
        assert kinds[0] == "joined" and "lost" in kinds and kinds.count("joined") == 5
        lost = next(cells for cells in events if cells[1] == "lost")
        assert lost[2] == "gpu2" and lost[4] == "1" and lost[5] == "40 s"
        assert lost[6].startswith("lost (preempted): verify")

    drive(app, script)


def test_throughput_view_per_gpu_model_with_a_selectable_window(catalog):
    app = make_app(catalog)

    async def script(pilot):
        await pilot.press("t")
        await pilot.pause()
        labels = [str(w.render()) for w in app.query(".series-label")]
        assert [label.split(":")[0] for label in labels] == [
            "all GPU models",
            "a100-sxm4-80gb",
            "cpu",
            "h200",
        ]
        spark = app.query_one("#spark-all", Sparkline)
        assert len(spark.data) == 40 and max(spark.data) > 0
        assert "last 15 min" in text(app, "throughput-summary")
        before = labels[0]
        await pilot.press("w")
        await pilot.pause()
        assert app.window == "1 h" and "last 1 h" in text(app, "throughput-summary")
        # Over a longer window the same jobs make a lower rate.
        assert str(app.query(".series-label").first().render()) != before
        table = rows(app, "throughput-table")
        assert {(c[0], c[1]) for c in table.values()} >= {("smollm2", "h200"), ("embedder", "cpu")}

    drive(app, script)


def test_progress_view_shows_done_total_failures_and_eta(catalog):
    app = make_app(catalog)

    async def script(pilot):
        await pilot.press("p")
        await pilot.pause()
        summary = text(app, "progress-summary")
        assert "Run factcheck-2: running" in summary
        assert "20 of 40 jobs ended (50%): 19 ok, 1 failed" in summary
        assert "ETA" in summary and "ETA done" not in summary
        runs = rows(app, "progress-runs")
        assert runs["factcheck-1"][1] == "finished" and runs["factcheck-2"][1] == "running"

    drive(app, script)


def test_progress_counts_failed_jobs_among_those_ended(tmp_path):
    """A run of 9 jobs, 8 of them failed: all 9 ended (100%), 1 ok; not '1 of 9 jobs
    done (100%)'. The bar stands at the 9 ended."""
    from snakemake_context_monitor.model import Memo
    from snakemake_context_monitor.views import progress

    path = tmp_path / "c.db"
    with CatalogBuilder(path, start=EPOCH) as b:
        server = b.server("cpu0", gpu=None)
        run = b.run("failing", jobs_total=9)
        b.job(run, "one", server=server, seconds=1.0)
        for _ in range(8):
            b.job(run, "one", server=server, seconds=1.0, ok=False)
        b.finish_run(run, ok=False)
    model = progress.page(CatalogSource(path, clock=lambda: b.now).fetch(), Memo())
    assert "9 of 9 jobs ended (100%): 1 ok, 8 failed" in model.texts["progress-summary"]
    assert model.extra == (9, 9)


def test_a_run_whose_heartbeat_stopped_is_stale_but_a_quiet_one_is_not(catalog):
    quiet = make_app(catalog, now=DEMO_NOW + 40)  # no job ended for 2 min, heartbeat 57 s ago
    stale = make_app(catalog, now=DEMO_NOW + 120)  # no heartbeat for two minutes

    async def check_quiet(pilot):
        assert "run STALE" not in str(app_status(quiet))
        await pilot.press("p")
        assert "Run factcheck-2: running" in text(quiet, "progress-summary")

    async def check_stale(pilot):
        assert "run STALE" in str(app_status(stale))
        await pilot.press("p")
        assert "Run factcheck-2: STALE" in text(stale, "progress-summary")

    drive(quiet, check_quiet)
    drive(stale, check_stale)


def app_status(app: MonitorApp) -> str:
    return str(app.query_one(StatusBar).render())


def test_data_age_is_always_shown(catalog):
    now = [DEMO_NOW]
    app = MonitorApp(CatalogSource(catalog, clock=lambda: now[0]), live=False, clock=lambda: now[0])

    async def script(pilot):
        assert "(now)" in app_status(app)
        now[0] += 7
        app._tick()
        assert "(7.0 s ago)" in app_status(app) or "(7 s ago)" in app_status(app)

    drive(app, script)


def test_command_palette_and_help_reach_every_view(catalog):
    app = make_app(catalog)

    async def script(pilot):
        titles = [command.title for command in app.get_system_commands(app.screen)]
        for title in (view.title for view in VIEWS):
            assert f"Show {title}" in titles
        show_losses = next(
            c for c in app.get_system_commands(app.screen) if c.title == "Show Losses"
        )
        show_losses.callback()
        await pilot.pause()
        assert app.query_one("#views", TabbedContent).active == "losses"
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)

    drive(app, script)


def test_monitor_never_writes_and_opens_a_finished_catalog_immutable(catalog):
    digest = hashlib.sha256(catalog.read_bytes()).hexdigest()
    app = make_app(catalog)

    async def script(pilot):
        for key in "fcltgp":
            await pilot.press(key)
            await pilot.press("r")
            await pilot.pause()

    drive(app, script)
    assert app.source.immutable  # no writer, no -wal file: a finished catalog
    assert hashlib.sha256(catalog.read_bytes()).hexdigest() == digest
    assert not catalog.with_name(catalog.name + "-wal").exists()


def test_read_only_catalog_opens_immutable(catalog):
    catalog.chmod(0o444)
    catalog.parent.chmod(0o555)
    try:
        source = CatalogSource(catalog, clock=lambda: DEMO_NOW)
        snapshot = source.fetch()
        assert source.immutable and snapshot.counts.servers == 5
    finally:
        catalog.parent.chmod(0o755)
        catalog.chmod(0o644)


# ----------------------------------------------------------------------------------
# Bad input: a clear message on screen, no traceback.


def _problem(app: MonitorApp) -> str:
    box = app.query_one("#problem", Static)
    assert box.display and not app.query_one("#views").display
    return str(box.render())


def test_missing_catalog(tmp_path):
    app = make_app(tmp_path / "nowhere.db")

    async def script(pilot):
        message = _problem(app)
        assert f"No catalog at {tmp_path / 'nowhere.db'}" in message
        assert "snakemake-context monitor --catalog" in message
        assert "catalog unreadable" in app_status(app)

    drive(app, script)


def test_catalog_of_another_schema_version(tmp_path):
    path = tmp_path / "old.db"
    with CatalogBuilder(path) as b:
        b.server("gpu0")
        b.mark_schema_version(99)
    app = make_app(path)

    async def script(pilot):
        message = _problem(app)
        assert "another schema version" in message and "99" in message

    drive(app, script)


def test_empty_catalog(tmp_path):
    path = tmp_path / "empty.db"
    open_store(path).close()  # a new catalog, through the catalog's own API
    app = make_app(path)

    async def script(pilot):
        assert "is empty: no run has written to it yet" in _problem(app)

    drive(app, script)


def test_a_catalog_missing_a_table(tmp_path):
    path = tmp_path / "c.db"
    with CatalogBuilder(path) as b:
        b.server("gpu0")
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE jobs")
    app = make_app(path)

    async def script(pilot):
        message = _problem(app)
        assert "lacks the table jobs" in message and "Fix:" in message, message

    drive(app, script)


def test_markup_and_escape_sequences_in_the_catalog_are_shown_as_they_are(tmp_path):
    """Textual reads a plain string's [b] as markup (and a stray [/x] raised), and
    passes ESC on to the terminal: the monitor shows such values as text, escaped."""
    with CatalogBuilder(tmp_path / "c.db", start=EPOCH) as b:
        server = b.server("[b]x[/b]", host="h\x1b[2J")
        model = b.context("c[/x]")
        run = b.run(jobs_total=1)
        b.load(server, model, seconds=1.0)
        b.job(run, "score", server=server, context=model, wildcards={"i": "\x1b[31mred[bold]"})
        now = b.tick(5.0)
    app = make_app(tmp_path / "c.db", now=now)

    async def script(pilot):
        servers = rows(app, "fleet-servers")
        (key,) = servers
        assert servers[key][0] == "[b]x[/b]" and servers[key][4] == "c[/x]", servers
        assert drawn(app, "fleet-servers", key)[0] == "[b]x[/b]"
        table = app.query_one("#fleet-servers", DataTable)
        table.focus()
        await pilot.press("enter")
        await pilot.pause()
        title = text(app, "server-title")
        assert "[b]x[/b] on h\\x1b[2J" in title and "\x1b" not in title, repr(title)
        jobs = app.screen.query_one("#server-jobs", DataTable)
        jobs.focus()
        jobs.move_cursor(row=0)
        await pilot.press("enter")
        for _ in range(50):
            await pilot.pause(0.05)
            if "placed" in text(app, "server-story"):
                break
        story = text(app, "server-story")
        assert "i=\\x1b[31mred[bold]" in story and "\x1b" not in story, repr(story)

    drive(app, script)


# ----------------------------------------------------------------------------------
# 80x24: every view reachable by keyboard, no column header cut below 3 characters.


def _check_headers(app: MonitorApp) -> None:
    for table in app.screen.query(DataTable):
        if not table.display or table.region.width == 0:
            continue
        x = 0
        visible = table.region.width - (2 if table.show_vertical_scrollbar else 0)
        for column in table.columns.values():
            label = column.label.plain
            shown = max(0, min(visible - x - table.cell_padding, len(label)))
            assert shown >= min(3, len(label)), (table.id, label, shown)
            x += column.get_render_width(table)


@pytest.mark.parametrize(
    "keys",
    [["f"], ["c"], ["l"], ["t"], ["p"], ["f", "tab", "enter"], ["question_mark"]],
    ids=lambda k: "+".join(k),
)
def test_every_view_at_80x24(catalog, keys):
    app = make_app(catalog)

    async def script(pilot):
        for key in keys:
            await pilot.press(key)
            await pilot.pause()
        if keys[0] in TAB_KEYS:
            assert app.query_one("#views", TabbedContent).active == TAB_KEYS[keys[0]]
        if keys[-1] == "enter":
            assert isinstance(app.screen, ServerScreen)
        _check_headers(app)

    drive(app, script, size=(80, 24))


# ----------------------------------------------------------------------------------
# Snapshots of every view at 80x24 and 120x36 on a fixed clock.

#: The exact versions the snapshots were drawn with (the monitor itself takes any
#: Textual that pyproject.toml allows; its pixels differ between releases).
CONSTRAINTS = Path(__file__).resolve().parents[2] / ".ci" / "constraints.txt"
#: Set by .ci/run: a snapshot skipped for another version fails instead.
REQUIRE_SNAPSHOTS = "SNAKEMAKE_CONTEXT_REQUIRE_SNAPSHOTS"


def snapshot_versions_differ() -> str | None:
    """Why this environment cannot compare the snapshots (None: it can)."""
    from importlib.metadata import PackageNotFoundError, version

    if not CONSTRAINTS.exists():
        return f"{CONSTRAINTS} is missing: the versions the snapshots were drawn with"
    pins = dict(
        line.split("==", 1)
        for line in CONSTRAINTS.read_text().split()
        if "==" in line and not line.startswith("#")
    )
    wrong = []
    for name in ("textual", "rich", "pytest-textual-snapshot"):
        try:
            installed = version(name)
        except PackageNotFoundError:
            installed = "none"
        if installed != pins.get(name):
            wrong.append(f"{name} {installed} (drawn with {pins.get(name)})")
    if not wrong:
        return None
    return (
        f"the snapshots are pixel-exact for the versions in {CONSTRAINTS.name}; here "
        f"{', '.join(wrong)}. Fix: pip install -c .ci/constraints.txt -e '.[test]'"
    )


@pytest.mark.parametrize("size", [(80, 24), (120, 36)], ids=["80x24", "120x36"])
@pytest.mark.parametrize(
    "keys",
    [["f"], ["c"], ["l"], ["t"], ["g"], ["p"], ["f", "tab", "enter"], ["question_mark"]],
    ids=["fleet", "contexts", "losses", "throughput", "ledger", "progress", "server", "help"],
)
def test_snapshot(request, tmp_path, monkeypatch, size, keys):
    if (reason := snapshot_versions_differ()) is not None:
        if os.environ.get(REQUIRE_SNAPSHOTS) == "1":
            pytest.fail(f"{REQUIRE_SNAPSHOTS}=1, but {reason}")
        pytest.skip(reason)
    snap_compare = request.getfixturevalue("snap_compare")  # needs the pinned versions
    monkeypatch.chdir(tmp_path)
    demo_catalog(tmp_path / "catalog.db")
    assert snap_compare(make_app("catalog.db"), press=keys, terminal_size=size)


# ----------------------------------------------------------------------------------
# Live: a writer process at 50+ events/s while the app polls every 250 ms.

WRITER = textwrap.dedent("""
    import sys, time
    from tests.catalog_builder import CatalogBuilder

    path, seconds = sys.argv[1], float(sys.argv[2])
    with CatalogBuilder(path, start=time.time()) as b:
        servers = [b.server(f"gpu{i}") for i in range(4)]
        model = b.context("smollm2")
        run = b.run("live", jobs_total=100_000)
        b.commit()
        events = jobs = 0
        end = time.time() + seconds
        while time.time() < end:
            b.now = time.time()
            b.job(run, "verify", server=servers[jobs % 4], context=model, seconds=0.0,
                  items=8)
            jobs += 1
            events += 4  # dispatched, started, finished, reported
            b.commit()
            time.sleep(0.02)
    print(jobs, events)
""")


@pytest.mark.slow
def test_live_writer_and_polling_app_converge(tmp_path):
    path = tmp_path / "live.db"
    open_store(path).close()
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), "10"], stdout=subprocess.PIPE, text=True
    )
    app = MonitorApp(CatalogSource(path), interval=0.25)
    problems: list[str] = []
    seen_polls: list[int] = []

    async def script(pilot):
        while writer.poll() is None:
            await asyncio.sleep(0.05)
            if app.problem and "is empty" not in app.problem:
                problems.append(app.problem)
        polls_at_stop = app.polls
        jobs, events = (int(x) for x in writer.stdout.read().split())
        assert events / 10 >= 50, events
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            summary = str(app.query_one("#progress-summary", Static).render())
            if f"{jobs} of 100000 jobs ended" in summary:
                seen_polls.append(app.polls - polls_at_stop)
                break
        assert seen_polls, summary
        assert rows(app, "fleet-models")["h200"][6] == str(jobs)

    drive(app, script)
    assert not problems, problems
    # Converged within two polls after the writer stopped (three reads may start
    # in that time: the poll under way when it stopped, and two more).
    assert seen_polls[0] <= 3, seen_polls


def test_cli_monitor_subcommand_is_wired():
    out = subprocess.run(
        [str(Path(sys.executable).parent / "snakemake-context"), "monitor", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "--catalog" in out.stdout
    assert EPOCH < DEMO_NOW


def _catalogs_own_view(path: Path, now: float) -> dict[str, Any]:
    """What the catalog's own queries (``snakemake-context status``) say, and the
    throughput series worked out here from the latest attempts."""
    from snakemake_executor_context.catalog.reading import status as queries
    from snakemake_executor_context.catalog.store import open_reader

    reader = open_reader(path)
    with reader.session() as session:
        view = {
            "fleet": queries.fleet(session),
            "contexts": queries.contexts(session),
            "throughput": queries.throughput(session),
            "runs": queries.runs(session, 10, now),
            "recent_jobs": queries.recent_jobs(session, 30),
            "counts": queries.counts(session),
            "jobs": queries.recent_jobs(session, 10_000),
        }
    reader.close()
    since, width = now - 900.0, 900.0 / 40
    series = [0] * 40
    for job in view.pop("jobs"):
        if job.outcome == "ok" and job.finished is not None and since <= job.finished <= now:
            series[min(39, int((job.finished - since) // width))] += 1
    view["series"] = series
    return view


def test_incremental_reads_equal_a_fresh_read_and_the_catalogs_own_queries(tmp_path):
    """The monitor reads only what changed since its last poll; it must agree with a
    read from scratch and with the catalog's own queries, also after servers join,
    leave and are lost, contexts load and are evicted, and jobs start and finish
    between two polls."""
    path = tmp_path / "catalog.db"
    now = [DEMO_NOW]
    source = CatalogSource(path, clock=lambda: now[0])

    def agree() -> None:
        snapshot = source.fetch()
        fresh = CatalogSource(path, clock=lambda: now[0]).fetch()
        for name in (
            "servers",
            "placements",
            "timeline",
            "loss_totals",
            "progress",
            "fleet",
            "ended",
        ):
            assert getattr(snapshot, name) == getattr(fresh, name), name
        assert snapshot.series == fresh.series and snapshot.counts == fresh.counts
        own = _catalogs_own_view(path, now[0])
        assert snapshot.series[0].jobs == own.pop("series")
        for name, expected in own.items():
            assert getattr(snapshot, name) == expected, name

    with CatalogBuilder(path) as b:  # a writer at work between the polls
        demo_history(b)
        b.commit()
        agree()
        assert source.fetch().changed == 0  # nothing changed: nothing read
        l40s = b.server("gpu9", gpu="NVIDIA L40S")
        spare = b.server("gpu10", gpu="NVIDIA L40S")
        model = b.context("smollm2", loader="../llm/smollm2.py:load_model")
        b.load(l40s, model, seconds=1.0)
        b.job("factcheck-2", "verify", server=l40s, context=model, seconds=2.0, items=32)
        b.job("factcheck-2", "verify", server=l40s, context=model, seconds=2.0, ok=False)
        b.start_job("factcheck-2", "verify", server=l40s, context=model)
        b.start_job("factcheck-2", "verify", server=spare, context=model)
        b.commit()
        now[0] = b.now + 5
        agree()
        running = b.start_job("factcheck-2", "verify", server=l40s, context=model)
        b.commit()
        agree()  # only attempts changed: only their servers' and placements' rows
        b.finish_job(running, seconds=1.0, items=8)
        b.job("factcheck-2", "embed", server=l40s, context=model, seconds=1.0, items=4)
        b.commit()
        now[0] = b.now + 5
        agree()
        b.evict(l40s, model)
        b.lose_server(spare, reason="lost (preempted)")
        b.tick(5)
        b.leave(b.server("gpu11", gpu=None))
        b.commit()
        now[0] = b.now + 5
        agree()
    source.close()


def test_a_server_described_after_it_ran_jobs_is_read_again(tmp_path):
    """A server's description is the one change the recorder notes no event for: the
    monitor reads a server again until it is described, and sorts the jobs it ran by
    its GPU model again then."""
    from snakemake_executor_context.fleet import events as ev

    path = tmp_path / "catalog.db"
    with CatalogBuilder(path, start=DEMO_NOW - 100) as b:
        b.server("gpu0")
        address = "tcp://10.0.0.99:40099"
        b.emit(ev.ServerJoined(at=b.now, address=address, name="late", host="node9", slots=1))
        run = b.run("r")
        at = b.tick()
        b.emit(ev.JobFinished(at=at, run_id=run, key="k1", address=address, ok=True, items=8))
        b.emit(ev.JobReported(at=at, run_id=run, key="k1", jobid="1", rule="verify"))
        b.commit()
        source = CatalogSource(path, clock=lambda: DEMO_NOW)
        assert {r.gpu_model for r in source.fetch().fleet} == {"h200", "cpu"}
        gpu = {"name": "NVIDIA A100-SXM4-80GB", "memory_bytes": 80_000_000_000}
        b.emit(ev.ServerDescribed(at=b.now, address=address, name="late", pid=7, gpu=gpu))
        b.commit()
        snapshot = source.fetch()
        fresh = CatalogSource(path, clock=lambda: DEMO_NOW).fetch()
    assert {r.gpu_model for r in snapshot.fleet} == {"h200", "a100-sxm4-80gb"}
    assert snapshot.servers == fresh.servers and snapshot.fleet == fresh.fleet
    assert [s.gpu_model for s in snapshot.series] == ["all", "a100-sxm4-80gb"]
    assert snapshot.series == fresh.series


def test_an_unchanged_poll_changes_nothing_and_a_finished_job_only_its_rows(tmp_path):
    """On a real app: a poll in which nothing changed makes no table update on the UI
    thread; one job finishing updates only the rows it changes, in the view shown (a
    hidden view catches up when it is shown)."""
    from snakemake_context_monitor.tables import Table
    from textual.widgets import DataTable

    path = tmp_path / "catalog.db"
    b = CatalogBuilder(path)  # left open: a writer at work
    servers = [b.server(f"gpu{i}") for i in range(3)]
    model = b.context("smollm2")
    run = b.run("live", jobs_total=10)
    for server in servers:
        b.load(server, model, seconds=1.0)
        b.job(run, "verify", server=server, context=model, seconds=1.0, items=8)
    b.commit()
    app = make_app(path, now=b.now + 60)
    calls: list[tuple[str | None, str, str]] = []
    originals = {name: getattr(DataTable, name) for name in ("add_row", "remove_row")}

    def spy(name: str) -> Callable[..., Any]:
        def record(table: DataTable[Any], *args: Any, **kwargs: Any) -> Any:
            key = kwargs.get("key") or args[0]
            calls.append((table.id, name, str(getattr(key, "value", key))))
            return originals[name](table, *args, **kwargs)

        return record

    update_cell, update_cells = DataTable.update_cell, Table.update_cells

    def record_cell(table: DataTable[Any], row: Any, column: Any, value: Any, **kw: Any) -> None:
        calls.append((table.id, "update_cell", str(getattr(row, "value", row))))
        update_cell(table, row, column, value, **kw)

    def record_cells(table: Table, changes: list[tuple[str, Any, str]]) -> None:
        calls.extend((table.id, "update_cell", row) for row, _, _ in changes)
        update_cells(table, changes)

    async def script(pilot):
        await pilot.press("c")  # the contexts view filled once, then hidden
        await pilot.pause()
        pair = next(key for key in rows(app, "contexts-table") if key.endswith(servers[1]))
        assert drawn(app, "contexts-table", pair)[8] == "1"  # warm jobs
        await pilot.press("f")
        await pilot.pause()
        assert drawn(app, "fleet-servers", servers[1])[5] == "1"  # jobs
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(DataTable, "update_cell", record_cell)
            patch.setattr(Table, "update_cells", record_cells)
            for name in originals:
                patch.setattr(DataTable, name, spy(name))
            app.read_now()  # nothing changed since the first read
            assert app.applied[-1].changed == 0 and calls == []

            b.job(run, "verify", server=servers[1], context=model, seconds=1.0, items=8)
            b.commit()
            app.read_now()
            assert app.applied[-1].finished == 1
            touched = {(table, key) for table, _, key in calls}
            assert ("fleet-servers", servers[1]) in touched
            assert touched <= {("fleet-servers", servers[1]), ("fleet-models", "h200")}
            jobs = rows(app, "fleet-servers")[servers[1]][5]
            assert jobs == "2" and rows(app, "fleet-servers")[servers[0]][5] == "1"
            await pilot.pause()  # drawn again, not from what was rendered before
            assert drawn(app, "fleet-servers", servers[1])[5] == "2"
            assert drawn(app, "fleet-servers", servers[0])[5] == "1"

            calls.clear()
            await pilot.press("c")  # the contexts view catches up on what it missed
            await pilot.pause()
            assert {(table, key) for table, _, key in calls} == {("contexts-table", pair)}
            assert rows(app, "contexts-table")[pair][8] == "2"  # warm jobs
            await pilot.pause()
            assert drawn(app, "contexts-table", pair)[8] == "2"

            calls.clear()
            app.read_now()
            assert calls == []

    try:
        drive(app, script)
    finally:
        b.close()


def test_the_builders_bulk_jobs_record_the_rows_one_job_at_a_time_would(tmp_path):
    """The benchmark's catalogs are built in bulk: the rows must be those the recorder
    writes for the same jobs, table by table, ids included."""
    from sqlalchemy import select

    from snakemake_executor_context.catalog import models
    from snakemake_executor_context.catalog.store import open_reader

    def build(path: Path, bulk: bool) -> dict[str, list[tuple[Any, ...]]]:
        with CatalogBuilder(path) as b:
            servers = [b.server(f"gpu{i}", gpu="NVIDIA A100-SXM4-80GB") for i in range(3)]
            warm, fresh = b.context("warm"), b.context("first-used-by-a-job")
            run = b.run("r", jobs_total=20)
            b.load(servers[0], warm)
            places = [(servers[i % 3], (warm, fresh, None)[i % 3]) for i in range(12)]
            if bulk:
                keys = b.jobs(run, "score", places, gap=0.5, seconds=2.0, items=8)
            else:
                keys = []
                for server, context in places:
                    b.tick(0.5)
                    keys.append(
                        b.job(run, "score", server=server, context=context, seconds=2.0, items=8)
                    )
            b.job(run, "after", server=servers[1], context=fresh, seconds=1.0, ok=False)
        reader = open_reader(path)
        tables: dict[str, list[tuple[Any, ...]]] = {"keys": [tuple(keys)]}
        with reader.session() as session:
            for model in (models.Run, models.Context, models.Job, models.Attempt):
                columns = list(model.__table__.columns)
                tables[model.__tablename__] = [
                    tuple(row) for row in session.execute(select(*columns).order_by(model.id))
                ]
            tables["events"] = [
                tuple(row) for row in session.execute(select(models.EventRecord.__table__))
            ]
        reader.close()
        return tables

    one_by_one = build(tmp_path / "one.db", bulk=False)
    bulk = build(tmp_path / "bulk.db", bulk=True)
    assert len(one_by_one["attempts"]) == 13 and one_by_one["runs"][0][-4:-1] == (12, 1, 96)
    for table, rows_one_by_one in one_by_one.items():
        assert bulk[table] == rows_one_by_one, table


def test_the_monitor_and_status_derive_the_same_context_rows(catalog: Path):
    """The monitor folds catalog rows into memory poll by poll (its latency), `status`
    asks SQL: both build each ContextRow, and must agree on where each context is warm
    or loading and on its loads (the demo fleet lost a server and evicted a context)."""
    from snakemake_executor_context.catalog.reading import status as queries
    from snakemake_executor_context.catalog.store import open_store

    source = CatalogSource(catalog, clock=lambda: DEMO_NOW)
    monitor_rows = source.fetch().contexts
    source.close()
    with open_store(catalog).session() as session:
        status_rows = queries.contexts(session)
    assert monitor_rows == status_rows
    assert any(row.warm_on for row in status_rows)
    assert any(row.loads for row in status_rows)


def test_the_fleet_view_at_130_columns_tells_every_pilot_apart(tmp_path: Path):
    """The RQ4 pool's six pilots at 130 columns: every name in the Fleet view is
    distinct (they were all `pilot-fak…`, the idle pilot-fakeb-5 like the others)."""
    path = tmp_path / "catalog.db"
    names = [f"pilot-fake{kind}-{i}" for i, kind in enumerate("aaabbb")]
    with CatalogBuilder(path) as b:
        b.run("rq4")
        for name in names:
            b.server(name, gpu=None)
        now = b.now + 1
    app = make_app(path, now)

    async def script(pilot: Any) -> None:
        shown = [cells[0] for cells in rows(app, "fleet-servers").values()]
        assert len(shown) == len(names) and len(set(shown)) == len(names), shown
        assert any(name.endswith("b-5") for name in shown), shown

    drive(app, script, size=(130, 40))
