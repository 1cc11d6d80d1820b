"""The Textual app: six views over a catalog, polled off the UI thread."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.reactive import var
from textual.screen import Screen
from textual.widgets import Footer, Static, TabbedContent, TabPane

from .data import WINDOWS, CatalogProblem, CatalogSource, Snapshot
from .model import Memo, Page, Presenter, ViewModel, ViewUpdate
from .statusbar import StatusBar
from .tables import text
from .views import contexts, fleet, ledger, losses, progress, server, throughput
from .views.base import PolledView
from .views.contexts import ContextsView
from .views.fleet import FleetView
from .views.help import HelpScreen
from .views.ledger import LedgerView
from .views.losses import LossesView
from .views.progress import ProgressView
from .views.server import ServerScreen
from .views.throughput import ThroughputView

__all__ = ["VIEWS", "Applied", "MonitorApp", "Poll", "View"]


class View(NamedTuple):
    """A view of the app: its tab, title, key, what it shows, its widget and its model
    function (run off the UI thread)."""

    tab: str
    title: str
    key: str
    description: str
    widget: type[PolledView]
    page: Page


#: The views, declared once: tabs, keys, the command palette and the polls follow.
VIEWS = (
    View("fleet", "Fleet", "f", "servers by GPU model, and each server", FleetView, fleet.page),
    View(
        "contexts",
        "Contexts",
        "c",
        "which context is warm where, loads, cache hits, evictions",
        ContextsView,
        contexts.page,
    ),
    View(
        "losses",
        "Losses",
        "l",
        "servers lost and joined, and what losses cost",
        LossesView,
        losses.page,
    ),
    View(
        "throughput",
        "Throughput",
        "t",
        "jobs/min and items/s over time, per GPU model",
        ThroughputView,
        throughput.page,
    ),
    View(
        "ledger",
        "Ledger",
        "g",
        "where the latest run's GPU-seconds went, by GPU model and context",
        LedgerView,
        ledger.page,
    ),
    View(
        "progress",
        "Progress",
        "p",
        "the current run: done, failed, ETA",
        ProgressView,
        progress.page,
    ),
)
#: What each view shows, by tab id.
PAGES: dict[str, Page] = {view.tab: view.page for view in VIEWS}

#: Seconds without a key press after which a full garbage collection may run.
IDLE_SECONDS = 1.0
#: Seconds a full garbage collection waits for such a moment at most (one takes 50-100
#: ms on a slow machine with a big fleet on screen: rendered lines are many objects).
FULL_GC_SECONDS = 300.0


class Poll(NamedTuple):
    """A poll's result: the snapshot, and what changed in each view (by tab id, and
    ``server:<address>`` for an open server page)."""

    snapshot: Snapshot
    updates: dict[str, ViewUpdate]


class Applied(NamedTuple):
    """How long a poll's result took on the UI thread, what had changed, and how long
    its read took (off the UI thread)."""

    seconds: float
    changed: int
    finished: int
    read_seconds: float


class MonitorApp(App[None]):
    """A live, read-only view of a context catalog."""

    #: A read is under way (a poll while one is is skipped).
    reading: var[bool] = var(False)

    # Absolute: Textual resolves a relative path against a subclass's own module.
    CSS_PATH = Path(__file__).parent / "monitor.tcss"
    TITLE = "snakemake-context monitor"
    BINDINGS = [
        # The tabs' labels name their keys; the footer keeps room for the rest at 80 columns.
        *(Binding(v.key, f"show('{v.tab}')", v.title, show=False) for v in VIEWS),
        Binding("w", "window", "Window"),
        Binding("r", "poll", "Refresh"),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self,
        source: CatalogSource,
        *,
        interval: float = 1.0,
        clock: Callable[[], float] = time.time,
        live: bool = True,
    ) -> None:
        super().__init__()
        # No animations: a key press shows its view in the next frame (the tabs'
        # underline animation alone took 0.4 s).
        self.animation_level = "none"
        self.source = source
        self.interval = interval
        self.clock = clock
        self.live = live
        self.window = WINDOWS[1][0]
        self.snapshot: Snapshot | None = None
        self.problem: str | None = None
        self.polls = 0
        #: Each poll's time on the UI thread, with what had changed (benchmarks).
        self.applied: list[Applied] = []
        self.presenter = Presenter()
        #: The server page open (read by the polling thread), if any.
        self.server_page: str | None = None
        self._view_by_tab: dict[str, PolledView] = {}
        self._gc_threshold: tuple[int, int, int] | None = None
        self._key_at = self._full_gc_at = time.monotonic()

    def compose(self) -> ComposeResult:
        yield StatusBar(self.source.spec, id="status")
        with TabbedContent(initial="fleet", id="views"):
            for view in VIEWS:
                with TabPane(f"{view.title} ({view.key})", id=view.tab):
                    yield view.widget()
        yield Static(id="problem")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.set_interval(1.0, self._every_second)
        if self.live:
            self.action_poll()
            self.set_interval(self.interval, self.action_poll)
        else:
            self.read_now()

    # -- polling (off the UI thread) ---------------------------------------------

    def action_poll(self) -> None:
        """Read the catalog in a worker thread (skipped while a read is under way)."""
        if not self.reading:
            self.reading = True
            self._poll()

    @work(thread=True, exclusive=True, group="poll", exit_on_error=False)
    def _poll(self) -> None:
        try:
            result = self._read()
        except Exception as error:  # a bug rather than the catalog: show it, poll on
            result = f"Showing the catalog failed: {type(error).__name__}: {error}"
        self.call_from_thread(self._polled, result)

    def _polled(self, result: Poll | str) -> None:
        self.reading = False
        self.apply(result)

    def _read(self) -> Poll | str:
        """One poll's work off the UI thread: read, then work out what changed."""
        try:
            snapshot = self.source.fetch(self.window)
        except CatalogProblem as problem:
            return str(problem)
        pages = dict(PAGES)
        if self.server_page is not None:
            pages[f"server:{self.server_page}"] = partial(_server_page, self.server_page)
        return Poll(snapshot, self.presenter.present(snapshot, pages))

    def read_now(self) -> None:
        """Read the catalog on this thread (tests and snapshots: no timers)."""
        self.apply(self._read())

    def apply(self, result: Poll | str) -> None:
        """Show a poll's result: what changed in each view, or the problem."""
        started = time.perf_counter()
        try:
            self._apply(result)
        finally:
            seconds = time.perf_counter() - started
            if isinstance(result, Poll):
                snapshot = result.snapshot
                read = snapshot.query_seconds
                self.applied.append(Applied(seconds, snapshot.changed, snapshot.finished, read))

    def _apply(self, result: Poll | str) -> None:
        self.polls += 1
        status = self.query_one(StatusBar)
        problem_box = self.query_one("#problem", Static)
        views = self.query_one("#views", TabbedContent)
        if isinstance(result, str):
            self.problem = result
            status.problem = True
            problem_box.update(text(result, lines=True))
            problem_box.display = self.snapshot is None
            views.display = self.snapshot is not None
            self._tick()
            return
        self.problem = None
        snapshot = result.snapshot
        if self.snapshot is None:
            self.call_after_refresh(self._freeze_long_lived)
        self.snapshot = snapshot
        status.problem = False
        status.fetched_at = snapshot.fetched_at
        # How long a read took, when polling live (a fixed display otherwise: snapshots).
        status.query_ms = snapshot.query_seconds * 1000 if self.live else None
        status.stale_run = bool(snapshot.progress and snapshot.progress.run.state == "stale")
        problem_box.display = False
        views.display = True
        for tab, view in self._views().items():
            update = result.updates.get(tab)
            if update is not None:
                view.receive(update, shown=tab == views.active)
        page = self.screen if isinstance(self.screen, ServerScreen) else None
        if page is not None and (update := result.updates.get(f"server:{page.address}")):
            page.receive(update)
        self.server_page = page.address if page is not None else None
        self._tick()

    def _views(self) -> dict[str, PolledView]:
        """The views by tab id (a query by type would not find the mixin)."""
        if not self._view_by_tab:
            for pane in self.query(TabPane):
                for child in pane.children:
                    if isinstance(child, PolledView):
                        self._view_by_tab[pane.id or ""] = child
        return self._view_by_tab

    def _freeze_long_lived(self) -> None:
        # With a big fleet on screen the process tracks some 200,000 objects (tables,
        # their rendered lines, Textual's own); a full cyclic collection then takes
        # ~100 ms on the UI thread whenever it triggers, which is what a key press
        # waited for at 1,000 servers. Freezing what exists once the first data is
        # shown leaves the collector only what later polls and renders create; even
        # that (some 50,000 objects: rendered lines) takes 20-60 ms on a slow machine,
        # so full collections wait for a moment without key presses (_every_second).
        gc.collect()
        gc.freeze()
        if self._gc_threshold is None:
            self._gc_threshold = gc.get_threshold()
            gc.set_threshold(self._gc_threshold[0], self._gc_threshold[1], 1_000_000)
        self._full_gc_at = time.monotonic()

    def on_unmount(self) -> None:
        """Hand the frozen objects back to the collector, and its thresholds (an app
        in a test run)."""
        gc.unfreeze()
        if self._gc_threshold is not None:
            gc.set_threshold(*self._gc_threshold)
            self._gc_threshold = None

    def on_key(self) -> None:
        """Note the time of each key press (full collections wait for a quiet moment)."""
        self._key_at = time.monotonic()

    def _every_second(self) -> None:
        self._tick()
        now = time.monotonic()
        if self._gc_threshold is None:
            return
        # Due when Python would have collected (its third threshold), run when idle.
        due = gc.get_count()[2] >= self._gc_threshold[2]
        idle = now - self._key_at >= IDLE_SECONDS
        if due and (idle or now - self._full_gc_at >= FULL_GC_SECONDS):
            gc.collect()
            self._full_gc_at = now

    def _tick(self) -> None:
        # The default screen's bar; gone while the app closes (a timer may fire then).
        for bar in self.screen_stack[0].query(StatusBar) if self.screen_stack else ():
            bar.refresh_age(self.clock())

    # -- actions -----------------------------------------------------------------

    def action_show(self, tab: str) -> None:
        """Switch to a view (from the server page or help too), with what changed
        while it was hidden."""
        while len(self.screen_stack) > 1:
            self.pop_screen()
        self.query_one("#views", TabbedContent).active = tab
        self._views()[tab].flush()

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        """A view shown by a click: what changed while it was hidden."""
        view = self._views().get(event.pane.id or "")
        if view is not None:
            view.flush()

    def action_window(self) -> None:
        """Cycle the throughput window (5 min, 15 min, 1 h, all)."""
        labels = [label for label, _ in WINDOWS]
        self.window = labels[(labels.index(self.window) + 1) % len(labels)]
        self.notify(f"Throughput window: {self.window}", timeout=2)
        if self.live:
            self.action_poll()
        else:
            self.read_now()

    def action_help(self) -> None:
        """Show keys and views."""
        self.push_screen(HelpScreen())

    def on_fleet_view_server_chosen(self, event: FleetView.ServerChosen) -> None:
        """Open a server's page."""
        self.server_page = event.address
        self.push_screen(ServerScreen(event.address))

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        """The command palette: one entry per view, then Textual's own."""
        for v in VIEWS:
            yield SystemCommand(
                f"Show {v.title}", f"{v.description} ({v.key})", lambda t=v.tab: self.action_show(t)
            )
        yield SystemCommand(
            "Change throughput window", "5 min, 15 min, 1 h, all (w)", self.action_window
        )
        yield SystemCommand("Refresh", "read the catalog now (r)", self.action_poll)
        yield from super().get_system_commands(screen)


def _server_page(address: str, snapshot: Snapshot, memo: Memo) -> ViewModel:
    return server.page(snapshot, memo, address)
