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
the load than without it. Before any job of the context is measured, an idle server
loads it when its jobs not yet running are at least :data:`COLD_START_JOBS` per server
that would then hold it (:func:`cold_start_load`: a run's first minute, a pilot that
joins before anything is measured). Otherwise the job waits in the executor's queue. The work
to come is the run's (every job of the DAG that needs the context and has not ended,
not only the jobs Snakemake has handed over), and the load's cost is that of the
kind of load the server would do (from its local cache, or converting). Times not
measured yet are bounded from below by what is running (a job's elapsed time, a
load's), so a long first job does not keep an idle server idle, and nothing is
evicted on a guess.

With survival placement on (``FleetState.survival_placement``,
``--context-tuning survival_placement``), each server's estimated survival
(:mod:`.survival`) weighs in, in three places: among cold servers, the one likeliest to
live through the load and a job goes first (servers at least :data:`.survival.LIKELY`
to do so are alike); a load's cost is divided by that chance (the expected cost of a
load that may have to be done again elsewhere), so a server likely to be lost first
waits for a warm slot instead; among warm servers, a job goes to one likely to live
through it before one that is not. Off, or with no lives seen (the prior is the same
for every server), placement is as above.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from .eviction import Held, to_evict
from .state import ContextState, FleetState, ServerState
from .survival import LIKELY, UNMEASURED_SPAN

__all__ = [
    "COLD_START_JOBS",
    "PREFETCH",
    "Decision",
    "PlacementStep",
    "choose_server",
    "cold_start_load",
    "context_slots",
    "expected_wait",
    "load_cost",
    "survival_chance",
    "victims",
]

#: Jobs a warm server may hold queued behind its running ones (see choose_server).
PREFETCH = 1

