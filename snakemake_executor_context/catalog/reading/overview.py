"""The catalog's overview (:func:`.status.overview`) as the text that
``snakemake-context status`` prints."""

from __future__ import annotations

import time
from typing import Any

from ...terminal import format_bytes, shown, shown_values
from .lives import rough_duration

__all__ = ["format_overview"]


def _when(at: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if at else "-"


def _size(nbytes: float | None) -> str:
    return format_bytes(nbytes) if nbytes else "?"


#: How ``status`` names each load kind (:data:`.status.KIND_ORDER`).
KIND_TEXT = {
    "source": "from the source",
    "cache": "from the local cache",
    "peer": "from peers",
    "conversion": "by conversion",
}


def _how_got(kinds: dict[str, int], fetched: dict[str, Any] | None) -> str:
    """How a context's placements got it: loads by kind, and its transfers."""
    parts = [f"{n} {KIND_TEXT.get(kind, kind)}" for kind, n in kinds.items()]
    text = f"loads: {', '.join(parts)}" if parts else ""
    if fetched:
        failed = f", {fetched['failed']} ended early" if fetched["failed"] else ""
        text += (
            f"{'; ' if text else ''}transfers: {fetched['transfers']} from peers, "
            f"{_size(fetched['bytes'])} in {fetched['seconds']:.1f} s{failed}"
        )
    return text


def format_overview(catalog: str, report: dict[str, Any]) -> str:
    """The catalog part of ``snakemake-context status`` as text (from
    :func:`.status.overview`), every value read from the catalog shown escaped
    (:func:`...terminal.shown`: a name or wildcard holding an ESC sequence reaches no
    terminal)."""
    report = shown_values(report)
    lines = [f"Catalog {shown(catalog)}", "", "Fleet by GPU model:"]
    for row in report["fleet"]:
        kind = row["gpu_name"] or row["gpu_model"]
        extra = []
        if row["gpu_memory_bytes"]:
            extra.append(_size(row["gpu_memory_bytes"]))
        if row["compute_capability"]:
            extra.append(f"compute {row['compute_capability']}")
        names = ", ".join(row["names"])
        lines.append(
            f"  {row['gpu_model']:<16} {row['servers']} server(s), {row['slots']} slot(s)"
            f" ({kind}{'; ' + ', '.join(extra) if extra else ''})"
            f"{': ' + names if names else ''}; {row['left']} left, {row['lost']} lost"
        )
    if report.get("nodes"):
        lines += ["", "Servers by node:"]
        for row in report["nodes"]:
            lines.append(
                f"  {row['host'] or '?'}: {len(row['servers'])} server(s), {row['slots']} "
                f"slot(s) ({', '.join(row['gpu_models'])}): {', '.join(row['servers'])}"
            )
    if report.get("lives"):
        lines += ["", "Servers alive, expected life left (from the lives the catalog saw):"]
        for row in report["lives"]:
            group = f"group {row['group']}, " if row["group"] else ""
            lines.append(
                f"  {row['name']} {row['address']} ({group}{row['gpu_model']}), "
                f"{rough_duration(row['age'])} old: {row['text']}"
            )
    lines += ["", "Contexts:"]
    fetched = {row["identity"]: row for row in report.get("transfers", [])}
    for row in report["contexts"]:
        warm = ", ".join(row["warm_on"]) or "nowhere"
        loading = f" (loading on {', '.join(row['loading_on'])})" if row["loading_on"] else ""
        mean = row["mean_load_seconds"]
        lines.append(
            f"  {row['name']} [{row['identity'][:10]}] {row['loader']}, {_size(row['bytes'])}: "
            f"warm on {warm}{loading}; {row['loads']} load(s)"
            + (f", {mean:.1f} s on average" if mean is not None else "")
            + (f", {row['from_cache']} from the local cache" if row["from_cache"] else "")
        )
        got = _how_got(row.get("kinds") or {}, fetched.get(row["identity"]))
        if got:
            lines.append(f"    {got}")
    if report.get("gangs"):
        lines += ["", "Gangs (contexts spanning several processes, one rank per device):"]
        for row in report["gangs"]:
            nodes = sorted(set(row["nodes"]))
            lines.append(
                f"  {row['context']} on {row['server']}: {row['ranks']} ranks ({row['state']}, "
                f"{row['backend']}) on {', '.join(row['devices'])}; node"
                f"{'s' if len(nodes) > 1 else ''} {', '.join(nodes)}; pids "
                + ", ".join(str(p) for p in row["pids"])
                + (f"; shards {', '.join(_size(b) for b in row['bytes'])}" if row["bytes"] else "")
            )
    if report["throughput"]:
        lines += ["", "Throughput (successful jobs, loads excluded):"]
        for row in report["throughput"]:
            rate = row["items_per_second"]
            lines.append(
                f"  {row['context']} on {row['gpu_model']}: {row['jobs']} job(s), "
                f"{row['mean_job_seconds']:.2f} s per job"
                + (f", {rate:.1f} items/s" if rate else "")
            )
    lines += ["", "Runs:"]
    for row in report["runs"]:
        total = f"/{row['jobs_total']}" if row["jobs_total"] is not None else ""
        lines.append(
            f"  {row['run_id']} {row['state']:<8} {row['jobs_ok']}{total} ok, "
            f"{row['jobs_failed']} failed, {row['items']} item(s), {row['loads']} load(s); "
            f"started {_when(row['started'])} in {row['workdir']}"
        )
    lines += ["", "Recent server losses:"]
    for row in report["losses"] or []:
        lines.append(
            f"  {_when(row['at'])} {row['server']} ({row['gpu_model']}): {row['jobs_lost']} "
            f"job(s) hit, {row['seconds_lost']:.1f} s of work lost ({row['reason']}): "
            + ", ".join(row["jobs"])
        )
    if not report["losses"]:
        lines.append("  none")
    lines += ["", "Recent jobs:"]
    for row in report["jobs"]:
        wildcards = ",".join(f"{k}={v}" for k, v in row["wildcards"].items())
        seconds = (
            f"{row['finished'] - row['started']:.1f} s"
            if row["finished"] is not None and row["started"] is not None
            else "running"
        )
        lines.append(
            f"  {_when(row['dispatched'] or row['started'])} {row['rule'] or '?'}"
            f"{'(' + wildcards + ')' if wildcards else ''} on {row['server'] or '?'}: "
            f"{row['outcome'] or 'running'}, {seconds}"
            + (" (loaded its context)" if row["cold"] else "")
            + (f" [placed: {row['placed_by']}]" if row["placed_by"] else "")
        )
    return "\n".join(lines)
