"""Contexts: which context is warm on which server, load times, cache hits, where
each load got it from, evictions, and the gangs (a context spanning several processes:
"name xk" for its k ranks)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from ..data import Snapshot
from ..format import bytes_, cache_cell, kind_cell, rate
from ..model import Cells, Memo, ViewModel
from ..rows import PlacementRow
from ..tables import Table, clip, clip_name, setup_columns
from .base import PolledView

COLUMNS = [
    ("context", "context", 12),
    ("server", "server", 10),
    ("state", "state", 7),
    ("load", "load s", 6),
    ("cache", "cache", 5),
    ("from", "from", 7),
    ("loads", "loads", 5),
    ("evicted", "evicted", 7),
    ("warm", "warm jobs", 9),
]


def page(snapshot: Snapshot, memo: Memo) -> ViewModel:
    """What the contexts view shows (off the UI thread)."""
    placements = snapshot.placements
    rows = memo.keyed("contexts-table", placements, lambda p: f"{p.identity}@{p.address}", _cells)
    warm = sum(1 for p in placements if p.state == "ready")
    hits = sum(1 for p in placements if p.from_cache)
    peers = sum(1 for p in placements if p.kind == "peer")
    evictions = sum(p.evictions for p in placements)
    gangs = [p for p in placements if p.ranks > 1 and p.state in ("loading", "ready")]
    sizes = ", ".join(f"{c.name} {bytes_(c.bytes)}" for c in snapshot.contexts[:4])
    summary = (
        f"{len(snapshot.contexts)} context(s) ({sizes or 'none'}); warm in {warm} "
        f"place(s); {hits} load(s) from local cache"
        + (f", {peers} from peers" if peers else "")
        + f"; {evictions} eviction(s)"
        + "".join(f"; {p.context} a gang of {p.ranks} ranks on {p.server}" for p in gangs[:3])
        + "."
    )
    return ViewModel(tables={"contexts-table": rows}, texts={"contexts-summary": summary})


def _cells(p: PlacementRow) -> Cells:
    # A gang's ranks follow its name: "smollm2 x3".
    name = (
        p.context
        if p.ranks <= 1
        else f"{clip(p.context, 12 - 1 - len(str(p.ranks)) - 1)} x{p.ranks}"
    )
    return (
        name,
        clip_name(p.server, 10),
        p.state,
        rate(p.load_seconds),
        cache_cell(p.from_cache),
        kind_cell(p.kind),
        str(p.loads),
        str(p.evictions),
        str(p.jobs_warm),
    )


class ContextsView(Vertical, PolledView):
    """One row per context and live server it was placed on."""

    def compose(self) -> ComposeResult:
        yield Static(id="contexts-summary", classes="summary")
        yield Table(id="contexts-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        setup_columns(self.query_one("#contexts-table", DataTable), COLUMNS)
