"""Placement policy as pure functions: which server should run a job, or why it waits.

No I/O here: the executor's dispatch state machine passes in the fleet's state
(:class:`~.state.FleetState`) and gets a :class:`Decision` back.

:func:`choose_server` picks, for one job, in this order: a server warm for the job's
context with a free slot; then one whose local cache holds the weights; then the
fastest free server by measured time for this context and GPU model; then any free
one. While a server holds (or is loading) the context but none of those has a free
slot, an idle server loads it when the work still to come for that context, shared
over the slots that hold it, takes longer than the load costs there
(:func:`expected_wait`, :func:`load_cost`): then the remaining work ends sooner with
the load than without it. Otherwise the job waits in the executor's queue. The work
to come is the run's (every job of the DAG that needs the context and has not ended,
not only the jobs Snakemake has handed over), and the load's cost is that of the
kind of load the server would do (from its local cache, or converting). Times not
measured yet are bounded from below by what is running (a job's elapsed time, a
load's), so a long first job does not keep an idle server idle, and nothing is
evicted on a guess.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from .eviction import Held, to_evict
from .state import ContextState, FleetState, ServerState

__all__ = [
    "PREFETCH",
    "Decision",
    "PlacementStep",
    "choose_server",
    "context_slots",
    "expected_wait",
    "load_cost",
    "victims",
]

#: Jobs a warm server may hold queued behind its running ones (see choose_server).
PREFETCH = 1


class PlacementStep(StrEnum):
    """The step of the policy that decided (stored as an attempt's ``placed_by``)."""

    WARM = "warm"
    """A server warm for the job's context had a free slot."""
    CACHED = "cached"
    """A free server whose local cache holds the weights."""
    FASTEST = "fastest"
    """The fastest free server by measured time on its GPU model."""
    ANY = "any"
    """Any free server (fewest contexts to evict first)."""
    PLAIN = "plain"
    """A job without a context, on the free server holding fewest contexts."""
    LOAD = "load"
    """A cold server: waiting for a warm slot would take longer than the load."""
    QUEUED = "queued"
    """Behind a running job on a warm server (prefetch)."""
    DASK = "dask"
    """Placement is Dask's (``--context-placement dask``)."""
    WAIT = "wait"
    """Not placed: a warm slot comes sooner than a load would finish."""
    UNMEASURED = "unmeasured"
    """Not placed: nothing measured or elapsed yet to weigh a load against."""
    BUSY = "busy"
    """Not placed: no free slot."""
    UNRUNNABLE = "unrunnable"
    """Not placed: no server has the resources."""


@dataclass(frozen=True)
class Decision:
    """Where a job goes now (``address``), or None: it waits in the executor's queue."""

    address: str | None
    step: PlacementStep
    reason: str = ""


def choose_server(
    view: FleetState,
    wanted: Mapping[str, float],
    identity: str | None,
    *,
    remaining: int = 1,
    demand: Mapping[str, int] | None = None,
    now: float | None = None,
    prefetch: int = PREFETCH,
) -> Decision:
    """Pick a server for one job (see the module's docstring for the order).

    ``wanted`` is the job's Dask resources (:func:`.resources.job_resources`),
    ``identity`` its context (None for a plain job), ``remaining`` the jobs of that
    context still to come (this one included), ``demand`` the same per context (a
    context with demand is costly to evict), and ``now`` the wall-clock time (for
    times not measured yet, see :func:`expected_wait`).

    When the job would wait for a warm slot (a measured wait shorter than a load, or
    no free slot anywhere), it is queued behind a running job on a warm server with
    fewer than ``prefetch`` jobs queued there (step ``queued``): the server starts it
    the moment its running job ends, instead of after the round trip through the
    executor (17-25 ms a job here, about 4% of an 8-claim SmolLM2 job on a CPU).
    """
    decision = _choose(view, wanted, identity, remaining, demand, now)
    if prefetch <= 0 or identity is None or decision.address is not None:
        return decision
    if decision.step in (PlacementStep.BUSY, PlacementStep.WAIT):
        holders = view.warm.get(identity, set())
        room = [
            view.servers[a]
            for a in view.runnable(wanted)
            if a in holders
            and view.servers[a].contexts[identity].state == ContextState.READY
            and view.servers[a].busy < view.servers[a].slots + prefetch
            and _held(view.servers[a], identity)
            < context_slots(view, view.servers[a], identity) + prefetch
            # Never behind a job whose length nothing measured yet: it may be long.
            and view.measure.job_seconds(identity, view.servers[a].gpu_model) is not None
        ]
        if room:
            best = min(room, key=lambda s: (s.busy, s.address))
            return Decision(
                best.address, PlacementStep.QUEUED, f"behind {best.busy} job(s) on a warm server"
            )
    return decision


def _choose(
    view: FleetState,
    wanted: Mapping[str, float],
    identity: str | None,
    remaining: int,
    demand: Mapping[str, int] | None,
    now: float | None,
) -> Decision:
    candidates = view.runnable(wanted)
    if not candidates:
        return Decision(None, PlacementStep.UNRUNNABLE, "no server has the resources")
    servers = view.servers
    candidates = [a for a in candidates if not _retires_first(view, servers[a], identity, now)]
    if not candidates:
        return Decision(None, PlacementStep.BUSY, "its servers retire before it would end")
    free = [servers[a] for a in candidates if servers[a].free]
    if identity in view.unshareable:  # its job takes a whole server: an idle one
        free = [s for s in free if s.busy == 0]
    if identity is None:
        if not free:
            return Decision(None, PlacementStep.BUSY, "no free slot")
        # Plain jobs keep off servers that hold contexts, as far as they can.
        best = min(free, key=lambda s: (len(s.contexts), s.busy, s.name, s.address))
        return Decision(best.address, PlacementStep.PLAIN)
    holders = view.warm.get(identity, set())
    warm = [servers[a] for a in candidates if a in holders]
    warm_free = [
        s for s in warm if s in free and _held(s, identity) < context_slots(view, s, identity)
    ]
    if warm_free:
        measure = view.measure

        def warm_key(s: ServerState) -> tuple[bool, float, int, str]:
            seconds = measure.job_seconds(identity, s.gpu_model)
            return (
                s.contexts[identity].state != ContextState.READY,
                math.inf if seconds is None else seconds,
                s.busy,
                s.address,
            )

        return Decision(min(warm_free, key=warm_key).address, PlacementStep.WARM)
    cold = [s for s in free if s.address not in holders]
    if not cold:
        return Decision(None, PlacementStep.BUSY, "no free slot")
    best, step = _best_cold(view, cold, identity)
    if not warm:
        return Decision(best.address, step)
    wait = expected_wait(view, identity, warm, remaining, now=now)
    cost = load_cost(view, identity, best, demand or {}, now=now)
    if wait <= 0:
        return Decision(None, PlacementStep.UNMEASURED, "no job time measured or elapsed yet")
    if wait > cost:
        return Decision(
            best.address, PlacementStep.LOAD, f"warm slot in {wait:.1f} s > load {cost:.1f} s"
        )
    return Decision(None, PlacementStep.WAIT, f"warm slot in {wait:.1f} s <= load {cost:.1f} s")


def _retires_first(
    view: FleetState, server: ServerState, identity: str | None, now: float | None
) -> bool:
    """Whether a job of this context would outlast the server (a pilot retiring before
    its walltime), by the job time measured for its context on the server's GPU model."""
    if server.retires_at is None or now is None or identity is None:
        return False
    seconds = view.measure.job_seconds(identity, server.gpu_model)
    return seconds is not None and now + seconds > server.retires_at


def _best_cold(
    view: FleetState, cold: Sequence[ServerState], identity: str
) -> tuple[ServerState, PlacementStep]:
    """The cold server to load on: one whose cache holds the weights, then the
    fastest by measured time for this context on its GPU model, then any (fewest
    contexts to evict first)."""
    cached = [s for s in cold if identity in s.cached]
    pool, step = (cached, PlacementStep.CACHED) if cached else (list(cold), PlacementStep.ANY)
    measure = view.measure
    speeds = {s.gpu_model: measure.job_seconds(identity, s.gpu_model) for s in pool}
    known = {model: seconds for model, seconds in speeds.items() if seconds is not None}
    if known:
        fastest = min(known.values())
        fast = [s for s in pool if known.get(s.gpu_model) == fastest]
        if len(fast) < len(pool) and step == PlacementStep.ANY:
            step = PlacementStep.FASTEST
        pool = fast
    return min(pool, key=lambda s: (len(s.contexts), s.busy, s.name, s.address)), step


def expected_wait(
    view: FleetState,
    identity: str,
    warm: Sequence[ServerState],
    remaining: int,
    *,
    now: float | None = None,
) -> float:
    """Seconds the warm slots need for the work still to come: ``remaining`` jobs
    times the job time, shared over the warm slots.

    The job time is the measured mean on the warm servers' GPU models; until one is
    measured, the longest time a job of this context has been running on a warm
    server since its context was ready (a lower bound that grows while it runs; 0
    before any has started).
    """
    times = [view.measure.job_seconds(identity, s.gpu_model) for s in warm]
    known = [t for t in times if t is not None]
    if known:
        seconds = sum(known) / len(known)
    else:
        seconds = _running_for(warm, identity, time.time() if now is None else now)
    slots = sum(context_slots(view, s, identity) for s in warm)
    return max(1, remaining) * seconds / max(1, slots)


def context_slots(view: FleetState, server: ServerState, identity: str | None) -> int:
    """The slots a server offers one context's jobs: what it said it runs of that
    context at once (its memory, :class:`~.events.ContextShared`); before it said so,
    one until a job of the context has been measured on the server's GPU model (a
    server runs one job of a context at a time until it knows the job's working
    memory), then all of them."""
    if identity is None or server.slots == 1:
        return server.slots
    if identity in server.shared:
        return min(server.slots, server.shared[identity])
    measured = view.measure.job_seconds(identity, server.gpu_model) is not None
    return server.slots if measured else 1


def _held(server: ServerState, identity: str | None) -> int:
    return sum(1 for held in server.holding.values() if held == identity)


def _running_for(warm: Sequence[ServerState], identity: str, now: float) -> float:
    longest = 0.0
    for server in warm:
        placed = server.contexts.get(identity)
        if placed is None or placed.state != ContextState.READY:
            continue
        for key, started in server.started.items():
            if server.holding.get(key) == identity:
                longest = max(longest, now - max(started, placed.at))
    return longest


def load_cost(
    view: FleetState,
    identity: str,
    server: ServerState,
    demand: Mapping[str, int],
    *,
    now: float | None = None,
) -> float:
    """Seconds a load of ``identity`` costs on ``server``: its measured load time
    there for the kind of load it would do (from its cache when its cache probe says
    the weights are there, else converting; see
    :meth:`.measure.Measurements.load_seconds`), plus the reload of every context it
    would evict that jobs still want. Evicting the last warm copy of a context with
    work to come costs too much to do at all: two contexts would take turns.

    Until a load is measured, the time a load of it in progress has taken so far
    stands in (a lower bound), and every eviction counts as infinitely costly: the
    policy never evicts on a guess.
    """
    measure = view.measure
    cached = identity in server.cached
    seconds = measure.load_seconds(identity, server.gpu_model, server.address, cached=cached)
    evicts = victims(server, identity, measure.bytes.get(identity))
    if seconds is None:
        if evicts:
            return math.inf
        now = time.time() if now is None else now
        loading = []
        for address in view.warm.get(identity, ()):
            placed = view.servers[address].contexts.get(identity)
            if placed is not None and placed.state == ContextState.LOADING:
                loading.append(now - placed.at)
        return max(loading, default=0.0)
    for victim in evicts:
        if demand.get(victim, 0) > 0:
            if view.warm.get(victim, set()) <= {server.address}:
                return math.inf  # its last warm copy, with work to come: never evicted
            reload = measure.load_seconds(
                victim, server.gpu_model, server.address, cached=victim in server.cached
            )
            seconds += reload if reload is not None else seconds
    return seconds


def victims(server: ServerState, identity: str, nbytes: int | None) -> list[str]:
    """The contexts a server would evict to make room for ``identity``, by the
    servers' own eviction order (:func:`.eviction.to_evict`). Without a known size
    or budget, every context it holds, least recently used first."""
    held = [
        Held(ident, placed.last_used, placed.bytes)
        for ident, placed in server.contexts.items()
        if ident != identity
    ]
    if not held:
        return []
    if not nbytes or server.budget is None or any(item.nbytes <= 0 for item in held):
        return [item.identity for item in sorted(held, key=lambda i: (i.last_used, i.identity))]
    return to_evict(held, nbytes, server.budget)
