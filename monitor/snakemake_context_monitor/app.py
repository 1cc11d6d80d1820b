"""The Textual app: five views over a catalog, polled off the UI thread."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Static, TabbedContent, TabPane

from .data import WINDOWS, CatalogProblem, CatalogSource, Snapshot
from .statusbar import StatusBar
from .views.contexts import ContextsView
from .views.fleet import FleetView
from .views.help import HelpScreen
from .views.losses import LossesView
from .views.progress import ProgressView
from .views.server import ServerScreen
from .views.throughput import ThroughputView

__all__ = ["VIEWS", "MonitorApp"]

#: (tab id, title, key, description)
VIEWS = (
    ("fleet", "Fleet", "f", "servers by GPU model, and each server"),
    ("contexts", "Contexts", "c", "which context is warm where, loads, cache hits, evictions"),
    ("losses", "Losses", "l", "servers lost and joined, and what losses cost"),
    ("throughput", "Throughput", "t", "jobs/min and items/s over time, per GPU model"),
    ("progress", "Progress", "p", "the current run: done, failed, ETA"),
)


class MonitorApp(App[None]):
    """A live, read-only view of a context catalog."""

    # Absolute: Textual resolves a relative path against a subclass's own module.
    CSS_PATH = Path(__file__).parent / "monitor.tcss"
    TITLE = "snakemake-context monitor"
    BINDINGS = [
        # The tabs' labels name their keys; the footer keeps room for the rest at 80 columns.
        *(Binding(key, f"show('{tab}')", title, show=False) for tab, title, key, _ in VIEWS),
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
        #: Seconds each poll's result took to apply on the UI thread (benchmarks).
        self.apply_seconds: list[float] = []
        self._polling = threading.Lock()

    def compose(self) -> ComposeResult:
        yield StatusBar(self.source.spec, id="status")
        with TabbedContent(initial="fleet", id="views"):
            with TabPane("Fleet (f)", id="fleet"):
                yield FleetView()
            with TabPane("Contexts (c)", id="contexts"):
                yield ContextsView()
            with TabPane("Losses (l)", id="losses"):
                yield LossesView()
            with TabPane("Throughput (t)", id="throughput"):
                yield ThroughputView()
            with TabPane("Progress (p)", id="progress"):
                yield ProgressView()
        yield Static(id="problem")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.set_interval(1.0, self._tick)
        if self.live:
            self.action_poll()
            self.set_interval(self.interval, self.action_poll)
        else:
            self.read_now()

    # -- polling (off the UI thread) ---------------------------------------------

    def action_poll(self) -> None:
        """Read the catalog in a worker thread (skipped while a read is under way)."""
        if self._polling.acquire(blocking=False):
            self.run_worker(self._poll, thread=True, group="poll", exit_on_error=False)

    def _poll(self) -> None:
        try:
            result: Snapshot | str = self.source.fetch(self.window)
        except CatalogProblem as problem:
            result = str(problem)
        finally:
            self._polling.release()
        self.call_from_thread(self.apply, result)

    def read_now(self) -> None:
        """Read the catalog on this thread (tests and snapshots: no timers)."""
        try:
            self.apply(self.source.fetch(self.window))
        except CatalogProblem as problem:
            self.apply(str(problem))

    def apply(self, result: Snapshot | str) -> None:
        """Show a poll's result: update every view by key, or show the problem."""
        started = time.perf_counter()
        try:
            self._apply(result)
        finally:
            self.apply_seconds.append(time.perf_counter() - started)

    def _apply(self, result: Snapshot | str) -> None:
        self.polls += 1
        status = self.query_one(StatusBar)
        problem_box = self.query_one("#problem", Static)
        views = self.query_one("#views", TabbedContent)
        if isinstance(result, str):
            self.problem = result
            status.problem = True
            problem_box.update(result)
            problem_box.display = self.snapshot is None
            views.display = self.snapshot is not None
            self._tick()
            return
        self.problem = None
        if self.snapshot is None:
            self.call_after_refresh(self._freeze_long_lived)
        self.snapshot = result
        status.problem = False
        status.fetched_at = result.fetched_at
        # How long a read took, when polling live (a fixed display otherwise: snapshots).
        status.query_ms = result.query_seconds * 1000 if self.live else None
        status.stale_run = bool(result.progress and result.progress.run.state == "stale")
        problem_box.display = False
        views.display = True
        self.query_one(FleetView).show(result)
        self.query_one(ContextsView).show(result)
        self.query_one(LossesView).show(result)
        self.query_one(ThroughputView).show(result)
        self.query_one(ProgressView).show(result)
        if isinstance(self.screen, ServerScreen):
            self.screen.show(result)
        self._tick()

    def _freeze_long_lived(self) -> None:
        # With a big fleet on screen the process tracks some 200,000 objects (tables,
        # their rendered lines, Textual's own); a full cyclic collection then takes
        # ~100 ms on the UI thread whenever it triggers, which is what a key press
        # waited for at 1,000 servers. Freezing what exists once the first data is
        # shown leaves the collector only what later polls create (~5 ms).
        gc.collect()
        gc.freeze()

    def on_unmount(self) -> None:
        """Hand the frozen objects back to the collector (an app in a test run)."""
        gc.unfreeze()

    def _tick(self) -> None:
        self.query_one(StatusBar).refresh_age(self.clock())

    # -- actions -----------------------------------------------------------------

    def action_show(self, tab: str) -> None:
        """Switch to a view (from the server page or help too)."""
        while len(self.screen_stack) > 1:
            self.pop_screen()
        self.query_one("#views", TabbedContent).active = tab

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
        self.push_screen(ServerScreen(event.address))

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        """The command palette: one entry per view, then Textual's own."""
        for tab, title, key, description in VIEWS:
            yield SystemCommand(
                f"Show {title}", f"{description} ({key})", lambda tab=tab: self.action_show(tab)
            )
        yield SystemCommand(
            "Change throughput window", "5 min, 15 min, 1 h, all (w)", self.action_window
        )
        yield SystemCommand("Refresh", "read the catalog now (r)", self.action_poll)
        yield from super().get_system_commands(screen)
