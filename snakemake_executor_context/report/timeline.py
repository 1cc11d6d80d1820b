"""The report's timeline: one row per server, its life in the ledger's buckets (jobs
coloured by rule), aggregated to a bounded number of bars on big fleets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..catalog.reading.ledger import Ledger, ServerAccount
from ..fleet.buckets import BUCKET_HELP, Bucket

__all__ = ["BUCKET_COLORS", "MAX_BARS", "Bar", "bars", "timeline_figure"]

#: Bars the timeline draws at most: beyond, each server's row is cut into equal bins
#: and each bin shows what took most of it (the file stays small, the browser fast).
MAX_BARS = 40_000

#: A colour per bucket (running jobs take their rule's colour instead).
BUCKET_COLORS: dict[Bucket, str] = {
    Bucket.ALLOCATED_BEFORE: "#c7c7c7",
    Bucket.STARTING: "#dbdb8d",
    Bucket.LOADING_CONVERSION: "#8c564b",
    Bucket.LOADING_CACHE: "#c49c94",
    Bucket.LOADING_SOURCE: "#e377c2",
    Bucket.LOADING_PEER: "#f7b6d2",
    Bucket.RUNNING: "#2ca02c",
    Bucket.FAILED: "#ff9896",
    Bucket.IDLE_WARM: "#ffdd71",
    Bucket.IDLE_COLD: "#e8e8e8",
    Bucket.DRAINING: "#9467bd",
    Bucket.LOST: "#d62728",
    Bucket.ALLOCATED_AFTER: "#a5a5a5",
}
_RULE_COLORS = (
    "#1f77b4", "#2ca02c", "#17becf", "#393b79", "#637939", "#3182bd", "#31a354",
    "#6baed6", "#74c476", "#9edae5", "#5254a3", "#8ca252",
)  # fmt: skip


@dataclass(frozen=True)
class Bar:
    """One bar of a server's row: a bucket (and rule) from ``start`` to ``end``."""

    server: str
    start: float
    end: float
    bucket: Bucket
    rule: str
    context: str
    seconds: float
    #: Other buckets the bin held too (aggregated bars), as text.
    note: str = ""


