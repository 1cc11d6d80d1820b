"""Where each simulated GPU-second went: each server's life as the ledger takes it
(:class:`~..fleet.accounting.ServerLife`: its attempts, its loads cut by kind as the
catalog's are, the contexts it held, its drain, a pilot's batch allocation), built
from what the simulated servers and pool did, and accounted by the ledger's own rules
(:func:`~..fleet.accounting.account`), so that a prediction and a real run's ledger
compare bucket by bucket. A pilot that never registered is charged its allocation.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..fleet.accounting import Segment, ServerLife, account
from ..fleet.buckets import Bucket
from .simservers import SimServer

if TYPE_CHECKING:
    from .simpool import SimPool

__all__ = ["Ledger", "ledger", "life_of"]


@dataclass
class Ledger:
    """GPU-seconds per bucket, in all, per server (by name) and per rule ('' : no
    rule's: idle, starting, draining, a pilot's allocation)."""

    buckets: dict[Bucket, float] = field(default_factory=dict)
    servers: dict[str, dict[Bucket, float]] = field(default_factory=dict)
    rules: dict[str, dict[Bucket, float]] = field(default_factory=dict)

    @property
    def total(self) -> float:
        """Every GPU-second accounted for."""
        return sum(self.buckets.values())

    def hours(self) -> dict[str, float]:
        """GPU-hours per bucket (buckets with time only, in the ledger's order)."""
        return _hours(self.buckets)

    def rule_hours(self) -> dict[str, dict[str, float]]:
        """GPU-hours per bucket of each rule's jobs (their loads included), by rule."""
        return {rule: _hours(sums) for rule, sums in sorted(self.rules.items()) if rule}

    def add(self, server: str, segments: Iterable[Segment]) -> None:
        """Count a server's segments (one GPU each server)."""
        own = self.servers.setdefault(server, {})
        for s in segments:
            for sums in (self.buckets, own, self.rules.setdefault(s.rule, {})):
                sums[s.bucket] = sums.get(s.bucket, 0.0) + s.seconds


def _hours(seconds: dict[Bucket, float]) -> dict[str, float]:
    return {str(b): seconds[b] / 3600 for b in Bucket if seconds.get(b)}


def life_of(server: SimServer, allocated: float | None = None) -> ServerLife:
    """The server's life as the ledger takes it (``allocated``: when its pilot's batch
    job started; it ends when the server leaves)."""
    return ServerLife(
        name=server.name,
        joined=server.joined,
        left=server.left,
        gpu_model=server.gpu_model,
        draining=server.draining,
        allocated=allocated,
        released=server.left if allocated is not None else None,
        work=list(server.attempts.values()),
        loads=[stretch for load in server.loads for stretch in load.stretches()],
        warm=list(server.warm),
    )


def ledger(servers: Iterable[SimServer], end: float, pool: SimPool | None = None) -> Ledger:
    """The run's GPU-seconds by bucket (one GPU per server), from 0 to ``end``."""
    result = Ledger()
    allocated = dict(pool.allocated) if pool is not None else {}
    for server in servers:
        life = life_of(server, allocated.pop(server.name, None))
        result.add(server.name, account(life, 0.0, end))
    for name, since in allocated.items():  # pilots whose servers never registered
        record = pool.records[name] if pool is not None else None
        until = record.ended if record is not None and record.ended is not None else end
        life = ServerLife(name=name, joined=until, left=until, allocated=since)
        result.add(name, account(life, 0.0, end))
    return result
