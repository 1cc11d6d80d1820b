"""Simulated preemptions: a rate per partition (a Poisson process, as the paper's
"one GPU preempted per minute"), a trace (the injector's log of a real run), or the
end of each server's life (its partition's hazard, :mod:`.hazard`).

Each preemption picks a running server of its partition with the run's seeded
generator and kills it (announced, as the injector does, so the loss is classified
a preemption and charged to the preemption budget), or with ``TERM`` lets it drain
for the grace period (:meth:`.simservers.SimServer.drain`). A trace's lines are read by
:func:`trace_from`.

A server's life is drawn when it joins (a fixed fleet's, a restarted one, a pilot)
from a generator of its own, seeded by the run's seed and its address (its name and
incarnation): two runs with the same seed that differ in a policy give the same
server the same draw, so the policy, not the luck of the draw, tells them apart. It
is preempted as above when its life ends, if that incarnation is still running and
not draining.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable
from typing import Any, Protocol

from ..errors import SettingError
from .clock import Clock
from .model import Preemption
from .simservers import SimServer

__all__ = ["Preempter", "trace_from"]

#: An ``at`` above this is an absolute time (the injector's log), else seconds from
#: the run's start.
_EPOCH = 1e8
_FORMAT = (
    'expected one JSON object a line, {"at": SECONDS, "server": NAME} (at: seconds from '
    "the run's start, or the injector's epoch time with --catalog)"
)


def trace_from(lines: Iterable[str], where: str, started: float | None) -> list[tuple[float, str]]:
    """A trace's preemptions, (seconds from the run's start, server or partition or
    ``*``), from its lines (``where``: the file, for messages; ``started``: the
    catalog run's start, for absolute times). A line that is not one is refused in
    one line naming the file, the line and the format."""
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        at = _at(line)
        if at is not None and at > _EPOCH:
            at = at - started if started is not None else None
        if at is None or at < 0:
            shown = line.strip()
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise SettingError(
                f"--preempt-trace {where!r} line {number}: {shown!r} is not a preemption: "
                f"{_FORMAT}."
            )
        item = json.loads(line)
        out.append((at, str(item.get("server") or item.get("name") or "*")))
    return out


def _at(line: str) -> float | None:
    try:
        item: Any = json.loads(line)
        at = float(item["at"])
    except (ValueError, TypeError, KeyError, IndexError):
        return None
    return at if math.isfinite(at) and isinstance(item, dict) else None


class _Host(Protocol):
    clock: Clock
    rng: random.Random

    def live_servers(self) -> Iterable[SimServer]: ...

    def active(self) -> bool: ...

    def note(self, what: str, detail: str) -> None: ...


class Preempter:
    """Takes servers away at the spec's rates and times, and at their lives' ends."""

    def __init__(self, host: _Host, spec: Preemption, seed: int = 0) -> None:
        self.host, self.spec, self.seed = host, spec, seed
        self.count = 0

    def start(self) -> None:
        """Schedule the first preemption of each partition, and the trace's."""
        for partition, rate in sorted(self.spec.rates.items()):
            if rate > 0:
                self._next(partition, rate)
        for at, target in self.spec.trace:
            self.host.clock.at(at, self._hit, target, None)

    def _next(self, partition: str, rate: float) -> None:
        delay = self.host.rng.expovariate(rate)
        self.host.clock.after(delay, self._hit, partition, rate)

    def _hit(self, target: str, rate: float | None) -> None:
        if not self.host.active():
            return
        servers = sorted(
            (
                s
                for s in self.host.live_servers()
                if s.draining is None and (target in ("*", s.name, s.kind.where, s.gpu_model))
            ),
            key=lambda s: s.name,
        )
        if servers:
            self._take(self.host.rng.choice(servers), "")
        if rate is not None:
            self._next(target, rate)

    def _take(self, server: SimServer, why: str) -> None:
        self.count += 1
        self.host.note("preempted", f"{server.name} ({self.spec.signal}{why})")
        if self.spec.signal.upper() == "TERM":
            server.drain(self.spec.grace)
        else:
            server.leave(self.host.clock.now, exit_code=-9, injected=9)

    def joined(self, server: SimServer) -> None:
        """A server joined: draw its life from its partition's hazard (else ``*``'s;
        none: it lives on) and preempt it when its life ends."""
        lifetimes = self.spec.lifetimes
        hazard = lifetimes.get(server.kind.where) or lifetimes.get("*")
        if hazard is None:
            return
        life = hazard.draw(random.Random(f"{self.seed} {server.address}"))
        self.host.clock.after(life, self._end_of_life, server)

    def _end_of_life(self, server: SimServer) -> None:
        if self.host.active() and server.alive and server.draining is None:
            self._take(server, ", end of its life")
