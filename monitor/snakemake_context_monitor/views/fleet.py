"""Fleet: servers grouped by GPU model, and every live server with its node; when no
run and no server is live, the last run's servers, ended."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Static

from snakemake_executor_context.catalog.reading.status import FleetRow

from ..data import Snapshot
from ..format import LAST_RUN, bytes_, clock, rate, window_phrase
from ..model import Cells, Memo, Rows, ViewModel
from ..rows import Series, ServerRow
from ..tables import Table, clip, clip_name, setup_columns
from .base import PolledView

MODEL_COLUMNS = [
    ("model", "GPU model", 14),
    ("servers", "srv", 3),
    ("busy", "busy", 4),
    ("free", "free", 4),
    ("memory", "GPU mem", 7),
    ("contexts", "ctx", 3),
    ("jobs", "jobs", 6),
    ("jpm", "jobs/min", 8),
    ("ips", "items/s", 7),
]
SERVER_COLUMNS = [
    ("name", "server", 10),
    # The host it runs on: a node that joined, a pilot's node, this machine.
    ("node", "node", 6),
    ("model", "model", 6),
    ("busy", "busy", 4),
    ("contexts", "contexts", 7),
    ("jobs", "jobs", 5),
    ("failed", "fail", 4),
    ("items", "items", 5),
    # Its expected remaining life ('prior': no lives seen to tell; whose lives the
    # estimate comes from is on its page); an ended server's: 'left' or 'lost'.
    ("life", "life left", 8),
    # When an idle server's last job ended: an idle server at a glance (its busy and
    # idle seconds are on its page); an ended server's: when it left.
    ("idle", "idle", 8),
]


def page(snapshot: Snapshot, memo: Memo) -> ViewModel:
    """What the fleet view shows (off the UI thread): the live servers, or when no run
    and no server is live, the last run's servers, ended."""
    ended = snapshot.ended
    fleet, shown = (ended.models, ended.servers) if ended else (snapshot.fleet, snapshot.servers)
    models = memo.rows(
        "fleet-models",
        (fleet, shown, snapshot.series),
        lambda: _model_rows(fleet, shown, snapshot.series),
    )
    servers = memo.keyed("fleet-servers", shown, lambda s: s.address, _server_cells)
    count = len([r for r in fleet if r.servers])
    if ended:
        lost = sum(s.lost for s in shown)
        over = "that run" if snapshot.window == LAST_RUN else window_phrase(snapshot.window)
        summary = (
            f"{len(shown)} servers of {count} GPU model(s) in {window_phrase(LAST_RUN)}, all "
            f"ended{f' ({lost} lost)' if lost else ''}; throughput over {over}."
        )
    else:
        busy = sum(s.busy for s in shown)
        slots = sum(s.slots for s in shown)
        summary = (
            f"{len(shown)} servers of {count} GPU model(s), {busy} of {slots} slots busy; "
            f"throughput over {window_phrase(snapshot.window)}. Enter: a server's page."
        )
    return ViewModel(
        tables={"fleet-models": models, "fleet-servers": servers},
        texts={"fleet-summary": summary},
    )


def _model_rows(fleet: list[FleetRow], servers: list[ServerRow], series: list[Series]) -> Rows:
    """A row per GPU model of ``fleet`` that has servers (``servers``: theirs); an ended
    fleet's have no busy or free slots."""
    by_model: dict[str, list[ServerRow]] = {}
    for server in servers:
        by_model.setdefault(server.gpu_model, []).append(server)
    window_minutes = _window_minutes(series)
    by_series = {s.gpu_model: s for s in series}
    rows = {}
    for row in fleet:
        if row.servers == 0:
            continue
        members = by_model.get(row.gpu_model, [])
        live = any(s.left is None for s in members)
        busy = sum(s.busy for s in members)
        done = by_series.get(row.gpu_model)
        jobs = sum(done.jobs) if done else 0
        items = sum(done.items) if done else 0
        rows[row.gpu_model] = (
            clip(row.gpu_model, 14),
            str(row.servers),
            str(busy) if live else "-",
            str(max(0, row.slots - busy)) if live else "-",
            bytes_(row.gpu_memory_bytes),
            str(len({c for s in members for c in s.contexts})),
            str(sum(s.jobs_ok for s in members)),
            rate(jobs / window_minutes if window_minutes else None),
            rate(items / (window_minutes * 60) if window_minutes else None),
        )
    return rows


def _server_cells(s: ServerRow) -> Cells:
    if s.left is not None:  # ended: 'left' or 'lost', and when
        busy, life, idle = "-", "lost" if s.lost else "left", clock(s.left)
    else:
        life = s.life.short() if s.life is not None else "-"
        busy, idle = f"{s.busy}/{s.slots}", _idle_since(s)
    return (
        clip_name(s.name, 10),
        clip_name(s.host or "-", 6),
        clip(s.gpu_model, 6),
        busy,
        clip(", ".join(s.contexts) or "-", 7),
        str(s.jobs_ok),
        str(s.jobs_failed),
        str(s.items),
        life,
        idle,
    )


def _idle_since(s: ServerRow) -> str:
    """When an idle server's last job ended ('never': it has run none)."""
    if s.busy:
        return "-"
    return clock(s.last_end) if s.last_end else "never"


def _window_minutes(series: list[Series]) -> float:
    first = series[0] if series else None
    if first is None:
        return 0.0
    return first.bucket_seconds * len(first.jobs) / 60.0


class FleetView(Vertical, PolledView):
    """Servers grouped by GPU model (heterogeneity at a glance), then each server."""

    class ServerChosen(Message):
        """The user picked a server (Enter on its row)."""

        def __init__(self, address: str) -> None:
            super().__init__()
            self.address = address

    def compose(self) -> ComposeResult:
        yield Static(id="fleet-summary", classes="summary")
        yield Table(id="fleet-models", cursor_type="none", zebra_stripes=True)
        yield Table(id="fleet-servers", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        models = self.query_one("#fleet-models", DataTable)
        models.can_focus = False  # a summary: Tab goes straight to the servers
        setup_columns(models, MODEL_COLUMNS)
        setup_columns(self.query_one("#fleet-servers", DataTable), SERVER_COLUMNS)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter on a server row opens its page."""
        if event.data_table.id == "fleet-servers" and event.row_key.value:
            self.post_message(self.ServerChosen(event.row_key.value))
