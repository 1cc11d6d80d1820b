"""Throughput: jobs/min and items/s over a selectable window, overall and per GPU model."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Sparkline, Static

from ..data import Snapshot
from ..format import rate, window_phrase
from ..tables import clip, setup_columns, sync_rows

COLUMNS = [
    ("context", "context", 14),
    ("model", "GPU model", 14),
    ("jobs", "jobs", 6),
    ("mean", "mean job s", 10),
    ("items", "items", 8),
    ("ips", "items/s", 8),
]


class ThroughputView(VerticalScroll):
    """A sparkline per GPU model (and all together) over the window; w changes it."""

    def compose(self) -> ComposeResult:
        yield Static(id="throughput-summary", classes="summary")
        yield DataTable(id="throughput-table", cursor_type="none", zebra_stripes=True)

    def on_mount(self) -> None:
        setup_columns(self.query_one("#throughput-table", DataTable), COLUMNS)

    def show(self, snapshot: Snapshot) -> None:
        """Update from a poll: charts keyed by GPU model, the table by key."""
        table = self.query_one("#throughput-table", DataTable)
        wanted = [s.gpu_model for s in snapshot.series]
        for series in snapshot.series:
            key = _safe(series.gpu_model)
            minutes = series.bucket_seconds * len(series.jobs) / 60.0
            jobs, items = sum(series.jobs), sum(series.items)
            label = (
                f"{'all GPU models' if series.gpu_model == 'all' else series.gpu_model}: "
                f"{rate(jobs / minutes if minutes else None)} jobs/min, "
                f"{rate(items / (minutes * 60) if minutes else None)} items/s"
            )
            found = self.query(f"#label-{key}")
            if found:
                found.first(Static).update(label)
                self.query_one(f"#spark-{key}", Sparkline).data = series.jobs_per_minute
            else:
                self.mount(Static(label, id=f"label-{key}", classes="series-label"), before=table)
                self.mount(Sparkline(series.jobs_per_minute, id=f"spark-{key}"), before=table)
        for widget in list(self.query(".series-label")):
            model = widget.id.removeprefix("label-") if widget.id else ""
            if model not in {_safe(m) for m in wanted}:
                widget.remove()
                self.query_one(f"#spark-{model}").remove()
        sync_rows(
            table,
            {
                f"{row.context}@{row.gpu_model}": (
                    clip(row.context, 14),
                    clip(row.gpu_model, 14),
                    str(row.jobs),
                    rate(row.mean_job_seconds, 2),
                    str(row.items),
                    rate(row.items_per_second),
                )
                for row in snapshot.throughput
            },
        )
        self.query_one("#throughput-summary", Static).update(
            f"Window: {window_phrase(snapshot.window)} (w: change). Jobs per minute over time, "
            "overall and per GPU model; the table covers the whole catalog."
        )


def _safe(model: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in model)
