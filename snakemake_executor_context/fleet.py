"""The in-memory view of the fleet that placement reads, maintained from events.

One :class:`FleetView` lives in each executor (and one in the scheduler plugin, which
hands a snapshot to every run that attaches). It is updated by :meth:`FleetView.apply`
from the catalog's events (:mod:`.catalog.events`), by the executor's own dispatches
and results, and by the list of workers Dask reports; placement
(:func:`.placement.choose_server`) reads it without any database query.

Measured times (job seconds and load seconds per context and GPU model) are running
means, seeded from the catalog's history when a run starts.

Standard library only, no I/O.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .catalog.events import (
    ContextEvicted,
    ContextLoadFailed,
    ContextLoading,
    ContextReady,
    Event,
    JobFinished,
    JobStarted,
    ServerDescribed,
    ServerJoined,
    ServerLeft,
)

__all__ = ["CPU_MODEL", "FleetView", "Mean", "Measurements", "ServerState", "model_of"]

#: The GPU model of a server without a GPU.
CPU_MODEL = "cpu"
GPU_MODEL_PREFIX = "gpu_model:"
#: A running mean forgets older samples beyond this many (times drift).
MEAN_WINDOW = 50
#: Completed keys remembered, so a late JobStarted does not mark a slot busy again.
DONE_MEMORY = 10_000


def model_of(resources: Mapping[str, float], gpu: Mapping[str, Any] | None = None) -> str:
    """A server's normalised GPU model: from its GPU record, else the longest
    ``gpu_model:`` resource it advertises, else :data:`CPU_MODEL`."""
    if gpu and gpu.get("name"):
        from .gpus import normalize_gpu_model

        return normalize_gpu_model(str(gpu["name"]))
    tokens = [key[len(GPU_MODEL_PREFIX) :] for key in resources if key.startswith(GPU_MODEL_PREFIX)]
    return max(tokens, key=len) if tokens else CPU_MODEL


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
class Placed:
    """A context on a server: 'loading' or 'ready', since when, and its size."""

    state: str
    at: float
    bytes: int = 0
    last_used: float = 0.0


@dataclass
class ServerState:
    """One server as placement sees it."""

    address: str
    name: str = ""
    resources: dict[str, float] = field(default_factory=dict)
    slots: int = 1
    gpu_model: str = CPU_MODEL
    gpu: dict[str, Any] | None = None
    #: Bytes the server may fill with contexts (None: not yet described).
    budget: int | None = None
    contexts: dict[str, Placed] = field(default_factory=dict)
    #: Identities whose weights its local disk holds (the loaders' cache probes).
    cached: set[str] = field(default_factory=set)
    #: Keys running there (from the servers' events, every run).
    running: dict[str, str] = field(default_factory=dict)
    #: Keys this executor dispatched there that have not finished.
    assigned: set[str] = field(default_factory=set)
    #: Monotonic time the view learnt of it.
    seen: float = field(default_factory=time.monotonic)
    #: When each running key started there, and its context.
    started: dict[str, float] = field(default_factory=dict)
    running_context: dict[str, str | None] = field(default_factory=dict)
    #: When each context was last evicted (a late "ready" from before does not count).
    gone: dict[str, float] = field(default_factory=dict)

    @property
    def busy(self) -> int:
        """Slots in use: running jobs and this executor's dispatched ones."""
        return len(self.assigned.union(self.running))

    @property
    def free(self) -> bool:
        """Whether a slot is free."""
        return self.busy < self.slots


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


