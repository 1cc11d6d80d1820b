"""The report's charts besides the timeline (Bokeh figures): throughput and the fleet's
size over time, GPU-seconds by bucket per GPU model (or per run, to compare), the
forward-batch histogram."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..fleet.buckets import Bucket
from .timeline import BUCKET_COLORS

__all__ = ["batch_figure", "fleet_figure", "stacked_figure", "throughput_figure"]


def throughput_figure(start: float, width: float, counts: list[int]) -> Any:
    """Jobs that ended ok per minute, over the window."""
    from bokeh.models import HoverTool
    from bokeh.plotting import figure

    fig = figure(
        name="throughput",
        title="Throughput: jobs ended ok per minute",
        x_axis_type="datetime",
        height=220,
        sizing_mode="stretch_width",
        tools="xpan,xwheel_zoom,reset,save",
    )
    per_minute = [c * 60.0 / width for c in counts]
    lefts = [(start + i * width) * 1000 for i in range(len(counts))]
    fig.vbar(
        x=[x + width * 500 for x in lefts],
        top=per_minute,
        width=width * 1000 * 0.9,
        color="#2ca02c",
    )
    fig.add_tools(HoverTool(tooltips=[("jobs/min", "@top{0.0}")]))
    fig.yaxis.axis_label = "jobs/min"
    return fig


def fleet_figure(steps: list[tuple[float, int, int]]) -> Any:
    """Servers and GPUs in the fleet over time (steps)."""
    from bokeh.plotting import figure

    fig = figure(
        name="fleet",
        title="Fleet size: servers and GPUs",
        x_axis_type="datetime",
        height=200,
        sizing_mode="stretch_width",
        tools="xpan,xwheel_zoom,reset,save",
    )
    times = [t * 1000 for t, _, _ in steps]
    fig.step(times, [s for _, s, _ in steps], mode="after", legend_label="servers", line_width=2)
    fig.step(
        times,
        [g for _, _, g in steps],
        mode="after",
        legend_label="GPUs",
        line_width=2,
        line_dash="dashed",
        color="#ff7f0e",
    )
    fig.legend.location = "top_left"
    return fig


def stacked_figure(name: str, title: str, sums: Mapping[str, Mapping[Bucket, float]]) -> Any:
    """GPU-hours by bucket, one stacked bar per key (GPU model, or run)."""
    from bokeh.models import ColumnDataSource, FactorRange, HoverTool
    from bokeh.plotting import figure

    keys = list(sums) or ["(none)"]
    buckets = [b for b in Bucket if any(b in row for row in sums.values())]
    data: dict[str, list[Any]] = {"key": keys}
    for bucket in buckets:
        data[bucket.value] = [sums.get(k, {}).get(bucket, 0.0) / 3600.0 for k in keys]
    fig = figure(
        name=name,
        title=title,
        x_range=FactorRange(factors=keys),
        height=300,
        sizing_mode="stretch_width",
        tools="save",
    )
    if buckets:
        fig.vbar_stack(
            [b.value for b in buckets],
            x="key",
            width=0.7,
            color=[BUCKET_COLORS[b] for b in buckets],
            source=ColumnDataSource(data),
            legend_label=[b.value for b in buckets],
        )
        fig.add_tools(HoverTool(tooltips=[("", "$name: @$name{0.000} GPU-h")]))
        fig.legend.location = "top_right"
        fig.legend.label_text_font_size = "9px"
    fig.yaxis.axis_label = "GPU-hours"
    return fig


def batch_figure(histogram: Mapping[int, int]) -> Any:
    """Calls of batched functions (forward batches) by size."""
    from bokeh.models import FactorRange
    from bokeh.plotting import figure

    sizes = [str(size) for size in histogram] or ["(none)"]
    fig = figure(
        name="batches",
        title="Forward batches: calls by batch size",
        x_range=FactorRange(factors=sizes),
        height=220,
        sizing_mode="stretch_width",
        tools="save",
    )
    fig.vbar(x=sizes, top=list(histogram.values()) or [0], width=0.7, color="#1f77b4")
    fig.xaxis.axis_label = "items per call"
    fig.yaxis.axis_label = "calls"
    return fig
