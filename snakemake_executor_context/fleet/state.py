"""The in-memory state of the fleet that placement reads, maintained from events.

One :class:`FleetState` lives in each executor (fed by its dispatch state machine,
:mod:`..executor.dispatch`) and one in the scheduler's hub (:mod:`..cluster.hub`),
which hands a snapshot to every run that attaches. It is updated by
:meth:`FleetState.apply` from the fleet's events (:mod:`.events`), and by an
executor's own dispatches and results; placement (:func:`.placement.choose_server`)
reads it without any database query.

Not thread-safe: each owner updates it from one thread (the hub holds a lock).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .events import (
    ContextEvicted,
    ContextLoadFailed,
    ContextLoading,
    ContextReady,
    ContextShared,
    Event,
    JobFinished,
    JobStarted,
    ServerDescribed,
    ServerJoined,
    ServerLeft,
)
from .measure import Measurements
from .resources import covers
from .servers import CPU_MODEL, ContextState, Placed, ServerState, model_of

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
        self._runnable: dict[frozenset[tuple[str, float]], list[str]] = {}
        #: key -> the address whose slot it holds.
        self._where: dict[str, str] = {}
        #: Contexts that cannot serve two jobs at once: each of their jobs holds
        #: every slot of its server.
        self.unshareable: set[str] = set()
        self._left: OrderedDict[str, None] = OrderedDict()

    # -- servers -------------------------------------------------------------------

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
            self._runnable.clear()
        if name:
            server.name = name
        if resources is not None and dict(resources) != server.resources:
            server.resources = dict(resources)
            self._runnable.clear()
            if server.gpu is None:
                server.gpu_model = model_of(server.resources)
        if slots is not None:
            server.slots = max(1, int(slots))
        return server

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
        self._runnable.clear()
        return server

    def runnable(self, wanted: Mapping[str, float]) -> list[str]:
        """Addresses whose advertised resources cover ``wanted`` (cached)."""
        key = frozenset(wanted.items())
        found = self._runnable.get(key)
        if found is None:
            found = [a for a, s in self.servers.items() if covers(s.resources, wanted)]
            self._runnable[key] = found
        return found

    # -- events --------------------------------------------------------------------

    def apply(self, event: Event) -> None:
        """Update the state from one event of the fleet (idempotent; late ones lose).

        An executor passes here only the events of jobs that are not its own: it
        learns about its own from their results (see :mod:`..executor.dispatch`).
        """
        if isinstance(event, ServerJoined):
            self.add_server(
                event.address, name=event.name, resources=event.resources, slots=event.slots
            )
        elif isinstance(event, ServerDescribed):
            self.describe_server(event)
        elif isinstance(event, ServerLeft):
            self.remove_server(event.address)
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
            )
            if event.bytes:
                self.measure.bytes[event.identity] = int(event.bytes)
        elif isinstance(event, ContextShared):
            server = self.servers.get(event.address)
            if server is not None:
                server.shared[event.identity] = max(1, int(event.jobs))
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

    def describe_server(self, event: ServerDescribed) -> None:
        """A server described itself: its GPU record and context budget."""
        described = self.add_server(event.address, name=event.name)
        described.gpu = event.gpu
        described.gpu_model = model_of(described.resources, event.gpu)
        described.budget = int(event.memory_budget) or None
        described.retires_at = event.retires_at

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

    def learn(
        self,
        address: str | None,
        *,
        identity: str | None = None,
        started: float = 0.0,
        loaded: Sequence[str] = (),
        reused: Sequence[str] = (),
        evicted: Sequence[str] = (),
        job_seconds: float | None = None,
        load_seconds: float = 0.0,
        conversions: int = 0,
        reload_seconds: float | None = None,
    ) -> None:
        """Learn from one of an executor's job results what its server now holds, and
        measure it (``job_seconds``: a successful job's time without loads)."""
        server = self.servers.get(address) if address else None
        if server is None or address is None:
            return
        model = server.gpu_model
        if identity is not None and job_seconds is not None:
            self.measure.add_job(identity, model, job_seconds)
        if identity is not None and identity in loaded and len(loaded) == 1 and load_seconds:
            self.measure.add_load(
                identity,
                model,
                address,
                load_seconds,
                conversions=conversions,
                reload_seconds=reload_seconds,
            )
        for gone in evicted:
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
                }
                for s in self.servers.values()
            ],
            "measure": self.measure.to_wire(),
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
            server.cached.update(item.get("cached", []))
            for key, identity in item.get("holding", {}).items():
                self.hold(key, server.address, identity)
            server.started.update(item.get("started", {}))
            for identity, (state, at, nbytes, last_used) in item.get("contexts", {}).items():
                self.set_context(
                    server.address, identity, ContextState(state), float(at), int(nbytes)
                )
                server.contexts[identity].last_used = float(last_used)
        self.measure.merge_wire(data.get("measure", {}))
