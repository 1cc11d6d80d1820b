"""The report as one self-contained HTML page: Bokeh's JavaScript inlined (no CDN, no
network: it opens offline), the charts, and the ledger's tables as plain HTML."""

from __future__ import annotations

import html
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..catalog.reading.ledger import Ledger
from ..catalog.reading.lives import GroupLives, rough_duration
from ..catalog.reading.reportdata import RunSummary
from ..fleet.buckets import BUCKET_HELP, Bucket
from .charts import batch_figure, fleet_figure, stacked_figure, throughput_figure
from .timeline import BUCKET_COLORS, bars, timeline_figure

__all__ = ["ReportData", "compare_page", "report_page"]

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border-bottom: 1px solid #ddd; padding: 2px 8px; text-align: right; }
th:first-child, td:first-child, td.text { text-align: left; }
.swatch { display: inline-block; width: 0.9em; height: 0.9em; margin-right: 4px; }
.notice { background: #fff3cd; border: 1px solid #e0c36a; padding: 0.6em; }
.muted { color: #777; font-size: 0.85em; }
"""


@dataclass
class ReportData:
    """What one report shows (all read from the catalog)."""

    catalog: str
    ledger: Ledger
    runs: list[RunSummary]
    throughput: tuple[float, list[int]]
    fleet: list[tuple[float, int, int]]
    batches: dict[int, int]
    placements: dict[str, int]
    pool: dict[str, Any] | None
    notices: list[str] = field(default_factory=list)


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], css: str = "") -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join(
        f'<tr class="{css}">' + "".join(_cell(c) for c in row) + "</tr>" if css else "<tr>"
        + "".join(_cell(c) for c in row) + "</tr>"
        for row in rows
    )  # fmt: skip
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"<td>{value:,.1f}</td>"
    if isinstance(value, int):
        return f"<td>{value:,}</td>"
    return f'<td class="text">{value}</td>'


def _bucket_label(bucket: Bucket) -> str:
    return f'<span class="swatch" style="background:{BUCKET_COLORS[bucket]}"></span>{bucket.value}'


def ledger_table(totals: Mapping[Bucket, float]) -> str:
    """Bucket, what it means, GPU-seconds, GPU-hours and share of the whole."""
    whole = sum(totals.values()) or 1.0
    rows = [
        (_bucket_label(b), html.escape(BUCKET_HELP[b]), s, s / 3600, f"{100 * s / whole:.1f}%")
        for b, s in totals.items()
    ]
    rows.append(("<b>all</b>", "", sum(totals.values()), sum(totals.values()) / 3600, "100%"))
    return _table(["bucket", "what", "GPU-seconds", "GPU-hours", "share"], rows)


def _breakdown(sums: Mapping[str, Mapping[Bucket, float]], what: str) -> str:
    shown = [b for b in Bucket if any(b in row for row in sums.values())]
    rows = [
        (html.escape(key or "(none)"), *(row.get(b, 0.0) for b in shown), sum(row.values()))
        for key, row in sums.items()
    ]
    return _table([what, *(b.value for b in shown), "all"], rows)


def _headline(totals: Mapping[Bucket, float]) -> str:
    whole = sum(totals.values())
    if not whole:
        return "No GPU-second in this window."

    def share(*buckets: Bucket) -> str:
        return f"{100 * sum(totals.get(b, 0.0) for b in buckets) / whole:.1f}%"

    loading = [b for b in Bucket if b.is_loading]
    return (
        f"{whole / 3600:,.2f} GPU-hours: {share(Bucket.RUNNING)} useful work, "
        f"{share(*loading)} loading, {share(Bucket.IDLE_WARM, Bucket.IDLE_COLD)} idle, "
        f"{share(Bucket.LOST)} lost, {share(Bucket.ALLOCATED_BEFORE, Bucket.ALLOCATED_AFTER)} "
        "pilots' allocation around their servers."
    )


def _document(title: str, parts: list[tuple[str, Any]], figures: dict[str, Any]) -> str:
    from bokeh.embed import components
    from bokeh.resources import Resources

    script, divs = components(figures) if figures else ("", {})
    js = Resources(mode="inline", components=["bokeh"]).render_js() if figures else ""
    body = "".join(divs[content] if kind == "figure" else content for kind, content in parts)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style>{js}{script}</head>"
        f"<body>{body}</body></html>\n"
    )


def report_page(data: ReportData) -> str:
    """The report of one run (or time window)."""
    ledger, window = data.ledger, data.ledger.window
    what = f"run {window.run}" if window.run else f"{_when(window.start)} to {_when(window.end)}"
    title = f"GPU ledger: {what}"
    parts: list[tuple[str, Any]] = [
        ("html", f"<h1>{html.escape(title)}</h1>"),
        (
            "html",
            f'<p class="muted">Catalog {html.escape(data.catalog)}; from {_when(window.start)} '
            f"to {_when(window.end)} ({window.end - window.start:,.0f} s"
            f"{', still running' if window.live else ''}); written {_when(time.time())}.</p>",
        ),
    ]
    parts += [("html", f'<p class="notice">{html.escape(n)}</p>') for n in data.notices]
    totals = ledger.totals()
    parts += [("html", f"<p><b>{html.escape(_headline(totals))}</b></p>")]
    if data.runs:
        rows = [
            (
                html.escape(r.run_id),
                _when(r.started),
                "running" if r.finished is None else f"{r.finished - r.started:,.0f} s",
                f"{r.jobs_ok} ok, {r.jobs_failed} failed of {_planned(r.jobs_total)}",
                r.items,
                r.loads,
            )
            for r in data.runs
        ]
        parts.append(("html", _table(["run", "started", "took", "jobs", "items", "loads"], rows)))
    figures: dict[str, Any] = {}
    parts.append(
        ("html", "<h2>The ledger: where every GPU-second went</h2>" + ledger_table(totals))
    )
    if ledger.servers:
        figures["models"] = stacked_figure(
            "models", "GPU-hours by bucket, per GPU model", ledger.by("gpu_model")
        )
        shown, width = bars(ledger)
        figures["timeline"] = timeline_figure(ledger, shown, width)
        figures["throughput"] = throughput_figure(window.start, *data.throughput)
        figures["fleet"] = fleet_figure(data.fleet)
        parts += [("figure", "models"), ("html", "<h2>Timeline</h2>"), ("figure", "timeline")]
        parts += [("html", "<h2>Throughput and fleet size</h2>"), ("figure", "throughput")]
        parts += [("figure", "fleet")]
    parts.append(("html", "<h2>Forward batches</h2>"))
    if data.batches:
        figures["batches"] = batch_figure(data.batches)
        parts.append(("figure", "batches"))
    else:
        parts.append(("html", "<p>No job led a batched call (forward batch) here.</p>"))
    parts.append(("html", "<h2>Placement decisions</h2>"))
    parts.append(("html", _placements(data.placements)))
    if data.pool is not None:
        parts.append(("html", "<h2>The pool's books</h2>" + _pool(data.pool)))
    if ledger.lives:
        parts.append(("html", "<h2>Server lives: predicted and actual</h2>" + _lives(ledger.lives)))
    for key, label in (("rule", "rule"), ("context", "context"), ("run", "run")):
        parts.append(
            ("html", f"<h2>GPU-seconds by {label}</h2>" + _breakdown(ledger.by(key), label))
        )
    parts.append(("html", "<h2>Servers</h2>" + _servers(ledger)))
    return _document(title, parts, figures)


def _planned(total: int | None) -> str:
    return "?" if total is None else str(total)


def _placements(counts: Mapping[str, int]) -> str:
    if not counts:
        return "<p>No attempt was placed in this window.</p>"
    counts = dict(counts)
    cold = counts.pop("cold", 0)
    whole = sum(counts.values())
    rows = [(html.escape(k), v, f"{100 * v / whole:.1f}%") for k, v in counts.items()]
    rows.append(("<i>of them cold (loaded their context)</i>", cold, f"{100 * cold / whole:.1f}%"))
    return _table(["placed by", "attempts", "share"], rows)


def _pool(books: Mapping[str, Any]) -> str:
    keys = ("submitted", "started", "running", "preempted", "crashed", "retired", "unknown")
    rows: list[tuple[str, Any]] = [(k, int(books.get(k, 0))) for k in keys]
    rows += [
        (k.replace("_", " "), float(books.get(k, 0.0)))
        for k in ("pilot_seconds", "busy_seconds", "idle_seconds")
    ]
    return _table(["pilots", ""], rows)


def _lives(rows: Sequence[GroupLives]) -> str:
    """Per survival group: the prediction from the lives that ended before the window,
    and what the window's servers did."""
    header = [
        "group",
        "predicted mean",
        "predicted median",
        "from",
        "servers",
        "died",
        "mean life",
        "outlived the median",
    ]
    body = [
        (
            html.escape(row.group),
            rough_duration(row.predicted_mean),
            rough_duration(row.predicted_median),
            html.escape(row.source if row.source == "prior" else f"{row.source}, {row.history}"),
            row.servers,
            row.deaths,
            (
                rough_duration(row.actual_mean)
                if row.actual_mean is not None
                else f"none died (up to {rough_duration(row.longest)})"
            ),
            "not watched so long" if row.past_median is None else f"{100 * row.past_median:.0f}%",
        )
        for row in rows
    ]
    note = (
        '<p class="muted">A death is a preemption or a crash; a server closed, or alive at '
        "the window's end, is censored. Mean lives are Kaplan-Meier; the prediction says "
        "half the servers outlive its median.</p>"
    )
    return _table(header, body) + note


def _servers(ledger: Ledger) -> str:
    shown = [b for b in Bucket if any(b in s.seconds() for s in ledger.servers)]
    rows = [
        (
            html.escape(s.name),
            html.escape(s.gpu_model),
            s.gpus,
            *(s.seconds().get(b, 0.0) for b in shown),
            s.life,
        )
        for s in ledger.servers
    ]
    header = ["server", "GPU model", "GPUs", *(b.value for b in shown), "life (s)"]
    return _table(header, rows, css="server-row")


def compare_page(catalog: str, ledgers: list[Ledger]) -> str:
    """Two (or more) runs' ledgers side by side."""
    names = [ledger.window.run or _when(ledger.window.start) for ledger in ledgers]
    title = "GPU ledger: " + " against ".join(names)
    sums = {name: ledger.totals() for name, ledger in zip(names, ledgers, strict=True)}
    shown = [b for b in Bucket if any(b in row for row in sums.values())]
    rows = []
    for bucket in shown:
        cells: list[Any] = [_bucket_label(bucket)]
        for name in names:
            whole = sum(sums[name].values()) or 1.0
            seconds = sums[name].get(bucket, 0.0)
            cells += [seconds, f"{100 * seconds / whole:.1f}%"]
        rows.append(cells)
    rows.append(["<b>all</b>", *(x for n in names for x in (sum(sums[n].values()), "100%"))])
    header = ["bucket", *(h for n in names for h in (f"{n} GPU-s", "share"))]
    parts: list[tuple[str, Any]] = [
        (
            "html",
            f"<h1>{html.escape(title)}</h1><p class='muted'>Catalog {html.escape(catalog)}.</p>",
        ),
        ("html", _table(header, rows)),
        ("figure", "runs"),
    ]
    figures = {"runs": stacked_figure("runs", "GPU-hours by bucket, per run", sums)}
    return _document(title, parts, figures)
