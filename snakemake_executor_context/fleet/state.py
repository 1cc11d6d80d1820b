"""The in-memory state of the fleet that placement reads, maintained from events.

One :class:`FleetState` lives in each executor (fed by its dispatch state machine,
:mod:`..dispatch.machine`) and one in the scheduler's hub (:mod:`..cluster.hub`),
which hands a snapshot to every run that attaches. It is updated by
:meth:`FleetState.apply` from the fleet's events (:mod:`.events`), and by an
executor's own dispatches and results; placement (:func:`.placement.choose_server`)
reads it without any database query.

Not thread-safe: each owner updates it from one thread (the hub holds a lock).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from .events import (
    ContextEvicted,
    ContextLoadFailed,
    ContextLoading,
    ContextReady,
    ContextShared,
    ContextTransferred,
    Event,
    GangAssembled,
    JobFinished,
    JobStarted,
    ServerDescribed,
    ServerJoined,
    ServerLeft,
)
from .index import FleetIndex
from .losses import LossKind
from .measure import Measurements
from .outcome import Outcome
from .resources import GPU
from .servers import CPU_MODEL, ContextState, Placed, ServerState, model_of
from .survival import SurvivalBook, survival_group

__all__ = ["CPU_MODEL", "ContextState", "FleetState", "Placed", "ServerState", "model_of"]

#: Servers remembered after they left, so a late event does not bring one back.
LEFT_MEMORY = 10_000


class FleetState:
    """Servers, what each holds, what runs where, and measured times."""

    def __init__(self) -> None:
        self.servers: dict[str, ServerState] = {}
        #: identity -> addresses where it is loading or ready.
        self.warm: dict[str, set[str]] = {}
        self.measure = Measurements()
        #: Candidates per wanted resources, servers by spare slots (placement's).
        self.index = FleetIndex()
        #: key -> the address whose slot it holds.
        self._where: dict[str, str] = {}
        #: Contexts that cannot serve two jobs at once: each of their jobs holds
        #: every slot of its server.
        self.unshareable: set[str] = set()
        #: Whether servers fetch a missing template from a peer that holds it.
        self.peer_transfers = True
        #: Servers' lives (the catalog's history and this run's) and whether placement
        #: weighs them (``--context-tuning survival_placement``).
        self.survival = SurvivalBook()
        self.survival_placement = False
        self._left: OrderedDict[str, None] = OrderedDict()

    # -- servers -------------------------------------------------------------------

    def closing(self, reason: str) -> list[ServerLeft]:
        """The fleet closes (its cluster stops): a ServerLeft, now, for every server
        still in it, so that the catalog records each one's end."""
        return [
            ServerLeft(address=s.address, name=s.name, expected=True, reason=reason)
            for s in self.servers.values()
        ]

    def add_server(
        self,
        address: str,
        *,
        name: str = "",
        resources: Mapping[str, float] | None = None,
        slots: int | None = None,
    ) -> ServerState:
        """Learn of a server (or update what it advertises)."""
        server = self.servers.get(address)
        if server is None:
            if address in self._left:
                # A late event of a server that has left: do not bring it back.
                return ServerState(address)
            server = self.servers[address] = ServerState(address=address)
            self.index.forget()
        if name:
            server.name = name
        if resources is not None and dict(resources) != server.resources:
            server.resources = dict(resources)
            self.index.forget()
            if server.gpu is None:
                server.gpu_model = model_of(server.resources)
        if slots is not None:
            server.slots = max(1, int(slots))
        self.index.update(server)
        return server

    def name_of(self, address: str) -> str:
        """A server's name (its address if it has none, or is not known)."""
        server = self.servers.get(address)
        return (server.name if server else "") or address

    def remove_server(self, address: str) -> ServerState | None:
        """Forget a server that left (its slots and warm contexts with it)."""
        server = self.servers.pop(address, None)
        if server is None:
            return None
        self._left[address] = None
        if len(self._left) > LEFT_MEMORY:
            self._left.popitem(last=False)
        for key in server.holding:
            self._where.pop(key, None)
        for identity in server.contexts:
            self._unwarm(identity, address)
        self.index.drop(address)
        return server

    def runnable(self, wanted: Mapping[str, float]) -> list[str]:
        """Addresses whose advertised resources cover ``wanted`` (cached)."""
        return self.index.candidates(self.servers, wanted).runnable

    # -- events --------------------------------------------------------------------

    def apply(self, event: Event) -> None:
        """Update the state from one event of the fleet (idempotent; late ones lose).

        An executor passes here only the events of jobs that are not its own: it
        learns about its own from their results (see :mod:`..dispatch.machine`).
        """
        if isinstance(event, ServerJoined):
            joined = self.add_server(
                event.address, name=event.name, resources=event.resources, slots=event.slots
            )
            if event.address in self.servers:
                self.survival.joined(event.address, event.at, gpu_model=joined.gpu_model)
        elif isinstance(event, ServerDescribed):
            self.describe_server(event)
        elif isinstance(event, GangAssembled):
            self.assemble(event)
        elif isinstance(event, ServerLeft):
            self.remove_server(event.address)
            self.survival.left(event.address, event.at, died=event.cause().kind != LossKind.CLOSED)
        elif isinstance(event, ContextLoading):
            self.set_context(event.address, event.identity, ContextState.LOADING, event.at)
            server = self.servers.get(event.address)
            if event.from_cache and server is not None:
                server.cached.add(event.identity)
        elif isinstance(event, ContextReady):
            self.set_context(
                event.address, event.identity, ContextState.READY, event.at, event.bytes
            )
            server = self.servers.get(event.address)
            model = event.gpu_model or (server.gpu_model if server else CPU_MODEL)
            self.measure.add_load(
                event.identity,
                model,
                event.address,
                event.load_seconds,
                conversions=event.conversions,
                reload_seconds=event.reload_seconds,
                peer_seconds=event.peer_seconds,
                from_cache=event.from_cache,
            )
            if server is not None and (event.conversions or event.peer_seconds is not None):
                server.cached.add(event.identity)  # its cache now holds the template
            if event.bytes:
                self.measure.bytes[event.identity] = int(event.bytes)
        elif isinstance(event, ContextShared):
            server = self.servers.get(event.address)
            if server is not None:
                server.shared[event.identity] = max(1, int(event.jobs))
        elif isinstance(event, ContextTransferred):
            self.measure.add_transfer(event.identity, event.bytes, event.seconds, event.outcome)
        elif isinstance(event, (ContextEvicted, ContextLoadFailed)):
            self.set_context(event.address, event.identity, None, event.at)
        elif isinstance(event, JobStarted):
            self.hold(event.key, event.address, event.context)
            self.mark_started(event.key, event.at)
        elif isinstance(event, JobFinished):
            self.release(event.key)
            self.touch(event.address, event.context, event.finished)
            if event.ok and event.context and event.finished > event.started > 0:
                server = self.servers.get(event.address)
                model = event.gpu_model or (server.gpu_model if server else CPU_MODEL)
                seconds = event.finished - event.started - event.load_seconds
                self.measure.add_job(event.context, model, seconds)

    def assemble(self, event: GangAssembled) -> None:
        """Servers on several nodes became one: the leader offers every member's GPUs,
        the members run no job of their own."""
        leader = self.servers.get(event.leader)
        if leader is None:
            return
        for member in event.members:
            server = self.servers.get(member)
            if server is not None:
                server.member_of = event.leader
        leader.nodes = max(1, len(set(event.nodes)))
        leader.resources = {**leader.resources, GPU: float(sum(event.devices))}
        self.index.forget()

    def describe_server(self, event: ServerDescribed) -> None:
        """A server described itself: its GPU record and context budget."""
        described = self.add_server(event.address, name=event.name)
        described.gpu = event.gpu
        described.gpu_model = model_of(described.resources, event.gpu)
        described.budget = int(event.memory_budget) or None
        group = survival_group(event.group, event.partition, event.pool)
        self.survival.described(event.address, group, described.gpu_model)
        if described.retires_at != event.retires_at:
            described.retires_at = event.retires_at
            self.index.forget()

    def set_context(
        self,
        address: str,
        identity: str,
        state: ContextState | None,
        at: float,
        nbytes: int = 0,
    ) -> None:
        """Record that ``identity`` is loading, ready or gone (None) on a server, unless
        the state already knows a later one."""
        server = self.servers.get(address)
        if server is None:
            return
        placed = server.contexts.get(identity)
        if (placed is not None and placed.at > at) or server.gone.get(identity, -1.0) > at:
            return
        if state is None:
            server.contexts.pop(identity, None)
            server.shared.pop(identity, None)
            server.gone[identity] = at
            self._unwarm(identity, address)
            return
        if placed is None:
            placed = server.contexts[identity] = Placed(state=state, at=at, last_used=at)
        placed.state, placed.at = state, at
        placed.bytes = int(nbytes or placed.bytes or self.measure.bytes.get(identity, 0))
        self.warm.setdefault(identity, set()).add(address)

    def probed(self, found: Mapping[str, Iterable[str]]) -> None:
        """Servers' cache probes answered: which identities each local cache holds."""
        for address, identities in found.items():
            server = self.servers.get(address)
            if server is not None:
                server.cached = set(identities)

    def touch(self, address: str, identity: str | None, at: float) -> None:
        """A job used a context on a server at ``at`` (for the eviction order)."""
        server = self.servers.get(address)
        placed = server.contexts.get(identity) if server and identity else None
        if placed is not None:
            placed.last_used = max(placed.last_used, at)

    def _unwarm(self, identity: str, address: str) -> None:
        holders = self.warm.get(identity)
        if holders is not None:
            holders.discard(address)
            if not holders:
                del self.warm[identity]

    # -- slots -----------------------------------------------------------------------

    def note_context(self, identity: str | None, *, shareable: bool) -> None:
        """Learn whether a context may run beside other jobs on one server."""
        if identity is not None and not shareable:
            self.unshareable.add(identity)

    def hold(self, key: str, address: str, identity: str | None) -> None:
        """``key`` holds a slot of ``address`` (dispatched there, or seen starting)."""
        server = self.servers.get(address)
        if server is None:
            return
        if self._where.get(key) not in (None, address):
            self.release(key)
        server.holding[key] = identity
        if identity in self.unshareable:
            server.exclusive.add(key)
        self._where[key] = address
        self.index.update(server)

    def mark_started(self, key: str, at: float) -> None:
        """The job holding ``key``'s slot started at ``at``."""
        server = self.servers.get(self._where.get(key, ""))
        if server is not None:
            server.started[key] = at

    def release(self, key: str) -> None:
        """Free the slot ``key`` holds (nothing if it holds none)."""
        address = self._where.pop(key, None)
        server = self.servers.get(address) if address else None
        if server is not None:
            server.holding.pop(key, None)
            server.started.pop(key, None)
            server.exclusive.discard(key)
            self.index.update(server)

    def where(self, key: str) -> str | None:
        """The server whose slot ``key`` holds."""
        return self._where.get(key)

    # -- an executor's own jobs ------------------------------------------------------

    def dispatched(self, key: str, address: str, identity: str | None, at: float) -> None:
        """An executor handed ``key`` to ``address``; a cold context starts loading."""
        server = self.servers.get(address)
        if server is None:
            return
        self.hold(key, address, identity)
        if identity is not None and identity not in server.contexts:
            self.set_context(address, identity, ContextState.LOADING, at)

    def learn(self, outcome: Outcome) -> None:
        """Learn from one of an executor's job results what its server now holds, and
        measure it (a successful job's time without loads, a lone load's time)."""
        address = outcome.server.address
        server = self.servers.get(address) if address else None
        if server is None:
            return
        model, identity, started = server.gpu_model, outcome.context, outcome.started
        loaded, reused = outcome.loaded, outcome.reused
        if identity is not None and outcome.ok:
            self.measure.add_job(identity, model, outcome.job_seconds)
        if identity is not None and loaded == (identity,) and outcome.load_seconds:
            self.measure.add_load(
                identity,
                model,
                address,
                outcome.load_seconds,
                conversions=outcome.conversions,
                reload_seconds=outcome.reload_seconds,
            )
        for gone in outcome.evicted:
            self.set_context(address, gone, None, started)
        for held in (*loaded, *reused):
            self.set_context(address, held, ContextState.READY, started)
        if identity is not None and identity not in (*loaded, *reused):
            placed = server.contexts.get(identity)
            if placed is not None and placed.state == ContextState.LOADING and placed.at <= started:
                # The load it was dispatched for did not happen (the job failed first).
                self.set_context(address, identity, None, started)

    # -- snapshots -----------------------------------------------------------------

    def to_wire(self) -> dict[str, Any]:
        """Plain data a newly attached executor starts from."""
        return {
            "servers": [
                {
                    "address": s.address,
                    "name": s.name,
                    "resources": s.resources,
                    "slots": s.slots,
                    "gpu": s.gpu,
                    "gpu_model": s.gpu_model,
                    "budget": s.budget,
                    "contexts": {
                        ident: [str(p.state), p.at, p.bytes, p.last_used]
                        for ident, p in s.contexts.items()
                    },
                    "cached": sorted(s.cached),
                    "holding": dict(s.holding),
                    "started": dict(s.started),
                    "shared": dict(s.shared),
                    "nodes": s.nodes,
                    "member_of": s.member_of,
                }
                for s in self.servers.values()
            ],
            "measure": self.measure.to_wire(),
            "survival": self.survival.to_wire(),
        }

    def load_wire(self, data: Mapping[str, Any]) -> None:
        """Take over a snapshot (from the hub's state)."""
        for item in data.get("servers", []):
            server = self.add_server(
                item["address"],
                name=item.get("name", ""),
                resources=item.get("resources", {}),
                slots=item.get("slots", 1),
            )
            server.gpu = item.get("gpu")
            server.shared.update(item.get("shared", {}))
            server.gpu_model = item.get("gpu_model") or server.gpu_model
            server.budget = item.get("budget")
            server.nodes = int(item.get("nodes", 1) or 1)
            server.member_of = item.get("member_of")
            server.cached.update(item.get("cached", []))
            for key, identity in item.get("holding", {}).items():
                self.hold(key, server.address, identity)
            server.started.update(item.get("started", {}))
            for identity, (state, at, nbytes, last_used) in item.get("contexts", {}).items():
                self.set_context(
                    server.address, identity, ContextState(state), float(at), int(nbytes)
                )
                server.contexts[identity].last_used = float(last_used)
        self.index.forget()  # the servers' nodes and gangs, set above
        self.measure.merge_wire(data.get("measure", {}))
        self.survival.merge_wire(data.get("survival") or {})
