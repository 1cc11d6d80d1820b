"""A user's question, made a simulation: the workload (a Snakefile or a spec), the
times (the catalog's where it measured them, the command line's for the rest), the
fleet (``a10:10,titanx:10``), its preemptions (``1/min``, or per partition), and a
table of the same run over other GPU counts.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from ..errors import ContextExecutorError
from .buckets import Bucket, LoadKind
from .engine import simulate
from .model import ANY_MODEL, Fleet, JobTimes, Options, Preemption, ServerKind, Storage
from .result import SimResult
from .workload import Workload

__all__ = [
    "Scenario",
    "missing_times",
    "over_counts",
    "parse_gpus",
    "parse_pairs",
    "parse_rates",
    "scaled",
]

_UNITS = {"s": 1.0, "sec": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0, "hour": 3600.0}


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
        return simulate(
            self.workload,
            fleet or self.fleet,
            self.times,
            storage=self.storage,
            preemption=self.preemption,
            options=self.options,
        )


def parse_rate(text: str, what: str) -> float:
    """Preemptions per second from '1/min', '0.5/s', '2/h' (or 0, 'none')."""
    text = text.strip().lower()
    if text in ("0", "none", "off"):
        return 0.0
    found = re.fullmatch(r"([0-9.]+(?:e-?[0-9]+)?)\s*/\s*([a-z]+)", text)
    if not found or found.group(2) not in _UNITS:
        raise ContextExecutorError(
            f"{what}: {text!r} is not a rate. Fix: give a count per unit, like 1/min, 0.5/s or 2/h."
        )
    return float(found.group(1)) / _UNITS[found.group(2)]


def parse_rates(text: str) -> dict[str, float]:
    """'1/min' (the whole fleet) or 'a10:1/min,titanx:2/h' (per partition)."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        where, _, rate = part.rpartition(":")
        out[where or "*"] = parse_rate(rate, f"--preempt {part}")
    return out


def parse_gpus(text: str, slots: int = 1, budget: int = 0) -> list[ServerKind]:
    """'a10:10,titanx:10' as kinds of servers (a model's count after its colon)."""
    kinds = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        model, _, count = part.rpartition(":")
        if not model or not count.isdigit() or int(count) < 1:
            raise ContextExecutorError(
                f"--gpus {part!r}: expected MODEL:COUNT, like a10:10. Fix: --gpus "
                "a10:10,titanx:10 (cpu:2 for CPU servers)."
            )
        kinds.append(ServerKind(model.lower(), int(count), slots, budget))
    if not kinds:
        raise ContextExecutorError("--gpus names no servers. Fix: --gpus a10:10,titanx:10.")
    return kinds


def parse_pairs(values: Iterable[str], flag: str) -> dict[str, str]:
    """'KEY=VALUE' flags as a mapping (a bad one named in one line)."""
    out = {}
    for value in values:
        key, sep, text = value.partition("=")
        if not sep or not key or not text:
            raise ContextExecutorError(f"{flag} {value!r}: expected KEY=VALUE.")
        out[key.strip()] = text.strip()
    return out


def number(text: str, flag: str) -> float:
    """A non-negative number, or one clear line."""
    try:
        value = float(text)
    except ValueError:
        raise ContextExecutorError(f"{flag}: {text!r} is not a number.") from None
    if value < 0 or math.isnan(value):
        raise ContextExecutorError(f"{flag}: {text!r} must not be negative.")
    return value


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


def over_counts(scenario: Scenario, totals: Sequence[int]) -> list[tuple[int, SimResult]]:
    """The scenario on fleets of other sizes (the same mix of GPU models)."""
    out = []
    for total in totals:
        fleet = replace(scenario.fleet, kinds=scaled(scenario.fleet.kinds, max(1, total)))
        if fleet.pool is not None:
            fleet = replace(fleet, pool=replace(fleet.pool, maximum=total))
        out.append((total, scenario.run(fleet)))
    return out


def table(rows: Sequence[tuple[int, SimResult]]) -> str:
    """The table over GPU counts."""
    useful = Bucket.RUNNING
    lines = ["GPUs  makespan       GPU-hours  useful  loads  lost attempts"]
    for total, result in rows:
        hours = result.ledger.total / 3600
        share = result.ledger.buckets.get(useful, 0.0) / max(1e-9, result.ledger.total)
        lines.append(
            f"{total:>4}  {result.makespan:>10,.0f} s  {hours:>9.2f}  {100 * share:5.1f}%"
            f"  {sum(result.loads.values()):>5}  {result.attempts_lost:>13}"
        )
    return "\n".join(lines)