#: Before anything is measured, a context's jobs not yet started, per server that
#: would hold it, for one more server to load it (:func:`cold_start_load`): 8 jobs
#: and 2 idle servers, both load; 3 jobs, one does.
COLD_START_JOBS = 4


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
    LIVELIEST = "liveliest"
    """A cold server: the likeliest to live through the load and a job (survival)."""
    COLD_START = "cold-start"
    """A cold server, nothing measured yet: enough jobs to come for one more holder."""
    QUEUED = "queued"
    """Behind a running job on a warm server (prefetch)."""
    DASK = "dask"
    """Placement is Dask's (``--context-tuning placement=dask``)."""
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
    now: float,
    prefetch: int = PREFETCH,
) -> Decision:
    """Pick a server for one job (see the module's docstring for the order).

    ``wanted`` is the job's Dask resources (:func:`.resources.job_resources`),
    ``identity`` its context (None for a plain job), ``remaining`` the jobs of that
    context still to come (this one included), ``demand`` the same per context (a
    context with demand is costly to evict), and ``now`` the time of the decision
    (for times not measured yet, see :func:`expected_wait`, and for pilots that
    retire): given, never read from a clock, so a simulation can drive it.

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
        # No room before a job is measured (below); then the holders, or the servers
        # with room (busy < slots + prefetch) if fewer.
        holders = view.warm.get(identity, set()) if view.measure.measured_jobs(identity) else set()
        runnable = view.index.candidates(view.servers, wanted).runnable_set
        spare = 1 - prefetch
        pool = view.index.with_spare(spare) if view.index.count(spare) < len(holders) else holders
        room = [
            server
            for server in (view.servers[a] for a in pool if a in holders and a in runnable)
            if server.contexts[identity].state == ContextState.READY
            and server.busy < server.slots + prefetch
            and _held(server, identity) < context_slots(view, server, identity) + prefetch
            # Never behind a job whose length nothing measured yet: it may be long.
            and view.measure.job_seconds(identity, server.gpu_model) is not None
        ]
        if room:
            best = min(room, key=lambda s: (s.busy, _working_since(s, identity, now), s.address))
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
    now: float,
) -> Decision:
    found = view.index.candidates(view.servers, wanted)
    if not found.runnable:
        return Decision(None, PlacementStep.UNRUNNABLE, "no server has the resources")
    servers = view.servers
    # found.fewest: never across nodes when one node has what the job needs (the
    # collectives between nodes are the slow part of a gang; one GPU gains nothing).
    retired = {a for a in found.retiring if _retires_first(view, servers[a], identity, now)}
    if len(retired) == len(found.fewest):
        return Decision(None, PlacementStep.BUSY, "its servers retire before it would end")
    # Free candidates, in any order: each choice below is a minimum over a unique key.
    if view.index.count(1) < len(found.fewest):
        usable = [a for a in view.index.with_spare(1) if a in found.fewest_set]
    else:
        usable = [a for a in found.fewest if servers[a].free]
    free = [servers[a] for a in usable if a not in retired]
    if identity in view.unshareable:  # its job takes a whole server: an idle one
        free = [s for s in free if s.busy == 0]
    if identity is None:
        if not free:
            return Decision(None, PlacementStep.BUSY, "no free slot")
        # Plain jobs keep off servers that hold contexts, as far as they can.
        best = min(free, key=lambda s: (len(s.contexts), s.busy, s.name, s.address))
        return Decision(best.address, PlacementStep.PLAIN)
    holders = view.warm.get(identity, set())
    warm_free = [
        s
        for s in free
        if s.address in holders and _held(s, identity) < context_slots(view, s, identity)
    ]
    if warm_free:
        measure = view.measure

        def warm_key(s: ServerState) -> tuple[bool, float, float, int, str]:
            seconds = measure.job_seconds(identity, s.gpu_model)
            lives = survival_chance(view, s, seconds or 0.0, now) if seconds else 1.0
            return (
                s.contexts[identity].state != ContextState.READY,
                -lives,
                math.inf if seconds is None else seconds,
                s.busy,
                s.address,
            )

        return Decision(min(warm_free, key=warm_key).address, PlacementStep.WARM)
    cold = [s for s in free if s.address not in holders]
    if not cold:
        return Decision(None, PlacementStep.BUSY, "no free slot")
    best, step = _best_cold(view, cold, identity, now)
    # In the candidates' order: expected_wait's mean adds their times in it.
    warm = [servers[a] for a in found.fewest if a in holders and a not in retired]
    if not warm:
        return Decision(best.address, step)
    lives = _survives_load(view, identity, best, now)
    if cold_start_load(view, identity, best, warm, remaining, demand or {}) and lives >= 0.5:
        return Decision(
            best.address,
            PlacementStep.COLD_START,
            f"nothing measured yet, {remaining} job(s) to come for {len(warm) + 1} server(s)",
        )
    wait = expected_wait(view, identity, warm, remaining, now=now)
    cost = load_cost(view, identity, best, demand or {}, now=now)
    if wait <= 0:
        return Decision(None, PlacementStep.UNMEASURED, "no job time measured or elapsed yet")
    chance = f", {lives:.0%} it lives through it" if lives < 1.0 else ""
    if lives < 1.0:
        cost = cost / lives if lives > 0 else math.inf
    if wait > cost:
        return Decision(
            best.address,
            PlacementStep.LOAD,
            f"warm slot in {wait:.1f} s > load {cost:.1f} s{chance}",
        )
    return Decision(
        None, PlacementStep.WAIT, f"warm slot in {wait:.1f} s <= load {cost:.1f} s{chance}"
    )


def cold_start_load(
    view: FleetState,
    identity: str,
    server: ServerState,
    holders: Sequence[ServerState],
    remaining: int,
    demand: Mapping[str, int],
) -> bool:
    """Whether ``server``, idle and cold, loads ``identity`` beside ``holders`` (the
    servers that hold or are loading it) while nothing says what its jobs or loads cost:
    no job of the context measured on any GPU model (in this run, or in the catalog's
    history the run started from). It does when the context's jobs not yet running
    against a loaded copy are at least :data:`COLD_START_JOBS` for each server that
    would then hold it, the load evicts nothing (this rule never makes room on a
    guess), and no other context with jobs to come (``demand``) has no copy at all:
    an idle server goes to a context nobody holds before it becomes another copy.
    A job placed on a server that is still loading has not started, whatever that
    server's job event says. Once a job is measured, the measured rule decides."""
    if view.measure.measured_jobs(identity):
        return False
    if victims(server, identity, view.measure.bytes.get(identity)):
        return False
    if any(n > 0 and not view.warm.get(other) for other, n in demand.items() if other != identity):
        return False
    running = 0
    for holder in holders:
        placed = holder.contexts.get(identity)
        if placed is None or placed.state != ContextState.READY:
            continue
        running += sum(1 for key in holder.started if holder.holding.get(key) == identity)
    return remaining - running >= COLD_START_JOBS * (len(holders) + 1)


