"""Measured job and load seconds, by context identity and GPU model.

Running means, seeded from the catalog's history when a run starts and updated from
jobs' results and the fleet's events. Loads come in two kinds: a load that converts
weights into a local cache (a GGUF dequantised once), and a load that does not (from
that cache, or a loader without conversions). A server whose cache holds a context
is expected to load it the second way.
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
    #: Every load, by (identity, GPU model).
    load: dict[tuple[str, str], Mean] = field(default_factory=dict)
    #: Loads that converted weights, by (identity, GPU model).
    convert: dict[tuple[str, str], Mean] = field(default_factory=dict)
    #: Loads without a conversion (and what converting loads took after converting),
    #: by (identity, GPU model) and, the server's own, by (identity, address).
    reload: dict[tuple[str, str], Mean] = field(default_factory=dict)
    load_on: dict[tuple[str, str], Mean] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)

    def job_seconds(self, identity: str, model: str) -> float | None:
        """Mean job seconds (loads excluded) of a context on a GPU model."""
        found = self.job.get((identity, model))
        return found.value if found else None

    def load_seconds(
        self, identity: str, model: str, address: str = "", *, cached: bool = False
    ) -> float | None:
        """Load seconds of a context on a server (None if never measured): a
        converting load unless the server's cache holds the weights (``cached``) or
        its loads never converted; else a load without conversion, on this server,
        else on its GPU model, else on any; else any load."""
        if not cached:
            converting = _mean_for(self.convert, identity, model)
            if converting is not None:
                return converting
        near = self.load_on.get((identity, address))
        if near is not None:
            return near.value
        plain = _mean_for(self.reload, identity, model)
        return plain if plain is not None else _mean_for(self.load, identity, model)

    def add_job(self, identity: str, model: str, seconds: float) -> None:
        """Fold in one finished job."""
        self.job.setdefault((identity, model), Mean()).add(max(0.0, seconds))

    def add_load(
        self,
        identity: str,
        model: str,
        address: str,
        seconds: float,
        *,
        conversions: int = 0,
        reload_seconds: float | None = None,
    ) -> None:
        """Fold in one load (``conversions``: it converted weights, and took
        ``reload_seconds`` after converting)."""
        seconds = max(0.0, seconds)
        self.load.setdefault((identity, model), Mean()).add(seconds)
        if conversions:
            self.convert.setdefault((identity, model), Mean()).add(seconds)
            if reload_seconds is not None:
                self.reload.setdefault((identity, model), Mean()).add(max(0.0, reload_seconds))
            return
        self.reload.setdefault((identity, model), Mean()).add(seconds)
        self.load_on.setdefault((identity, address), Mean()).add(seconds)

    def to_wire(self) -> dict[str, Any]:
        """Plain data (for a snapshot)."""

        def means(table: dict[tuple[str, str], Mean]) -> list[list[Any]]:
            return [[a, b, m.value, m.count] for (a, b), m in table.items()]

        return {
            "job": means(self.job),
            "load": means(self.load),
            "load_on": means(self.load_on),
            "convert": means(self.convert),
            "reload": means(self.reload),
            "bytes": dict(self.bytes),
        }

    def merge_wire(self, data: Mapping[str, Any]) -> None:
        """Take measurements from a snapshot where this view has none."""
        for name in ("job", "load", "load_on", "convert", "reload"):
            table: dict[tuple[str, str], Mean] = getattr(self, name)
            for a, b, value, count in data.get(name, []):
                table.setdefault((a, b), Mean(float(value), int(count)))
        for identity, size in dict(data.get("bytes", {})).items():
            self.bytes.setdefault(identity, int(size))


def _mean_for(table: dict[tuple[str, str], Mean], identity: str, model: str) -> float | None:
    """The mean on this GPU model, else over every model (None if never measured)."""
    found = table.get((identity, model))
    if found is not None:
        return found.value
    others = [mean.value for (ident, _), mean in table.items() if ident == identity]
    return sum(others) / len(others) if others else None
