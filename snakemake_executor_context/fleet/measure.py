"""Measured job and load seconds, by context identity and GPU model.

Running means, seeded from the catalog's history when a run starts and updated from
jobs' results and the fleet's events.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MEAN_WINDOW", "Mean", "Measurements"]

#: A running mean forgets older samples beyond this many (times drift).
MEAN_WINDOW = 50


@dataclass
class Mean:
    """A running mean over the last :data:`MEAN_WINDOW` samples (roughly)."""

    value: float = 0.0
    count: int = 0

    def add(self, sample: float) -> None:
        """Fold one sample in."""
        self.count += 1
        self.value += (sample - self.value) / min(self.count, MEAN_WINDOW)


@dataclass
class Measurements:
    """Measured job and load seconds, by context identity and GPU model."""

    job: dict[tuple[str, str], Mean] = field(default_factory=dict)
    load: dict[tuple[str, str], Mean] = field(default_factory=dict)
    load_on: dict[tuple[str, str], Mean] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)

    def job_seconds(self, identity: str, model: str) -> float | None:
        """Mean job seconds (loads excluded) of a context on a GPU model."""
        found = self.job.get((identity, model))
        return found.value if found else None

    def load_seconds(self, identity: str, model: str, address: str = "") -> float | None:
        """Load seconds of a context on this server, else on its GPU model, else
        the mean over every model (None if never measured)."""
        found = self.load_on.get((identity, address)) or self.load.get((identity, model))
        if found:
            return found.value
        others = [mean.value for (ident, _), mean in self.load.items() if ident == identity]
        return sum(others) / len(others) if others else None

    def add_job(self, identity: str, model: str, seconds: float) -> None:
        """Fold in one finished job."""
        self.job.setdefault((identity, model), Mean()).add(max(0.0, seconds))

    def add_load(self, identity: str, model: str, address: str, seconds: float) -> None:
        """Fold in one load."""
        self.load.setdefault((identity, model), Mean()).add(max(0.0, seconds))
        self.load_on.setdefault((identity, address), Mean()).add(max(0.0, seconds))

    def to_wire(self) -> dict[str, Any]:
        """Plain data (for a snapshot)."""

        def means(table: dict[tuple[str, str], Mean]) -> list[list[Any]]:
            return [[a, b, m.value, m.count] for (a, b), m in table.items()]

        return {
            "job": means(self.job),
            "load": means(self.load),
            "load_on": means(self.load_on),
            "bytes": dict(self.bytes),
        }

    def merge_wire(self, data: Mapping[str, Any]) -> None:
        """Take measurements from a snapshot where this view has none."""
        for name in ("job", "load", "load_on"):
            table: dict[tuple[str, str], Mean] = getattr(self, name)
            for a, b, value, count in data.get(name, []):
                table.setdefault((a, b), Mean(float(value), int(count)))
        for identity, size in dict(data.get("bytes", {})).items():
            self.bytes.setdefault(identity, int(size))
