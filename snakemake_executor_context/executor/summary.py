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
    """Write ``.snakemake/context/runs/<run_id>.json`` (every server's inventory and
    every job's result) and log what the servers did."""
    inventories = connection.inventories()
    summary = {
        "run_id": run_id,
        "started": started,
        "finished": time.time(),
        "cluster": connection.description,
        "servers": dict(inventories),
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
    return path