def _retires_first(view: FleetState, server: ServerState, identity: str | None, now: float) -> bool:
    """Whether a job of this context would outlast the server (a pilot retiring before
    its walltime), by the job time measured for its context on the server's GPU model."""
    if server.retires_at is None or identity is None:
        return False
    seconds = view.measure.job_seconds(identity, server.gpu_model)
    return seconds is not None and now + seconds > server.retires_at


def _best_cold(
    view: FleetState, cold: Sequence[ServerState], identity: str, now: float
) -> tuple[ServerState, PlacementStep]:
    """The cold server to load on: one whose cache holds the weights, then (survival
    placement on) the likeliest to live through the load and a job, then the fastest by
    measured time for this context on its GPU model, then any (fewest contexts to
    evict first)."""
    cached = [s for s in cold if identity in s.cached]
    pool, step = (cached, PlacementStep.CACHED) if cached else (list(cold), PlacementStep.ANY)
    if view.survival_placement and len(pool) > 1:
        lives = {s.address: _survives_load(view, identity, s, now) for s in pool}
        likeliest = max(lives.values())
        longest = [s for s in pool if lives[s.address] >= likeliest]
        if len(longest) < len(pool) and step == PlacementStep.ANY:
            step = PlacementStep.LIVELIEST
        pool = longest
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
    now: float,
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
    seconds = sum(known) / len(known) if known else _running_for(warm, identity, now)
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


def _working_since(server: ServerState, identity: str, now: float) -> float:
    """When the longest-running job on ``server`` began its work (counted from when
    ``identity`` was ready there, since a job waits for its load): the server whose
    job began first is the likeliest to free a slot first. ``now`` if none started."""
    ready = server.contexts[identity].at
    return min((max(started, ready) for started in server.started.values()), default=now)


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
    now: float,
) -> float:
    """Seconds a load of ``identity`` costs on ``server``: its measured load time
    there for the kind of load it would do (from its cache when its cache probe says
    the weights are there, else from a peer whose cache holds them, else converting; see
    :meth:`.measure.Measurements.load_seconds`), plus the reload of every context it
    would evict that jobs still want. Evicting the last warm copy of a context with
    work to come costs too much to do at all: two contexts would take turns.

    Until a load is measured, the time a load of it in progress has taken so far
    stands in (a lower bound), and every eviction counts as infinitely costly: the
    policy never evicts on a guess.
    """
    measure = view.measure
    cached = identity in server.cached
    from_peer = view.peer_transfers and any(
        identity in other.cached for other in view.servers.values() if other is not server
    )
    seconds = measure.load_seconds(
        identity, server.gpu_model, server.address, cached=cached, from_peer=from_peer
    )
    evicts = victims(server, identity, measure.bytes.get(identity))
    if seconds is None:
        if evicts:
            return math.inf
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


def survival_chance(view: FleetState, server: ServerState, span: float, now: float) -> float:
    """The chance ``server`` lives ``span`` seconds more, as placement weighs it: 1
    with survival placement off, and at least :data:`~.survival.LIKELY` counts as 1
    (servers that likely are alike). A pilot's retirement before then makes it 0
    only where survival placement is on (off, :func:`_retires_first` keeps jobs off
    it)."""
    if not view.survival_placement or span <= 0:
        return 1.0
    chance = view.survival.survives(server.address, span, now=now, retires_at=server.retires_at)
    return 1.0 if chance >= LIKELY else chance


def _survives_load(view: FleetState, identity: str, server: ServerState, now: float) -> float:
    """:func:`survival_chance` of ``server`` over a load of ``identity`` and one of its
    jobs there (1 at once with survival placement off: nothing measured is read)."""
    if not view.survival_placement:
        return 1.0
    return survival_chance(view, server, _load_and_job(view, identity, server), now)


def _load_and_job(view: FleetState, identity: str, server: ServerState) -> float:
    """Seconds a load of ``identity`` on ``server`` and one of its jobs take there, as
    measured; :data:`UNMEASURED_SPAN` while neither is."""
    measure = view.measure
    load = measure.load_seconds(
        identity, server.gpu_model, server.address, cached=identity in server.cached
    )
    job = measure.job_seconds(identity, server.gpu_model)
    if load is None and job is None:
        return UNMEASURED_SPAN
    return (load or 0.0) + (job or 0.0)
