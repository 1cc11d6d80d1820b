"""Throughput: jobs/min and items/s over a selectable window, overall and per GPU model."""

from __future__ import annotations

from collections.abc import Hashable

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Sparkline, Static

from ..data import Snapshot
from ..format import rate, window_phrase
from ..model import Memo, Rows, ViewModel
from ..tables import Table, clip, setup_columns, text
from .base import PolledView

COLUMNS = [
    ("context", "context", 14),
    ("model", "GPU model", 14),
    ("jobs", "jobs", 6),
    ("mean", "mean job s", 10),
    ("items", "items", 8),
    ("ips", "items/s", 8),
]

#: A chart: (widget id suffix, label, jobs per minute per bucket).
Chart = tuple[str, str, tuple[float, ...]]


def page(snapshot: Snapshot, memo: Memo) -> ViewModel:
    """What the throughput view shows (off the UI thread)."""
    charts: list[Chart] = []
    for series in snapshot.series:
        minutes = series.bucket_seconds * len(series.jobs) / 60.0
        jobs, items = sum(series.jobs), sum(series.items)
        label = (
            f"{'all GPU models' if series.gpu_model == 'all' else series.gpu_model}: "
            f"{rate(jobs / minutes if minutes else None)} jobs/min, "
            f"{rate(items / (minutes * 60) if minutes else None)} items/s"
        )
        charts.append((_safe(series.gpu_model), label, tuple(series.jobs_per_minute)))
    rows = memo.rows("throughput-table", (snapshot.throughput,), lambda: _rows(snapshot))
    summary = (
        f"Window: {window_phrase(snapshot.window)} (w: change). Jobs per minute over time, "
        "overall and per GPU model; the table covers the whole catalog."
    )
    return ViewModel(
        tables={"throughput-table": rows},
        texts={"throughput-summary": summary},
        extra=tuple(charts),
    )


def _rows(snapshot: Snapshot) -> Rows:
    return {
        f"{row.context}@{row.gpu_model}": (
            clip(row.context, 14),
            clip(row.gpu_model, 14),
            str(row.jobs),
            rate(row.mean_job_seconds, 2),
            str(row.items),
            rate(row.items_per_second),
        )
        for row in snapshot.throughput
    }


class ThroughputView(VerticalScroll, PolledView):
    """A sparkline per GPU model (and all together) over the window; w changes it."""

    def compose(self) -> ComposeResult:
        yield Static(id="throughput-summary", classes="summary")
        yield Table(id="throughput-table", cursor_type="none", zebra_stripes=True)

    def on_mount(self) -> None:
        setup_columns(self.query_one("#throughput-table", DataTable), COLUMNS)

    def draw(self, extra: Hashable) -> None:
        """The charts, keyed by GPU model: updated, added before the table, removed."""
        charts: tuple[Chart, ...] = extra  # type: ignore[assignment]
        table = self.query_one("#throughput-table", DataTable)
        for key, label, data in charts:
            found = self.query(f"#label-{key}")
            if found:
                found.first(Static).update(text(label), layout=False)  # one short line
                self.query_one(f"#spark-{key}", Sparkline).data = list(data)
            else:
                series = Static(text(label), id=f"label-{key}", classes="series-label")
                self.mount(series, before=table)
                self.mount(Sparkline(list(data), id=f"spark-{key}"), before=table)
        wanted = {key for key, _, _ in charts}
        for widget in list(self.query(".series-label")):
            key = widget.id.removeprefix("label-") if widget.id else ""
            if key not in wanted:
                widget.remove()
                self.query_one(f"#spark-{key}").remove()


def _safe(model: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in model)
