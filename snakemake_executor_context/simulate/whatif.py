"""A user's question, made a simulation: the workload (a Snakefile or a spec), the
times (the catalog's where it measured them, the command line's for the rest), the
fleet (``a10:10,titanx:10``), its preemptions (``1/min``, or per partition), and a
table of the same run over other GPU counts. The flags are read by :mod:`.bounds`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..fleet.buckets import Bucket
from ..fleet.loads import LoadKind
from .engine import Simulation
from .model import ANY_MODEL, Fleet, JobTimes, Options, Preemption, ServerKind, Storage
from .result import SimResult
from .workload import Workload

__all__ = ["Scenario", "least_makespan", "missing_times", "over_counts", "scaled", "table"]


@dataclass
class Scenario:
    """Everything one simulation is told."""

    workload: Workload
    times: JobTimes
    fleet: Fleet
    storage: Storage
    preemption: Preemption
    options: Options

    def run(self, fleet: Fleet | None = None) -> SimResult:
        """Simulate it (on another fleet, when given)."""
        return Simulation(
            self.workload,
            fleet or self.fleet,
            self.times,
            storage=self.storage,
            preemption=self.preemption,
            options=self.options,
        ).run()


def missing_times(
    workload: Workload, times: JobTimes, kinds: Sequence[ServerKind], mode: str
) -> list[str]:
    """What the simulation would need and is not told, each with the flag for it."""
    needs: list[str] = []
    models = sorted({kind.gpu_model for kind in kinds})
    for rule in workload.rules("context"):
        lacking = [m for m in models if times.per_item(rule, m) is None]
        if lacking:
            measured = sorted({m for (r, m) in times.item if r == rule and m != ANY_MODEL})
            note = f" (measured on {', '.join(measured)} only)" if measured else ""
            example = f"{rule}@{lacking[0]}=S" if measured else f"{rule}=S"
            needs.append(
                f"seconds per item of rule '{rule}' on {', '.join(lacking)}{note} "
                f"(--item-seconds {example})"
            )
    used = {job.context for job in workload.jobs if job.kind == "context"}
    for name in sorted(n for n in used if n):
        model = workload.contexts[name]
        first = LoadKind.CONVERSION if model.converts else LoadKind.SOURCE
        wanted = [first] + ([LoadKind.CACHE] if mode == "partial" and model.caches else [])
        for kind in wanted:
            if model.fixed(kind) is None:
                needs.append(
                    f"seconds of a load of context '{name}' from its {kind} "
                    f"(--load-seconds {name}:{kind}=S)"
                )
    return needs


def scaled(kinds: Sequence[ServerKind], total: int) -> list[ServerKind]:
    """The same mix of GPU models, ``total`` servers (largest remainders)."""
    have = sum(kind.count for kind in kinds)
    shares = [kind.count * total / have for kind in kinds]
    counts = [math.floor(s) for s in shares]
    for index in sorted(range(len(kinds)), key=lambda i: counts[i] - shares[i])[
        : total - sum(counts)
    ]:
        counts[index] += 1
    return [replace(kind, count=n) for kind, n in zip(kinds, counts, strict=True) if n > 0]


def least_makespan(workload: Workload, times: JobTimes, kinds: Sequence[ServerKind]) -> float:
    """A bound below the makespan of the context jobs on these servers, loads and
    waits left out: the longest job on the fastest GPU model, or all of them spread
    over every slot at its best gain, whichever is longer (a run whose bound exceeds
    the simulation's limit is refused before it is simulated)."""
    models = {kind.gpu_model for kind in kinds}
    slots = max((kind.slots for kind in kinds), default=1)
    gains = [g for k, g in times.slot_gain.items() if k <= slots]
    fleet_rate = sum(kind.count for kind in kinds) * max([1.0, *gains])
    job_rate = max([1.0, *(g / k for k, g in times.slot_gain.items() if k <= slots)])
    longest = total = 0.0
    for job in workload.jobs:
        if job.kind != "context":
            continue
        known = [times.seconds(job.rule, m, job.items) for m in models]
        seconds = min((s for s in known if s is not None), default=0.0)
        longest, total = max(longest, seconds), total + seconds
    return max(longest / job_rate, total / max(1.0, fleet_rate))


def over_counts(scenario: Scenario, totals: Sequence[int]) -> list[tuple[int, SimResult | None]]:
    """The scenario on fleets of other sizes (the same mix of GPU models); None for
    a size on which the run cannot end within the simulation's limit."""
    out: list[tuple[int, SimResult | None]] = []
    for total in totals:
        fleet = replace(scenario.fleet, kinds=scaled(scenario.fleet.kinds, max(1, total)))
        if fleet.pool is not None:
            fleet = replace(fleet, pool=replace(fleet.pool, maximum=total))
        bound = least_makespan(scenario.workload, scenario.times, fleet.kinds)
        if bound > scenario.options.limit:
            out.append((total, None))
            continue
        result = scenario.run(fleet)
        out.append((total, result if result.ended else None))
    return out


def table(rows: Sequence[tuple[int, SimResult | None]]) -> str:
    """The table over GPU counts."""
    useful = Bucket.RUNNING
    lines = ["GPUs  makespan       GPU-hours  useful  loads  lost attempts"]
    for total, result in rows:
        if result is None:
            lines.append(f"{total:>4}  does not end within the simulated span")
            continue
        hours = result.ledger.total / 3600
        share = result.ledger.buckets.get(useful, 0.0) / max(1e-9, result.ledger.total)
        lines.append(
            f"{total:>4}  {result.makespan:>10,.0f} s  {hours:>9.2f}  {100 * share:5.1f}%"
            f"  {sum(result.loads.values()):>5}  {result.attempts_lost:>13}"
        )
    return "\n".join(lines)
