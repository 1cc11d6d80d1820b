"""The run summary: a JSON file per run under the workflow's context directory, and
one line on Snakemake's console."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..defaults import CONTEXT_DIR

if TYPE_CHECKING:
    from ..cluster.connection import ClusterConnection

__all__ = ["write_summary"]


def write_summary(
    workdir: str,
    run_id: str,
    started: float,
    connection: ClusterConnection,
    jobs: Sequence[Mapping[str, Any]],
    say: Callable[[str], None],
) -> Path:
    """Write ``.snakemake/context/runs/<run_id>.json`` (every server's inventory,
    its busy and idle time, and every job's result) and log what the servers did."""
    inventories = connection.inventories()
    use = server_use(jobs)
    summary = {
        "run_id": run_id,
        "started": started,
        "finished": time.time(),
        "cluster": connection.description,
        "servers": dict(inventories),
        "server_use": use,
        "jobs": list(jobs),
    }
    path = Path(workdir) / CONTEXT_DIR / "runs" / f"{run_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=1, default=str))
    loads = sum(inv.get("loads", 0) for inv in inventories.values())
    context_jobs = sum(1 for job in jobs if job.get("loaded") or job.get("reused"))
    if context_jobs:
        say(
            f"Context servers ran {context_jobs} context job(s) with {loads} context "
            f"load(s) in this cluster's lifetime; summary: {path}"
        )
    for name, row in use.items():
        say(
            f"  {name}: {row['jobs']} job(s), busy {row['busy']:.1f} s, idle {row['idle']:.1f} s "
            f"({100 * row['busy_fraction']:.0f}% of the {row['span']:.1f} s from the first "
            "job's start to the last one's end)"
        )
    return path


def server_use(jobs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Per server (by name): jobs run, and busy and idle seconds over the span from the
    run's first job start to its last job end (loads count as busy)."""
    timed = [j for j in jobs if j.get("started") and j.get("finished")]
    if not timed:
        return {}
    first = min(float(j["started"]) for j in timed)
    span = max(float(j["finished"]) for j in timed) - first
    use: dict[str, dict[str, float]] = {}
    for job in timed:
        row = use.setdefault(str(job.get("server") or job.get("address")), {"jobs": 0, "busy": 0.0})
        row["jobs"] += 1
        row["busy"] += max(0.0, float(job["finished"]) - float(job["started"]))
    for row in use.values():
        row["span"] = span
        row["idle"] = max(0.0, span - row["busy"])
        row["busy_fraction"] = min(1.0, row["busy"] / span) if span > 0 else 1.0
    return dict(sorted(use.items()))