class FleetView:
    """Servers, what each holds, what runs where, and measured times.

    Thread safety: callers hold :attr:`lock` around reads and updates (Dask's event
    handlers run on the client's thread, decisions on Snakemake's).
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.servers: dict[str, ServerState] = {}
        #: identity -> addresses where it is loading or ready.
        self.warm: dict[str, set[str]] = {}
        self.measure = Measurements()
        self._runnable: dict[frozenset[tuple[str, float]], list[str]] = {}
        #: key -> the address it is assigned to or running on.
        self._where: dict[str, str] = {}
        self._done: OrderedDict[str, None] = OrderedDict()
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
        """Forget a server that left."""
        server = self.servers.pop(address, None)
        if server is None:
            return None
        self._remember(self._left, address)
        for key in (*server.assigned, *server.running):
            self._where.pop(key, None)
        for identity in server.contexts:
            self._unwarm(identity, address)
        self._runnable.clear()
        return server

    def sync_servers(
        self, present: Iterable[tuple[str, str, Mapping[str, float], int]], *, since: float
    ) -> list[str]:
        """Reconcile with Dask's list of workers ``(address, name, resources, slots)``
        as of monotonic time ``since``: add new ones, drop those gone. Returns the
        addresses dropped."""
        seen = set()
        for address, name, resources, slots in present:
            seen.add(address)
            self.add_server(address, name=name, resources=resources, slots=slots)
        gone = [a for a, s in self.servers.items() if a not in seen and s.seen < since]
        for address in gone:
            self.remove_server(address)
        return gone

    def runnable(self, wanted: Mapping[str, float]) -> list[str]:
        """Addresses whose advertised resources cover ``wanted`` (cached)."""
        key = frozenset(wanted.items())
        found = self._runnable.get(key)
        if found is None:
            found = [
                address
                for address, server in self.servers.items()
                if all(server.resources.get(name, 0) >= amount for name, amount in wanted.items())
            ]
            self._runnable[key] = found
        return found

    # -- events --------------------------------------------------------------------

    def apply(self, event: Event, *, measure: bool = True) -> None:
        """Update the view from one event (idempotent for state; late ones lose).

        ``measure=False``: a JobFinished adds no job time (the executor measures its
        own jobs from their results)."""
        server: ServerState | None
        if isinstance(event, ServerJoined):
            self.add_server(
                event.address, name=event.name, resources=event.resources, slots=event.slots
            )
        elif isinstance(event, ServerDescribed):
            described = self.add_server(event.address, name=event.name)
            described.gpu = event.gpu
            described.gpu_model = model_of(described.resources, event.gpu)
            described.budget = int(event.memory_budget) or None
        elif isinstance(event, ServerLeft):
            self.remove_server(event.address)
        elif isinstance(event, ContextLoading):
            self.set_context(event.address, event.identity, "loading", event.at)
            if event.from_cache:
                server = self.servers.get(event.address)
                if server is not None:
                    server.cached.add(event.identity)
        elif isinstance(event, ContextReady):
            self.set_context(event.address, event.identity, "ready", event.at, event.bytes)
            server = self.servers.get(event.address)
            model = event.gpu_model or (server.gpu_model if server else CPU_MODEL)
            self.measure.add_load(event.identity, model, event.address, event.load_seconds)
            if event.bytes:
                self.measure.bytes[event.identity] = int(event.bytes)
        elif isinstance(event, (ContextEvicted, ContextLoadFailed)):
            self.set_context(event.address, event.identity, None, event.at)
        elif isinstance(event, JobStarted):
            if event.key in self._done:
                return
            self._unassign(event.key)
            server = self.servers.get(event.address)
            if server is not None:
                server.running[event.key] = event.run_id
                server.started[event.key] = event.at
                server.running_context[event.key] = event.context
                self._where[event.key] = event.address
        elif isinstance(event, JobFinished):
            self._unassign(event.key)
            server = self.servers.get(event.address)
            if server is not None and event.context:
                placed = server.contexts.get(event.context)
                if placed is not None:
                    placed.last_used = max(placed.last_used, event.finished)
            if measure and event.ok and event.context and event.finished > event.started > 0:
                model = event.gpu_model or (server.gpu_model if server else CPU_MODEL)
                seconds = event.finished - event.started - event.load_seconds
                self.measure.add_job(event.context, model, seconds)

    def set_context(
        self, address: str, identity: str, state: str | None, at: float, nbytes: int = 0
    ) -> None:
        """Record that ``identity`` is loading, ready or gone (None) on a server, unless
        the view already knows a later state."""
        server = self.servers.get(address)
        if server is None:
            return
        placed = server.contexts.get(identity)
        if (placed is not None and placed.at > at) or server.gone.get(identity, -1.0) > at:
            return
        if state is None:
            server.contexts.pop(identity, None)
            server.gone[identity] = at
            self._unwarm(identity, address)
            return
        if placed is None:
            placed = server.contexts[identity] = Placed(state=state, at=at, last_used=at)
        placed.state, placed.at = state, at
        placed.bytes = int(nbytes or placed.bytes or self.measure.bytes.get(identity, 0))
        self.warm.setdefault(identity, set()).add(address)

    def _unwarm(self, identity: str, address: str) -> None:
        holders = self.warm.get(identity)
        if holders is not None:
            holders.discard(address)
            if not holders:
                del self.warm[identity]

    # -- this executor's jobs -------------------------------------------------------

    def dispatched(self, key: str, address: str, identity: str | None, at: float) -> None:
        """This executor handed ``key`` to ``address``; a cold context starts loading."""
        server = self.servers.get(address)
        if server is None:
            return
        self._unassign(key)
        server.assigned.add(key)
        self._where[key] = address
        if identity is not None and identity not in server.contexts:
            self.set_context(address, identity, "loading", at)

    def finished(
        self,
        key: str,
        address: str | None,
        *,
        identity: str | None = None,
        started: float = 0.0,
        loaded: Sequence[str] = (),
        reused: Sequence[str] = (),
        evicted: Sequence[str] = (),
        job_seconds: float | None = None,
        load_seconds: float = 0.0,
    ) -> None:
        """One of this executor's jobs ended: free its slot, learn from its result
        what its server now holds, and measure it (``job_seconds``: a successful
        job's time without loads)."""
        self._remember(self._done, key)
        self._unassign(key)
        if address is None or address not in self.servers:
            return
        model = self.servers[address].gpu_model
        if identity is not None and job_seconds is not None:
            self.measure.add_job(identity, model, job_seconds)
        if identity is not None and identity in loaded and len(loaded) == 1 and load_seconds:
            self.measure.add_load(identity, model, address, load_seconds)
        for gone in evicted:
            self.set_context(address, gone, None, started)
        for identity_ in (*loaded, *reused):
            self.set_context(address, identity_, "ready", started)
        if identity is not None and identity not in (*loaded, *reused):
            placed = self.servers[address].contexts.get(identity)
            if placed is not None and placed.state == "loading" and placed.at <= started:
                # The load it was dispatched for did not happen (the job failed first).
                self.set_context(address, identity, None, started)

    def where(self, key: str) -> str | None:
        """The server a key is assigned to or running on, as far as the view knows."""
        return self._where.get(key)

    def _unassign(self, key: str) -> None:
        address = self._where.pop(key, None)
        server = self.servers.get(address) if address else None
        if server is not None:
            server.assigned.discard(key)
            server.running.pop(key, None)
            server.started.pop(key, None)
            server.running_context.pop(key, None)

    def forget(self, key: str) -> None:
        """Drop a dispatched key without learning anything (cancelled, requeued)."""
        self.finished(key, None)

    def _remember(self, table: OrderedDict[str, None], key: str) -> None:
        table[key] = None
        if len(table) > DONE_MEMORY:
            table.popitem(last=False)

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
                        ident: [p.state, p.at, p.bytes, p.last_used]
                        for ident, p in s.contexts.items()
                    },
                    "cached": sorted(s.cached),
                    "running": dict(s.running),
                    "started": dict(s.started),
                    "running_context": dict(s.running_context),
                }
                for s in self.servers.values()
            ],
            "measure": self.measure.to_wire(),
        }

    def load_wire(self, data: Mapping[str, Any]) -> None:
        """Take over a snapshot (from the scheduler plugin's view)."""
        for item in data.get("servers", []):
            server = self.add_server(
                item["address"],
                name=item.get("name", ""),
                resources=item.get("resources", {}),
                slots=item.get("slots", 1),
            )
            server.gpu = item.get("gpu")
            server.gpu_model = item.get("gpu_model") or server.gpu_model
            server.budget = item.get("budget")
            server.cached.update(item.get("cached", []))
            server.running.update(item.get("running", {}))
            server.started.update(item.get("started", {}))
            server.running_context.update(item.get("running_context", {}))
            for key in item.get("running", {}):
                self._where[key] = server.address
            for identity, (state, at, nbytes, last_used) in item.get("contexts", {}).items():
                self.set_context(server.address, identity, state, float(at), int(nbytes))
                server.contexts[identity].last_used = float(last_used)
        self.measure.merge_wire(data.get("measure", {}))
