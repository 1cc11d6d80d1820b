"""A server's page: its GPU, the contexts it holds, the jobs it ran lately, and the
story of the job Enter selects (read in a worker thread: keys never wait)."""

from __future__ import annotations

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from ..data import Snapshot
from ..format import bytes_, cache_cell, clock, duration, kind_cell, rate
from ..model import Cells, Memo, ViewModel, ViewUpdate, compare
from ..tables import Table, apply_delta, clip, setup_columns, text

CONTEXT_COLUMNS = [
    ("context", "context", 14),
    ("state", "state", 7),
    ("load", "load s", 6),
    ("cache", "cache", 5),
    ("from", "from", 7),
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


def page(snapshot: Snapshot, memo: Memo, address: str) -> ViewModel:
    """What a server's page shows (off the UI thread, while the page is open)."""
    server = snapshot.server(address)
    if server is None:
        title = f"Server {address} has left the fleet (see Losses). Esc: back."
        return ViewModel(texts={"server-title": title})
    gpu = server.gpu_name or "no GPU (CPU server)"
    title = (
        f"{server.name} on {server.host} ({server.address}) - {gpu}, "
        f"{bytes_(server.gpu_memory_bytes)}, compute capability "
        f"{server.compute_capability or '-'}; {server.busy}/{server.slots} slots busy; "
        f"{server.jobs_ok} jobs done, {server.jobs_failed} failed, {server.items} items; "
        f"joined {clock(server.joined)}; busy {duration(server.busy_seconds)}, idle "
        f"{duration(server.idle_seconds(snapshot.fetched_at))} since"
        + (f"; expected life left {server.life.text()}" if server.life is not None else "")
        + ". Esc: back."
    )
    contexts = memo.rows(
        "server-contexts",
        (snapshot.placements,),
        lambda: {
            p.identity: (
                clip(p.context, 14),
                p.state,
                rate(p.load_seconds),
                cache_cell(p.from_cache),
                kind_cell(p.kind),
                str(p.loads),
                str(p.evictions),
                str(p.jobs_warm),
            )
            for p in snapshot.placements
            if p.address == address
        },
    )
    jobs = {
        job.key: (
            clock(job.finished),
            clip(job.rule or "?", 12),
            job.outcome or "running",
            duration((job.finished or snapshot.fetched_at) - job.started) if job.started else "-",
            str(job.items),
            job.placed_by or "-",
            "yes" if job.cold else "",
        )
        for job in snapshot.recent_jobs
        if job.server == server.name
    }
    return ViewModel(
        tables={"server-contexts": contexts, "server-jobs": jobs},
        texts={"server-title": title},
    )


class ServerScreen(Screen[None]):
    """Details of one server, kept up to date by the app's polls."""

    BINDINGS = [Binding("escape,backspace", "app.pop_screen", "Back")]

    def __init__(self, address: str) -> None:
        super().__init__()
        self.address = address
        self.held: dict[str, dict[str, Cells]] = {}

    def compose(self) -> ComposeResult:
        yield Static(id="server-title", classes="summary")
        yield Table(id="server-contexts", cursor_type="none", zebra_stripes=True)
        yield Table(id="server-jobs", cursor_type="row", zebra_stripes=True)
        yield Static(id="server-story", classes="summary")
        yield Footer()

    def on_mount(self) -> None:
        setup_columns(self.query_one("#server-contexts", DataTable), CONTEXT_COLUMNS)
        setup_columns(self.query_one("#server-jobs", DataTable), JOB_COLUMNS)
        snapshot = getattr(self.app, "snapshot", None)
        if snapshot is not None:
            self.receive(compare(None, page(snapshot, Memo(), self.address)))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter on a job: show its story."""
        if event.data_table.id == "server-jobs" and event.row_key.value is not None:
            self.tell_story(str(event.row_key.value))

    @work(thread=True, exclusive=True, group="story", exit_on_error=False)
    def tell_story(self, key: str) -> None:
        """Read the job's story from the catalog, off the UI thread."""
        source = getattr(self.app, "source", None)
        story = text(source.story(key) if source is not None else "", lines=True)
        self.app.call_from_thread(self.query_one("#server-story", Static).update, story)

    def receive(self, update: ViewUpdate) -> None:
        """Apply a poll's update."""
        for label, value in update.texts.items():
            self.query_one(f"#{label}", Static).update(text(value, lines=True))
        for table, delta in update.tables.items():
            held = self.held.setdefault(table, {})
            apply_delta(self.query_one(f"#{table}", DataTable), held, delta)
