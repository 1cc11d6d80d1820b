"""Measured job and load seconds, by context identity and GPU model.

Running means, seeded from the catalog's history when a run starts and updated from
jobs' results and the fleet's events. Loads come in three kinds: a load that
converts weights into a local cache (a GGUF dequantised once), a load that fetched
its template from a peer first (then read it from the cache it filled), and a load
that does neither (from that cache, or a loader without conversions). A server whose
cache holds a context is expected to load it the last way; one whose cache does not,
while a peer holds it, the second way. For a server's choice between a peer and the
source (:func:`.peerchoice.choose_origin`), loads are also kept by where they read:
the source (a conversion, or a load that found no cache) or the local cache, and peer
transfers by their rate (:meth:`Measurements.rates`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .peerchoice import Rates

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
    #: Loads that fetched their template from a peer first, by (identity, GPU model).
    peer: dict[tuple[str, str], Mean] = field(default_factory=dict)
    #: Loads without conversion that found no cache and fetched nothing (from the
    #: source), and loads from the local cache (the part of a converting or fetching
    #: load after it too), by (identity, GPU model).
    source: dict[tuple[str, str], Mean] = field(default_factory=dict)
    cache: dict[tuple[str, str], Mean] = field(default_factory=dict)
    #: Bytes a second of peer transfers that ended ok, by identity.
    transfer: dict[str, Mean] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)

    def job_seconds(self, identity: str, model: str) -> float | None:
        """Mean job seconds (loads excluded) of a context on a GPU model."""
        found = self.job.get((identity, model))
        return found.value if found else None

    def measured_jobs(self, identity: str) -> bool:
        """Whether a job of the context has been measured on any GPU model."""
        return any(ident == identity for ident, _ in self.job)

    def load_seconds(
        self,
        identity: str,
        model: str,
        address: str = "",
        *,
        cached: bool = False,
        from_peer: bool = False,
    ) -> float | None:
        """Load seconds of a context on a server (None if never measured): unless the
        server's cache holds the weights (``cached``), a load from a peer when one
        holds them (``from_peer``; never measured: None, nothing to bound it by) or
        else a converting load when its loads ever converted; else a load without
        conversion, on this server, else on its GPU model, else on any; else any load."""
        if not cached and from_peer:
            return _mean_for(self.peer, identity, model)
        if not cached:
            converting = _mean_for(self.convert, identity, model)
            if converting is not None:
                return converting
        near = self.load_on.get((identity, address))
        if near is not None:
            return near.value
        plain = _mean_for(self.reload, identity, model)
        return plain if plain is not None else _mean_for(self.load, identity, model)

    def rates(self, identity: str, model: str) -> Rates:
        """What a server choosing between a peer and the source needs: a load from the
        source (a converting load when its loads ever converted), from the cache, and
        the rate of peer transfers (of this context, else of any)."""
        source = _mean_for(self.convert, identity, model)
        if source is None:
            source = _mean_for(self.source, identity, model)
        rate = self.transfer.get(identity)
        rates = [mean.value for mean in self.transfer.values()]
        return Rates(
            source_seconds=source,
            cache_seconds=_mean_for(self.cache, identity, model),
            peer_rate=rate.value if rate else (sum(rates) / len(rates) if rates else None),
        )

    def add_transfer(self, identity: str, nbytes: int, seconds: float, outcome: str) -> None:
        """Fold in one holder's part of a transfer (only a whole one, ``ok``, gives a rate)."""
        if outcome == "ok" and nbytes > 0 and seconds > 0:
            self.transfer.setdefault(identity, Mean()).add(nbytes / seconds)

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
        peer_seconds: float | None = None,
        from_cache: bool | None = None,
    ) -> None:
        """Fold in one load (``conversions``: it converted weights, and took
        ``reload_seconds`` after converting; ``peer_seconds``: it fetched its template
        from a peer first, for that long; ``from_cache``: its loader's cache probe)."""
        seconds = max(0.0, seconds)
        key = (identity, model)
        self.load.setdefault(key, Mean()).add(seconds)
        if peer_seconds is not None and not conversions:
            self.peer.setdefault(key, Mean()).add(seconds)
            rest = max(0.0, seconds - peer_seconds)
            self.reload.setdefault(key, Mean()).add(rest)
            self.cache.setdefault(key, Mean()).add(rest)
            return
        if conversions:
            self.convert.setdefault(key, Mean()).add(seconds)
            if reload_seconds is not None:
                self.reload.setdefault(key, Mean()).add(max(0.0, reload_seconds))
                self.cache.setdefault(key, Mean()).add(max(0.0, reload_seconds))
            return
        self.reload.setdefault(key, Mean()).add(seconds)
        self.load_on.setdefault((identity, address), Mean()).add(seconds)
        if from_cache is not None:
            (self.cache if from_cache else self.source).setdefault(key, Mean()).add(seconds)

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
            "peer": means(self.peer),
            "source": means(self.source),
            "cache": means(self.cache),
            "transfer": {i: [m.value, m.count] for i, m in self.transfer.items()},
            "bytes": dict(self.bytes),
        }

    def merge_wire(self, data: Mapping[str, Any]) -> None:
        """Take measurements from a snapshot where this view has none."""
        for name in ("job", "load", "load_on", "convert", "reload", "peer", "source", "cache"):
            table: dict[tuple[str, str], Mean] = getattr(self, name)
            for a, b, value, count in data.get(name, []):
                table.setdefault((a, b), Mean(float(value), int(count)))
        for identity, (value, count) in dict(data.get("transfer", {})).items():
            self.transfer.setdefault(identity, Mean(float(value), int(count)))
        for identity, size in dict(data.get("bytes", {})).items():
            self.bytes.setdefault(identity, int(size))


def _mean_for(table: dict[tuple[str, str], Mean], identity: str, model: str) -> float | None:
    """The mean on this GPU model, else over every model (None if never measured)."""
    found = table.get((identity, model))
    if found is not None:
        return found.value
    others = [mean.value for (ident, _), mean in table.items() if ident == identity]
    return sum(others) / len(others) if others else None
