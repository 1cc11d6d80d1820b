"""Losses: servers lost and joined over time, with the jobs each loss sent back."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from ..data import Snapshot
from ..format import clock, duration
from ..tables import clip, setup_columns, sync_rows

COLUMNS = [
    ("time", "time", 8),
    ("event", "event", 6),
    ("server", "server", 12),
    ("model", "GPU model", 12),
    ("jobs", "jobs", 4),
    ("lost", "work lost", 9),
    ("detail", "reason: jobs", None),
]


class LossesView(Vertical):
    """A timeline (newest first) and a running count of what losses cost."""

    def compose(self) -> ComposeResult:
        yield Static(id="losses-summary", classes="summary")
        yield DataTable(id="losses-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        setup_columns(self.query_one("#losses-table", DataTable), COLUMNS)

    def show(self, snapshot: Snapshot) -> None:
        """Update from a poll."""
        rows = {}
        for event in snapshot.timeline:
            detail = event.reason
            if event.jobs:
                detail = f"{event.reason}: {', '.join(event.jobs)}"
            rows[f"{event.kind}:{event.address}:{event.at:.3f}"] = (
                clock(event.at),
                event.kind,
                clip(event.server, 12),
                clip(event.gpu_model, 12),
                str(event.jobs_lost) if event.kind == "lost" else "",
                duration(event.seconds_lost) if event.kind == "lost" else "",
                clip(detail or "-", 40),
            )
        sync_rows(self.query_one("#losses-table", DataTable), rows)
        t = snapshot.loss_totals
        self.query_one("#losses-summary", Static).update(
            f"Lost {t.servers_lost} server(s): {t.jobs_sent_back} job(s) sent back, "
            f"{duration(t.seconds_lost)} of work lost. {t.servers_joined} joined, "
            f"{t.servers_left} left in all."
        )
