"""What the run asks of a pool of pilots, published for the cluster process.

A pool on a batch system (:mod:`..cluster.pool`) sizes itself from this, not from
Dask's task count: with affinity placement the executor holds jobs back until a server
is free, so without pilots the scheduler would see no work at all. Read from
dispatch's queue and attempts (a read-only view kept beside dispatch), published in
the scheduler's metadata at each fleet check.
"""

from __future__ import annotations

from collections import Counter
from statistics import mean
from typing import Any

from .dispatch import Dispatch

__all__ = ["DEMAND_KEY", "pool_demand"]

#: Where the pool reads it (kept equal to ``cluster.pool.DEMAND_KEY``).
DEMAND_KEY = ["snakemake-context", "demand"]


def pool_demand(dispatch: Dispatch) -> dict[str, Any]:
    """Jobs ready (queued and running) and still to come, per GPU model too, and the
    measured job and load times (0 when unmeasured)."""
    queued = [job.ticket for job in dispatch._queue if not job.cancelled]
    running = [attempt.job.ticket for attempt in dispatch._attempts.values()]
    tickets = queued + running
    by_model = Counter(t.requirements.gpu_model for t in queued if t.requirements.gpu_model)
    to_come = dispatch.demand.counts(t.identity for t in tickets if t.identity)
    remaining = max(len(tickets), sum(to_come.values()))
    measured = dispatch.fleet.measure
    jobs = [m.value for m in measured.job.values()]
    loads = [m.value for m in measured.load.values()]
    return {
        "ready": len(tickets),
        "remaining": remaining,
        "by_gpu_model": dict(by_model),
        "job_seconds": mean(jobs) if jobs else 0.0,
        "load_seconds": mean(loads) if loads else 0.0,
    }
