"""Ledger: where the latest run's GPU-seconds went, by GPU model and by context, live
(the buckets of ``snakemake-context report``)."""

from __future__ import annotations

from collections.abc import Mapping

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static

from snakemake_executor_context.catalog.reading.liveledger import Bucket, LedgerSums

from ..data import Snapshot
from ..format import clock, duration
from ..model import Cells, Memo, Rows, ViewModel
from ..tables import Table, clip, setup_columns
from .base import PolledView

#: The shares shown, each a bucket or a group of buckets (header, buckets).
SHARES: tuple[tuple[str, tuple[Bucket, ...]], ...] = (
    ("useful", (Bucket.RUNNING,)),
    ("loading", tuple(b for b in Bucket if b.is_loading)),
    ("idle warm", (Bucket.IDLE_WARM,)),
    ("idle cold", (Bucket.IDLE_COLD,)),
    ("lost", (Bucket.LOST,)),
    ("failed", (Bucket.FAILED,)),
    (
        "other",
        (
            Bucket.STARTING,
            Bucket.DRAINING,
            Bucket.ALLOCATED_BEFORE,
            Bucket.ALLOCATED_AFTER,
        ),
    ),
)


def _columns(first: str) -> list[tuple[str, str, int]]:
    head = [("key", first, 16), ("gpuh", "GPU-h", 8)]
    return head + [(label.replace(" ", "-"), label, 9) for label, _ in SHARES]


def _row(key: str, sums: Mapping[Bucket, float]) -> Cells:
    whole = sum(sums.values())
    shares = [
        f"{100 * sum(sums.get(b, 0.0) for b in group) / whole:.1f}%" if whole else "-"
        for _, group in SHARES
    ]
    return (clip(key or "(none)", 16), f"{whole / 3600:.2f}", *shares)


def _rows(table: Mapping[str, Mapping[Bucket, float]]) -> Rows:
    return {key or "(none)": _row(key, sums) for key, sums in table.items()}


def page(snapshot: Snapshot, memo: Memo) -> ViewModel:
    """What the ledger view shows (off the UI thread)."""
    ledger: LedgerSums | None = snapshot.ledger
    if ledger is None:
        return ViewModel(texts={"ledger-summary": "No run in this catalog yet."})
    window = ledger.window
    span = window.end - window.start
    state = "live" if window.live else "ended"
    summary = (
        f"Run {window.run} ({state}): {ledger.servers} server(s) over {duration(span)} from "
        f"{clock(window.start)}. Shares of its GPU-seconds by GPU model, then by context; "
        "`snakemake-context report` draws them."
    )
    books = ledger.pool
    if books is not None:
        summary += (
            f"\nPool: {books['submitted']} pilot(s) submitted, {books['started']} started, "
            f"{books['running']} running, {books['preempted']} preempted, {books['crashed']} "
            f"crashed, {books['retired']} retired; pilot-seconds {books['pilot_seconds']:.0f} "
            f"(busy {books['busy_seconds']:.0f}, idle {books['idle_seconds']:.0f})."
        )
    total = {"all": ledger.totals()}
    return ViewModel(
        tables={
            "ledger-models": {**_rows(ledger.by_model), **_rows(total)},
            "ledger-contexts": _rows(ledger.by_context),
        },
        texts={"ledger-summary": summary},
    )


class LedgerView(VerticalScroll, PolledView):
    """The latest run's GPU-seconds in the ledger's buckets, by GPU model and context."""

    def compose(self) -> ComposeResult:
        yield Static(id="ledger-summary", classes="summary")
        yield Table(id="ledger-models", cursor_type="none", zebra_stripes=True)
        yield Table(id="ledger-contexts", cursor_type="none", zebra_stripes=True)

    def on_mount(self) -> None:
        setup_columns(self.query_one("#ledger-models", DataTable), _columns("GPU model"))
        setup_columns(self.query_one("#ledger-contexts", DataTable), _columns("context"))
