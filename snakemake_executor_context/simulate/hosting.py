"""What a simulated server holds and needs: its attempts (:class:`Task`), the
contexts on it (:class:`Loaded`) and the loads it made (:class:`LoadMade`), the
transfers it serves its peers (:class:`Serving`), the turns at a shared source
(:class:`Turns`, the real pool's limit on loads from one source at once), and its
simulation (:class:`Host`)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from ..dispatch.vocabulary import JobTicket
from ..fleet import events as ev
from ..fleet.accounting import Load, load_stretches
from ..fleet.loads import LoadKind
from ..fleet.outcome import Outcome, ServerIdentity
from ..fleet.peerchoice import Holder, Rates
from ..server.slots.gate import Entry
from .clock import Clock
from .model import ContextModel, JobTimes, Storage
from .shared import Shared

__all__ = ["Host", "LoadMade", "Loaded", "Serving", "Task", "Turns"]


class Turns:
    """At most ``limit`` reads of one context from its source at once (the real
    pool's semaphore, :mod:`..server.loadturns`); 0: no limit. A turn covers the read
    of the source's bytes alone: the rest of the load (software start, state
    creation) is made after it is released, and a load from a peer or the local cache
    takes none."""

    def __init__(self, limit: int = 0) -> None:
        self.limit = limit
        self._held: dict[str, int] = {}
        self._waiting: dict[str, list[Callable[[], None]]] = {}

    def take(self, identity: str, start: Callable[[], None]) -> None:
        """Call ``start()`` (the read) once a turn is free (now, or when one is
        released)."""
        if self.limit <= 0 or self._held.get(identity, 0) < self.limit:
            self._held[identity] = self._held.get(identity, 0) + 1
            start()
        else:
            self._waiting.setdefault(identity, []).append(start)

    def cancel(self, identity: str, start: Callable[[], None]) -> None:
        """Give up waiting (the server is gone)."""
        waiting = self._waiting.get(identity, [])
        if start in waiting:
            waiting.remove(start)

    def release(self, identity: str) -> None:
        """End one turn (its read is done, or its server gone); the next waiting read
        starts."""
        if self.limit <= 0:
            return
        waiting = self._waiting.get(identity)
        if waiting:
            waiting.pop(0)()
        else:
            self._held[identity] = max(0, self._held.get(identity, 0) - 1)


class Host(Protocol):
    """What a server needs of its simulation."""

    clock: Clock
    times: JobTimes
    storage: Storage
    mode: str
    rng: random.Random
    turns: Turns
    filesystem: Shared
    run_id: str

    def context(self, identity: str) -> ContextModel: ...

    def emit(self, event: ev.Event) -> None: ...

    def ended(self, key: str, outcome: Outcome) -> None: ...

    def holders(self, identity: str, address: str) -> list[Serving]:
        """The other running servers whose local disk holds the context's template."""
        ...

    def rates(self, identity: str, gpu_model: str) -> Rates:
        """The fleet's measured rates of the context's loads and transfers (the hub's)."""
        ...

    def note(self, what: str, detail: str) -> None: ...


class Serving:
    """A server's side of peer transfers: the transfers of templates it serves now,
    by session, each with its expected end."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.sessions: dict[str, float] = {}

    def holder(self, limit: int, now: float) -> Holder:
        """What it answers a receiver that asks, serving at most ``limit`` at once."""
        spare = limit - len(self.sessions)
        wait = min(self.sessions.values()) - now if spare <= 0 and self.sessions else None
        return Holder(self.address, spare, wait)


@dataclass
class Task:
    """One attempt on the server."""

    key: str
    ticket: JobTicket
    items: int
    arrived: float
    entry: Entry
    started: float | None = None
    load_seconds: float = 0.0
    loaded: bool = False
    evicted: tuple[str, ...] = ()
    conversions: int = 0
    reload_seconds: float | None = None
    #: Finishing in a drain's grace (it is not handed back).
    finishing: bool = False

    def outcome(self, server: ServerIdentity, finished: float, gpu_model: str) -> Outcome:
        """The record a real server seals when the attempt ends ok."""
        identity = self.ticket.identity
        return Outcome(
            key=self.key,
            server=server,
            ok=True,
            started=self.started if self.started is not None else finished,
            finished=finished,
            items=self.items,
            context=identity,
            gpu_model=gpu_model,
            load_seconds=self.load_seconds,
            loaded=(identity,) if self.loaded and identity else (),
            reused=(identity,) if identity and not self.loaded else (),
            evicted=self.evicted,
            conversions=self.conversions,
            reload_seconds=self.reload_seconds,
        )


@dataclass
class Loaded:
    """A context on the server."""

    identity: str
    nbytes: int
    loading: bool = True
    since: float = 0.0
    last_used: float = 0.0
    pins: int = 0
    #: Tasks waiting for its load to end.
    waiters: list[Task] = field(default_factory=list)
    #: The load in progress: its kind, start, the attempt that does it, and where it
    #: is: "turn" (waiting for a turn at the source), "move" (its bytes: from the
    #: source, the read, in the turn), "rest" (beyond moving: software start and
    #: state creation, outside any turn).
    kind: LoadKind = LoadKind.SOURCE
    load_start: float = 0.0
    loader: str = ""
    phase: str = ""
    start_move: Callable[[], None] | None = None
    #: A fetch from a peer ("fetch"): its end on the holder's side (the server is gone).
    stop_fetch: Callable[[], None] | None = None
    #: Seconds from the load's start to its template's arrival from a peer (None: it
    #: fetched nothing).
    peer_seconds: float | None = None

    @property
    def takes_turn(self) -> bool:
        """Whether its load reads the shared source (and so takes a turn there for
        the read)."""
        return self.kind in (LoadKind.SOURCE, LoadKind.CONVERSION)


class LoadMade(NamedTuple):
    """A load a server made (or began, when ``lost``: its server left first), as its
    ``ContextReady`` told it: where it read, the attempt that made it."""

    start: float
    end: float
    kind: LoadKind
    attempt: str
    context: str = ""
    lost: bool = False
    reload_seconds: float | None = None
    peer_seconds: float | None = None

    def stretches(self) -> list[Load]:
        """The ledger's stretches of it, one per kind, as the catalog's account of a
        real load cuts them (:func:`~..fleet.accounting.load_stretches`)."""
        if self.lost:
            return [Load(self.start, self.end, self.kind, self.context, lost=True)]
        return load_stretches(
            self.start,
            self.end,
            self.context,
            from_cache=self.kind == LoadKind.CACHE,
            conversions=int(self.kind == LoadKind.CONVERSION),
            reload_seconds=self.reload_seconds,
            peer_seconds=self.peer_seconds,
        )
