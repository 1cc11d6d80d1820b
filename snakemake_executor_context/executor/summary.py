"""The run summary: a JSON file per run under the workflow's context directory, and
one line on Snakemake's console."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import paths
from ..defaults import CONTEXT_DIR

if TYPE_CHECKING:
    from ..cluster.connection import ClusterConnection
    from ..fleet.outcome import Outcome

__all__ = [
    "LoadTally",
    "batch_histogram",
    "describe_batches",
    "summary_entry",
    "write_summary",
]


class LoadTally:
    """Context loads seen during the run by server, so that the closing summary
    counts those of servers lost meanwhile (whose inventories died with them)."""

    def __init__(self) -> None:
        self._by_address: dict[str, int] = {}
        self.lost = 0

    def see(self, events: Sequence[Any]) -> None:
        """Fold in a batch of the fleet's events."""
        from ..fleet import events as ev

        for event in events:
            if isinstance(event, ev.ContextReady):
                self._by_address[event.address] = self._by_address.get(event.address, 0) + 1
            elif isinstance(event, ev.ServerLeft):
                self.lost += self._by_address.pop(event.address, 0)


def summary_entry(
    outcome: Outcome,
    extra: Mapping[str, Any],
    *,
    placed_by: str,
    submitted: float,
    reported: float,
) -> dict[str, Any]:
    """One job of the run summary, from its outcome and what its server said beside
    (``extra``: warnings, batches)."""
    return {
        "key": outcome.key,
        "ok": outcome.ok,
        "server": outcome.server.name,
        "address": outcome.server.address,
        "placed_by": placed_by,
        "pid": outcome.server.pid,
        "started": outcome.started,
        "finished": outcome.finished,
        "items": outcome.items,
        "load_seconds": outcome.load_seconds,
        "loaded": list(outcome.loaded),
        "reused": list(outcome.reused),
        "reported": reported,
        "submitted": submitted,
        # What the server warns about the job (threads or files it left behind).
        "warnings": list(extra.get("warnings", ())),
        # Calls of batched functions the job led, by size (batching across jobs).
        "batches": dict(extra.get("batches", {})),
    }


def write_summary(
    workdir: str,
    run_id: str,
    started: float,
    connection: ClusterConnection,
    jobs: Sequence[Mapping[str, Any]],
    say: Callable[[str], None],
    lost_loads: int = 0,
) -> Path:
    """Write ``.snakemake/context/runs/<run_id>.json`` (every server's inventory,
    its busy and idle time, and every job's result) and log what the servers did."""
    inventories = connection.inventories()
    use = server_use(jobs)
    batches = batch_histogram(jobs)
    summary = {
        "run_id": run_id,
        "started": started,
        "finished": time.time(),
        "cluster": connection.description,
        "servers": {address: inv.to_wire() for address, inv in inventories.items()},
        "server_use": use,
        "jobs": list(jobs),
        "loads_on_lost_servers": lost_loads,
        "forward_batches": batches,
    }
    path = paths.output_directory(Path(workdir) / CONTEXT_DIR / "runs") / f"{run_id}.json"
    paths.write_output(path, json.dumps(summary, indent=1, default=str))
    loads = sum(inv.counts.loads for inv in inventories.values()) + lost_loads
    context_jobs = sum(1 for job in jobs if job.get("loaded") or job.get("reused"))
    if context_jobs:
        lost = f", {lost_loads} of them on servers lost meanwhile" if lost_loads else ""
        say(
            f"Context servers ran {context_jobs} context job(s) with {loads} context "
            f"load(s) in this cluster's lifetime{lost}; summary: {path}"
        )
    if batches["all"]:
        say(f"  {describe_batches(batches['all'])}")
    for name, row in use.items():
        say(
            f"  {name}: {row['jobs']} job(s), busy {row['busy']:.1f} s, idle {row['idle']:.1f} s "
            f"({100 * row['busy_fraction']:.0f}% of the {row['span']:.1f} s from the first "
            "job's start to the last one's end)"
        )
    return path


def batch_histogram(jobs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Calls of batched functions (forward batches) by size, over the run (``all``) and
    per server (``by_server``, by name): each counted once, in the job that led it."""
    total: dict[int, int] = {}
    by_server: dict[str, dict[int, int]] = {}
    for job in jobs:
        for size, calls in (job.get("batches") or {}).items():
            server = by_server.setdefault(str(job.get("server") or job.get("address")), {})
            for histogram in (total, server):
                histogram[int(size)] = histogram.get(int(size), 0) + int(calls)
    return {
        "all": dict(sorted(total.items())),
        "by_server": {name: dict(sorted(h.items())) for name, h in sorted(by_server.items())},
    }


def describe_batches(histogram: Mapping[int, int]) -> str:
    """``forward batches: 1 x 12, 4 x 30 (mean 3.6 items per call)``: size x calls."""
    calls = sum(histogram.values())
    items = sum(size * n for size, n in histogram.items())
    parts = ", ".join(f"{size} x {n}" for size, n in sorted(histogram.items()))
    mean = items / calls if calls else 0.0
    return f"forward batches: {parts} (mean {mean:.1f} items per call)"


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
