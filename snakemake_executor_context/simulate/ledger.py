"""Where each simulated GPU-second went, in the ledger's buckets (:mod:`.buckets`),
by the ledger's rules: each bucket from its own intervals (a server's loads by kind,
its attempts ok or thrown away, the contexts it held, its drain), and where they meet
the ledger's precedence: lost (an attempt thrown away, and the load it did), loading
(conversion, source, peer, cache), running, failed, draining, starting (before its
first load or job), idle warm (a context held) or idle cold. A pilot adds its
allocation before its server registered.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .buckets import Bucket, LoadKind
from .servers import SimServer

if TYPE_CHECKING:
    from .pilots import SimPool

__all__ = ["Ledger", "ledger"]

#: Loads by precedence where two meet (the ledger's order).
_LOAD_ORDER = (LoadKind.CONVERSION, LoadKind.SOURCE, LoadKind.PEER, LoadKind.CACHE)


@dataclass
class Ledger:
    """GPU-seconds per bucket, in all and per server (by name)."""

    buckets: dict[Bucket, float] = field(default_factory=dict)
    servers: dict[str, dict[Bucket, float]] = field(default_factory=dict)

    @property
    def total(self) -> float:
        """Every GPU-second accounted for."""
        return sum(self.buckets.values())

    def hours(self) -> dict[str, float]:
        """GPU-hours per bucket (buckets with time only, in the ledger's order)."""
        return {str(b): self.buckets[b] / 3600 for b in Bucket if self.buckets.get(b)}


# The precedence of each kind of interval (lower wins); loads carry their kind.
_LOST, _LOAD, _RUN, _DRAIN, _WARM = range(5)


def _server_buckets(server: SimServer, end: float) -> dict[Bucket, float]:
    left = server.left if server.left is not None else end
    start = server.joined
    lost_keys = {key for key, (_, _, how) in server.attempts.items() if how == "lost"}
    points: list[tuple[float, int, int, LoadKind | None]] = []

    def span(a: float, b: float, what: int, kind: LoadKind | None = None) -> None:
        a, b = max(a, start), min(b, left)
        if b > a:
            points.append((a, 1, what, kind))
            points.append((b, -1, what, kind))

    if server.draining is not None:
        span(server.draining, left, _DRAIN)
    for begin, finish, kind, key in server.loads:
        span(begin, finish, _LOST if key in lost_keys else _LOAD, kind)
    for begin, finish, how in server.attempts.values():
        span(begin, finish, _LOST if how == "lost" else _RUN)
    for _, ready, gone in server.warm:
        span(ready, gone, _WARM)
    first = min(
        [begin for begin, _, _, _ in server.loads]
        + [begin for begin, _, _ in server.attempts.values()],
        default=left,
    )
    points.sort(key=lambda p: (p[0], -p[1]))
    counts = [0] * 5
    kinds: dict[LoadKind, int] = dict.fromkeys(LoadKind, 0)
    out: dict[Bucket, float] = {}
    at = start
    end_point: tuple[float, int, int, LoadKind | None] = (left, 0, 0, None)
    for when, step, what, load_kind in [*points, end_point]:
        if when > at:
            bucket = _bucket(counts, kinds, at >= first)
            out[bucket] = out.get(bucket, 0.0) + when - at
            at = when
        counts[what] += step
        if what == _LOAD and load_kind is not None:
            kinds[load_kind] += step
    return out


def _bucket(counts: list[int], kinds: dict[LoadKind, int], begun: bool) -> Bucket:
    if counts[_LOST]:
        return Bucket.LOST
    if counts[_LOAD]:
        return Bucket.loading(next(k for k in _LOAD_ORDER if kinds[k] > 0))
    if counts[_RUN]:
        return Bucket.RUNNING
    if counts[_DRAIN]:
        return Bucket.DRAINING
    if not begun:
        return Bucket.STARTING
    return Bucket.IDLE_WARM if counts[_WARM] else Bucket.IDLE_COLD


def ledger(servers: Iterable[SimServer], end: float, pool: SimPool | None = None) -> Ledger:
    """The run's GPU-seconds by bucket (one GPU per server)."""
    result = Ledger()
    for server in servers:
        own = result.servers.setdefault(server.name, {})
        for bucket, seconds in _server_buckets(server, end).items():
            own[bucket] = own.get(bucket, 0.0) + seconds
            result.buckets[bucket] = result.buckets.get(bucket, 0.0) + seconds
    if pool is not None:
        for name, allocated in pool.allocated.items():
            record = pool.records[name]
            until = record.registered if record.registered is not None else record.ended or end
            seconds = max(0.0, until - allocated)
            before = Bucket.ALLOCATED_BEFORE
            result.buckets[before] = result.buckets.get(before, 0.0) + seconds
            own = result.servers.setdefault(name, {})
            own[before] = own.get(before, 0.0) + seconds
    return result
