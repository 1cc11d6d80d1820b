"""Progress: the current run's jobs ended of planned (ok and failed), an ETA; recent runs."""

from __future__ import annotations

from collections.abc import Hashable

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, ProgressBar, Static

from ..data import Snapshot
from ..format import clock, duration, rate
from ..model import Memo, ViewModel
from ..tables import Table, clip, setup_columns
from .base import PolledView

COLUMNS = [
    ("run", "run", 20),
    ("state", "state", 8),
    ("started", "started", 8),
    ("jobs", "jobs", 9),
    ("failed", "failed", 6),
    ("items", "items", 7),
    ("loads", "loads", 5),
]


def page(snapshot: Snapshot, memo: Memo) -> ViewModel:
    """What the progress view shows (off the UI thread); ``extra`` is the bar's
    (total, jobs ended: ok and failed)."""
    current = snapshot.progress
    bar: tuple[int | None, int] | None = None
    if current is None:
        summary = "No run in this catalog yet."
    else:
        run = current.run
        total = current.total
        ended = current.done + current.failed
        share = f" ({ended / total:.0%})" if total else ""
        state = run.state.upper() if run.state == "stale" else run.state
        stale = (
            " - no heartbeat from its writer for a minute: it may have died"
            if run.state == "stale"
            else ""
        )
        eta = "done" if current.eta_seconds == 0 else duration(current.eta_seconds)
        summary = (
            f"Run {run.run_id}: {state}{stale}\n"
            f"{ended} of {total if total is not None else '?'} jobs ended{share}: "
            f"{current.done} ok, {current.failed} failed, {run.items} items; "
            f"{rate(current.jobs_per_minute)} jobs/min lately; ETA {eta}; "
            f"started {clock(run.started)}"
        )
        bar = (total or None, ended)
    runs = {
        r.run_id: (
            clip(r.run_id, 20),
            r.state,
            clock(r.started),
            f"{r.jobs_ok}/{r.jobs_total if r.jobs_total is not None else '?'}",
            str(r.jobs_failed),
            str(r.items),
            str(r.loads),
        )
        for r in snapshot.runs
    }
    return ViewModel(tables={"progress-runs": runs}, texts={"progress-summary": summary}, extra=bar)


class ProgressView(Vertical, PolledView):
    """The newest running (or stale) run, else the newest; then the latest runs."""

    def compose(self) -> ComposeResult:
        yield Static(id="progress-summary", classes="summary")
        yield ProgressBar(id="progress-bar", show_eta=False)
        yield Table(id="progress-runs", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        setup_columns(self.query_one("#progress-runs", DataTable), COLUMNS)

    def draw(self, extra: Hashable) -> None:
        """The bar: (total or None, jobs ended)."""
        total: int | None
        ended: int
        total, ended = extra  # type: ignore[misc]
        self.query_one("#progress-bar", ProgressBar).update(total=total, progress=ended)
