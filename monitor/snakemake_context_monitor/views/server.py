"""A server's page: its GPU, the contexts it holds, the jobs it ran lately."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from ..data import Snapshot
from ..format import bytes_, cache_cell, clock, duration, rate
from ..tables import clip, setup_columns, sync_rows

CONTEXT_COLUMNS = [
    ("context", "context", 14),
    ("state", "state", 7),
    ("load", "load s", 6),
    ("cache", "cache", 5),
    ("loads", "loads", 5),
    ("evicted", "evicted", 7),
    ("warm", "warm jobs", 9),
]
JOB_COLUMNS = [
    ("finished", "finished", 8),
    ("rule", "rule", 12),
    ("outcome", "outcome", 8),
    ("seconds", "seconds", 7),
    ("items", "items", 6),
    ("placed", "placed by", 9),
    ("cold", "cold", 4),
]


class ServerScreen(Screen[None]):
    """Details of one server, kept up to date by the app's polls."""

    BINDINGS = [Binding("escape,backspace", "app.pop_screen", "Back")]

    def __init__(self, address: str) -> None:
        super().__init__()
        self.address = address

    def compose(self) -> ComposeResult:
        yield Static(id="server-title", classes="summary")
        yield DataTable(id="server-contexts", cursor_type="none", zebra_stripes=True)
        yield DataTable(id="server-jobs", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        setup_columns(self.query_one("#server-contexts", DataTable), CONTEXT_COLUMNS)
        setup_columns(self.query_one("#server-jobs", DataTable), JOB_COLUMNS)
        snapshot = getattr(self.app, "snapshot", None)
        if snapshot is not None:
            self.show(snapshot)

    def show(self, snapshot: Snapshot) -> None:
        """Update from a poll."""
        server = snapshot.server(self.address)
        title = self.query_one("#server-title", Static)
        if server is None:
            title.update(f"Server {self.address} has left the fleet (see Losses). Esc: back.")
            return
        gpu = server.gpu_name or "no GPU (CPU server)"
        title.update(
            f"{server.name} on {server.host} ({server.address}) - {gpu}, "
            f"{bytes_(server.gpu_memory_bytes)}, compute capability "
            f"{server.compute_capability or '-'}; {server.busy}/{server.slots} slots busy; "
            f"{server.jobs_ok} jobs done, {server.jobs_failed} failed, {server.items} items; "
            f"joined {clock(server.joined)}. Esc: back."
        )
        sync_rows(
            self.query_one("#server-contexts", DataTable),
            {
                p.identity: (
                    clip(p.context, 14),
                    p.state,
                    rate(p.load_seconds),
                    cache_cell(p.from_cache),
                    str(p.loads),
                    str(p.evictions),
                    str(p.jobs_warm),
                )
                for p in snapshot.placements
                if p.address == self.address
            },
        )
        sync_rows(
            self.query_one("#server-jobs", DataTable),
            {
                job.key: (
                    clock(job.finished),
                    clip(job.rule or "?", 12),
                    job.outcome or "running",
                    duration((job.finished or snapshot.fetched_at) - job.started)
                    if job.started
                    else "-",
                    str(job.items),
                    job.placed_by or "-",
                    "yes" if job.cold else "",
                )
                for job in snapshot.recent_jobs
                if job.server == server.name
            },
        )
