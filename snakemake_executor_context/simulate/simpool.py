"""A simulated pool of pilots, sized by the real pool's policy.

Every ``interval`` the pool asks :func:`~..fleet.poolsizing.pilots_wanted` how many pilots
the run's published demand calls for, capped by
:func:`~..fleet.poolsizing.growth_limit` over the pilots proving useful
(:func:`~..fleet.poolsizing.useful_pilots`), submits new ones of the kind
:func:`~..fleet.poolsizing.next_kind` picks (within what the cluster gives of each GPU
model), and releases those :func:`~..fleet.poolsizing.pilots_to_release` names. A pilot
waits in the batch queue, starts its server, registers, and retires before its
walltime (Dask's ``--lifetime``, staggered); the pool's books are the real
:class:`~..fleet.pilotbook.PilotRecord`.

With survival placement on (:attr:`.model.Options.survival`), the pool tells
:func:`~..fleet.poolsizing.next_kind` the chance a new pilot of each kind lives through
a load and a job, as the real pool does (:func:`~..fleet.poolsizing.kind_survival`: the
fleet's survival estimate for the kind's partition over the published demand's
measured load and job times).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ..dispatch.machine import Dispatch
from ..fleet.pilotbook import PilotRecord, account
from ..fleet.poolsizing import (
    PoolDemand,
    PoolShape,
    growth_limit,
    kind_survival,
    next_kind,
    pilot_lifetime,
    pilots_to_release,
    pilots_wanted,
    useful_pilots,
)
from .clock import Clock
from .model import PoolSpec, ServerKind
from .simservers import SimServer

__all__ = ["SimPool"]


class _Host(Protocol):
    clock: Clock
    rng: random.Random
    published: PoolDemand
    dispatch: Dispatch

    def add_server(self, kind: ServerKind, name: str, retires_at: float | None) -> SimServer: ...

    def active(self) -> bool: ...


class SimPool:
    """Pilots of several kinds, submitted and released by the run's demand."""

    def __init__(self, host: _Host, spec: PoolSpec, kinds: list[ServerKind]) -> None:
        self.host, self.spec, self.kinds = host, spec, kinds
        self.shape = PoolShape(
            minimum=spec.minimum,
            maximum=max(spec.minimum, spec.maximum),
            slots=max(1, min(kind.slots for kind in kinds)),
        )
        self.records: dict[str, PilotRecord] = {}
        self.kind_of: dict[str, int] = {}
        self.servers: dict[str, SimServer] = {}
        self.allocated: dict[str, float] = {}
        self.idle_since: dict[str, float] = {}
        self._count = 0

    def start(self) -> None:
        """Pilots kept from before the run register at once; then the pool's first
        decision (it keeps its minimum from the start)."""
        for _ in range(self.spec.ready):
            name = self._submit({})
            if name is not None:
                self._register(name)
        self._adapt()

    def _live(self) -> list[PilotRecord]:
        return [r for r in self.records.values() if r.ended is None]

    def _adapt(self) -> None:
        now = self.host.clock.now
        self._sample(now)
        demand = self.host.published
        useful = useful_pilots(self.records.values(), self.idle_since, now, self.spec.idle_timeout)
        pending = sum(1 for r in self._live() if r.registered is None)
        target = min(pilots_wanted(demand, self.shape), growth_limit(useful, pending, self.shape))
        live = self._live()
        if target > len(live):
            by_model = demand.by_gpu_model
            for _ in range(target - len(live)):
                if self._submit(by_model) is None:
                    break
        elif target < len(live):
            running = {r.name for r in live if r.registered is not None}
            idle = {name: t for name, t in self.idle_since.items() if name in running}
            minimum = max(self.shape.minimum, target)
            release = pilots_to_release(idle, now, self.spec.idle_timeout, len(running), minimum)
            for name in release:
                self._release(name, now)
        if self.host.active():
            self.host.clock.after(self.spec.interval, self._adapt)

    def _sample(self, now: float) -> None:
        for name, server in self.servers.items():
            record = self.records[name]
            if record.ended is not None:
                continue
            if server.busy():
                self.idle_since.pop(name, None)
                record.first_task = record.first_task or now
                record.busy_seconds += self.spec.interval
            else:
                self.idle_since.setdefault(name, now)

    def _submit(self, by_model: Mapping[str, int]) -> str | None:
        held = [0] * len(self.kinds)
        for name, index in self.kind_of.items():
            if self.records[name].ended is None:
                held[index] += 1
        open_kinds = [i for i, kind in enumerate(self.kinds) if held[i] < kind.count]
        if not open_kinds:
            return None
        wanted = [int(by_model.get(self.kinds[i].gpu_model, 0)) for i in open_kinds]
        survival = self._survival([self.kinds[i] for i in open_kinds])
        index = open_kinds[next_kind(wanted, [held[i] for i in open_kinds], survival=survival)]
        kind, now = self.kinds[index], self.host.clock.now
        name = f"pilot-{kind.where}-{self._count}"
        self._count += 1
        self.records[name] = PilotRecord(name=name, pilot_kind=kind.gpu_model, submitted=now)
        self.kind_of[name] = index
        wait = self.spec.queue_wait
        if self.spec.queue_draw == "exp" and wait > 0:
            wait = self.host.rng.expovariate(1.0 / wait)
        self.host.clock.after(wait, self._allocated, name)
        return name

    def _survival(self, kinds: Sequence[ServerKind]) -> list[float] | None:
        """Per kind, the chance a new pilot lives through a load and its work, as the
        real pool asks it (:func:`~..fleet.poolsizing.kind_survival`; None: the run does not
        weigh survival)."""
        groups = [(kind.where, kind.gpu_model) for kind in kinds]
        book = self.host.dispatch.fleet.survival
        return kind_survival(self.host.published, book, groups, self.host.clock.now)

    def _allocated(self, name: str) -> None:
        if self.records[name].ended is not None or name in self.allocated:
            return
        self.allocated[name] = self.host.clock.now
        self.host.clock.after(self.spec.startup, self._register, name)

    def _register(self, name: str) -> None:
        record, now = self.records[name], self.host.clock.now
        if record.ended is not None or record.registered is not None:
            return
        self.allocated.setdefault(name, now)
        record.registered = now
        spec = self.spec
        lifetime = pilot_lifetime(spec.walltime, spec.retire_margin, spec.stagger)
        lifetime += self.host.rng.uniform(0.0, spec.stagger)
        kind = self.kinds[self.kind_of[name]]
        self.servers[name] = self.host.add_server(kind, name, now + lifetime)
        self.host.clock.after(lifetime, self._retire, name)

    def _retire(self, name: str) -> None:
        record = self.records[name]
        if record.ended is None:
            record.ended, record.batch_state = self.host.clock.now, "COMPLETED"
            self.servers[name].leave(self.host.clock.now, expected=True, exit_code=0)

    def _release(self, name: str, now: float) -> None:
        record = self.records[name]
        record.released, record.ended = True, now
        self.idle_since.pop(name, None)
        server = self.servers.get(name)
        if server is not None:
            server.leave(now, expected=True, exit_code=0)

    def lost(self, name: str, state: str = "PREEMPTED") -> None:
        """A pilot's server was taken (the batch system says how)."""
        record = self.records.get(name)
        if record is not None and record.ended is None:
            record.ended, record.batch_state = self.host.clock.now, state
        self.idle_since.pop(name, None)

    def close(self, now: float) -> dict[str, Any]:
        """The run ended: the pool releases every pilot; its books."""
        for record in self._live():
            record.released, record.ended = True, now
            server = self.servers.get(record.name)
            if server is not None:
                server.leave(now, expected=True, exit_code=0)
        return account(self.records.values(), now)