def bars(ledger: Ledger, limit: int = MAX_BARS) -> tuple[list[Bar], float]:
    """The timeline's bars, and the bin width they were aggregated to (0: exact)."""
    exact = [bar for server in ledger.servers for bar in _joined(server)]
    if len(exact) <= limit or not ledger.servers:
        return exact, 0.0
    per_row = max(10, limit // len(ledger.servers))
    width = max(1e-3, (ledger.window.end - ledger.window.start) / per_row)
    return [bar for s in ledger.servers for bar in _binned(s, ledger, width)], width


def _joined(server: ServerAccount) -> list[Bar]:
    """The server's segments in time order, touching ones of one kind joined."""
    out: list[Bar] = []
    for s in sorted(server.segments, key=lambda s: (s.start, s.end)):
        rule = s.rule if s.bucket in (Bucket.RUNNING, Bucket.FAILED, Bucket.LOST) else ""
        last = out[-1] if out else None
        if (
            last is not None
            and last.bucket == s.bucket
            and last.rule == rule
            and s.start - last.end < 1e-3
        ):
            out[-1] = Bar(
                server.name,
                last.start,
                max(last.end, s.end),
                s.bucket,
                rule,
                last.context if last.context == s.context else "(several)",
                last.seconds + s.seconds,
            )
        else:
            out.append(Bar(server.name, s.start, s.end, s.bucket, rule, s.context, s.seconds))
    return out


def _binned(server: ServerAccount, ledger: Ledger, width: float) -> list[Bar]:
    """The server's row in bins of ``width``: each bin shows what took most of it."""
    start = ledger.window.start
    bins: dict[int, dict[tuple[Bucket, str], float]] = {}
    for s in server.segments:
        rule = s.rule if s.bucket in (Bucket.RUNNING, Bucket.FAILED, Bucket.LOST) else ""
        first, final = int((s.start - start) / width), int((s.end - start) / width)
        for index in range(first, final + 1):
            low, high = max(s.start, start + index * width), min(s.end, start + (index + 1) * width)
            if high > low:
                share = s.seconds * (high - low) / max(1e-9, s.end - s.start)
                cell = bins.setdefault(index, {})
                cell[(s.bucket, rule)] = cell.get((s.bucket, rule), 0.0) + share
    out: list[Bar] = []
    for index in sorted(bins):
        cell = bins[index]
        (bucket, rule), _ = max(cell.items(), key=lambda kv: kv[1])
        low = start + index * width
        note = ", ".join(f"{b.value}{' ' + r if r else ''} {v:.1f} s" for (b, r), v in cell.items())
        seconds = sum(cell.values())
        prior = out[-1] if out else None
        if prior is not None and prior.bucket == bucket and prior.rule == rule and prior.end >= low:
            out[-1] = Bar(
                server.name,
                prior.start,
                low + width,
                bucket,
                rule,
                "",
                prior.seconds + seconds,
                "",
            )
        else:
            out.append(Bar(server.name, low, low + width, bucket, rule, "", seconds, note))
    return out


def _color(bar: Bar, rules: dict[str, str]) -> str:
    if bar.bucket == Bucket.RUNNING and bar.rule:
        return rules.setdefault(bar.rule, _RULE_COLORS[len(rules) % len(_RULE_COLORS)])
    return BUCKET_COLORS[bar.bucket]


def timeline_figure(ledger: Ledger, shown: list[Bar], width: float) -> Any:
    """The timeline as a Bokeh figure (named ``timeline``: one y factor per server)."""
    import numpy as np
    from bokeh.models import ColumnDataSource, FactorRange, HoverTool
    from bokeh.plotting import figure

    names = [server.name for server in ledger.servers]
    rules: dict[str, str] = {}
    source = ColumnDataSource(
        {
            "y": [bar.server for bar in shown],
            "left": np.array([bar.start * 1000 for bar in shown]),
            "right": np.array([bar.end * 1000 for bar in shown]),
            "color": [_color(bar, rules) for bar in shown],
            "bucket": [bar.bucket.value for bar in shown],
            "what": [BUCKET_HELP[bar.bucket] for bar in shown],
            "rule": [bar.rule for bar in shown],
            "context": [bar.context for bar in shown],
            "seconds": np.array([round(bar.seconds, 3) for bar in shown]),
            "note": [bar.note for bar in shown],
            "hatch": ["x" if bar.bucket == Bucket.LOST else " " for bar in shown],
        }
    )
    height = min(4000, 90 + 16 * max(1, len(names)))
    fig = figure(
        name="timeline",
        title="Each server's life: loads by kind, jobs coloured by rule, idle, drain, "
        "losses (crossed), pilots' batch allocation (grey)"
        + (f"; aggregated to {width:.1f} s bins" if width else ""),
        y_range=FactorRange(factors=list(reversed(names))),
        x_axis_type="datetime",
        height=height,
        sizing_mode="stretch_width",
        tools="xpan,xwheel_zoom,box_zoom,reset,save",
        active_scroll="xwheel_zoom",
        output_backend="canvas",
    )
    fig.hbar(
        y="y",
        left="left",
        right="right",
        height=0.8,
        color="color",
        hatch_pattern="hatch",
        hatch_color="#ffffff",
        source=source,
    )
    fig.add_tools(
        HoverTool(
            tooltips=[
                ("server", "@y"),
                ("bucket", "@bucket: @what"),
                ("rule", "@rule"),
                ("context", "@context"),
                ("seconds", "@seconds"),
                ("", "@note"),
            ]
        )
    )
    fig.yaxis.major_label_text_font_size = "9px" if len(names) > 60 else "11px"
    return fig
