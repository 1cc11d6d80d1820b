"""Losses: servers lost and joined over time, with the jobs each loss sent back."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from ..data import Snapshot
from ..format import clock, duration
from ..model import Memo, Rows, ViewModel
from ..tables import Table, clip, clip_name, setup_columns
from .base import PolledView

COLUMNS = [
    ("time", "time", 8),
    ("event", "event", 6),
    ("server", "server", 12),
    ("model", "GPU model", 12),
    ("jobs", "jobs", 4),
    ("lost", "work lost", 9),
    ("detail", "reason: jobs", None),
]


def page(snapshot: Snapshot, memo: Memo) -> ViewModel:
    """What the losses view shows (off the UI thread)."""
    rows = memo.rows("losses-table", (snapshot.timeline,), lambda: _rows(snapshot))
    t = snapshot.loss_totals
    summary = (
        f"Lost {t.servers_lost} server(s): {t.jobs_sent_back} job(s) sent back, "
        f"{duration(t.seconds_lost)} of work lost. {t.servers_joined} joined, "
        f"{t.servers_left} left in all."
    )
    return ViewModel(tables={"losses-table": rows}, texts={"losses-summary": summary})


def _rows(snapshot: Snapshot) -> Rows:
    rows = {}
    for event in snapshot.timeline:
        detail = event.reason
        if event.jobs:
            detail = f"{event.reason}: {', '.join(event.jobs)}"
        rows[f"{event.kind}:{event.address}:{event.at:.3f}"] = (
            clock(event.at),
            event.kind,
            clip_name(event.server, 12),
            clip(event.gpu_model, 12),
            str(event.jobs_lost) if event.kind == "lost" else "",
            duration(event.seconds_lost) if event.kind == "lost" else "",
            clip(detail or "-", 40),
        )
    return rows


class LossesView(Vertical, PolledView):
    """A timeline (newest first) and a running count of what losses cost."""

    def compose(self) -> ComposeResult:
        yield Static(id="losses-summary", classes="summary")
        yield Table(id="losses-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        setup_columns(self.query_one("#losses-table", DataTable), COLUMNS)
