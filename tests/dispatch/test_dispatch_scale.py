"""Placement and dispatch at scale take the decisions they took before their indexes
and their memory of refusals (issue 26): the fleet state's indexes against a scan of
every server, placement against the scanning policy it replaced (kept below, as it
was), and simulated runs against the same runs with every queued job asked about on
every pass. Small and quick; the speed itself is a benchmark
(``workflows/bench/simulate.py control``, docs/simulator.md)."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from snakemake_executor_context.dispatch import machine as dispatch_module
from snakemake_executor_context.dispatch import vocabulary as v
from snakemake_executor_context.dispatch.inflight import WHATEVER_REMAINS, Refusals
from snakemake_executor_context.dispatch.machine import Dispatch
from snakemake_executor_context.fleet import events as ev
from snakemake_executor_context.fleet import placement
from snakemake_executor_context.fleet.loads import LoadKind
from snakemake_executor_context.fleet.placement import Decision, PlacementStep
from snakemake_executor_context.fleet.state import ContextState, FleetState, ServerState
from snakemake_executor_context.simulate import engine
from snakemake_executor_context.simulate.model import (
    Fleet,
    JobTimes,
    Options,
    PoolSpec,
    Preemption,
    ServerKind,
    Storage,
)
from snakemake_executor_context.simulate.workload import from_spec
from tests.dispatch.test_dispatch import of, ticket

# -- the policy as it was: a scan of every server for each job ------------------------


def scanning_choose(view, wanted, identity, *, remaining=1, demand=None, now, prefetch=1):
    """choose_server before its indexes (the parent of this test's commit)."""
    decision = _scanning(view, wanted, identity, remaining, demand, now)
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
            and placement._held(view.servers[a], identity)
            < placement.context_slots(view, view.servers[a], identity) + prefetch
            and view.measure.job_seconds(identity, view.servers[a].gpu_model) is not None
        ]
        if room:
            best = min(
                room, key=lambda s: (s.busy, placement._working_since(s, identity, now), s.address)
            )
            return Decision(
                best.address, PlacementStep.QUEUED, f"behind {best.busy} job(s) on a warm server"
            )
    return decision


def _scanning(view, wanted, identity, remaining, demand, now):
    candidates = view.runnable(wanted)
    if not candidates:
        return Decision(None, PlacementStep.UNRUNNABLE, "no server has the resources")
    servers = view.servers
    fewest = min(servers[a].nodes for a in candidates)
    candidates = [a for a in candidates if servers[a].nodes == fewest]
    candidates = [
        a for a in candidates if not placement._retires_first(view, servers[a], identity, now)
    ]
    if not candidates:
        return Decision(None, PlacementStep.BUSY, "its servers retire before it would end")
    free = [servers[a] for a in candidates if servers[a].free]
    if identity in view.unshareable:
        free = [s for s in free if s.busy == 0]
    if identity is None:
        if not free:
            return Decision(None, PlacementStep.BUSY, "no free slot")
        best = min(free, key=lambda s: (len(s.contexts), s.busy, s.name, s.address))
        return Decision(best.address, PlacementStep.PLAIN)
    holders = view.warm.get(identity, set())
    warm = [servers[a] for a in candidates if a in holders]
    warm_free = [
        s
        for s in warm
        if s in free and placement._held(s, identity) < placement.context_slots(view, s, identity)
    ]
    if warm_free:

        def warm_key(s: ServerState) -> tuple[bool, float, int, str]:
            seconds = view.measure.job_seconds(identity, s.gpu_model)
            ready = s.contexts[identity].state != ContextState.READY
            return (ready, math.inf if seconds is None else seconds, s.busy, s.address)

        return Decision(min(warm_free, key=warm_key).address, PlacementStep.WARM)
    cold = [s for s in free if s.address not in holders]
    if not cold:
        return Decision(None, PlacementStep.BUSY, "no free slot")
    best, step = placement._best_cold(view, cold, identity, now)
    if not warm:
        return Decision(best.address, step)
    if placement.cold_start_load(view, identity, best, warm, remaining, demand or {}):
        return Decision(
            best.address,
            PlacementStep.COLD_START,
            f"nothing measured yet, {remaining} job(s) to come for {len(warm) + 1} server(s)",
        )
    wait = placement.expected_wait(view, identity, warm, remaining, now=now)
    cost = placement.load_cost(view, identity, best, demand or {}, now=now)
    if wait <= 0:
        return Decision(None, PlacementStep.UNMEASURED, "no job time measured or elapsed yet")
    if wait > cost:
        return Decision(
            best.address, PlacementStep.LOAD, f"warm slot in {wait:.1f} s > load {cost:.1f} s"
        )
    return Decision(None, PlacementStep.WAIT, f"warm slot in {wait:.1f} s <= load {cost:.1f} s")


# -- random fleets: the indexes and the policy against the scan --------------------------

CONTEXTS = ("a" * 64, "b" * 64, "c" * 64)
MODELS = ("a10", "titanx", "h100")
WANTS = ({"gpu": 1}, {"gpu": 2}, {"gpu": 1, "gpu_model:a10": 1}, {"gpu": 1, "mem_mb": 5e4})
NOW = 100.0


def _random_fleet(rng: random.Random) -> FleetState:
    view = FleetState()
    view.note_context(CONTEXTS[2], shareable=False)
    addresses = [f"tcp://s{i:02d}" for i in range(rng.randint(1, 14))]
    for address in addresses:
        model = rng.choice(MODELS)
        resources = {"gpu": rng.choice((1, 1, 2)), f"gpu_model:{model}": 1, "mem_mb": 64000}
        slots = rng.choice((1, 2, 4))
        view.add_server(address, name=address[-3:], resources=resources, slots=slots)
        retires = rng.choice((None, None, NOW + 1, NOW + 30))
        budget = rng.choice((0, 100, 1000))
        view.apply(ev.ServerDescribed(address=address, memory_budget=budget, retires_at=retires))
        if rng.random() < 0.3:
            view.servers[address].cached.add(rng.choice(CONTEXTS))
    if len(addresses) > 3 and rng.random() < 0.4:  # a server across two nodes
        leader, member = addresses[:2]
        view.apply(
            ev.GangAssembled(leader=leader, members=[member], nodes=["n1", "n2"], devices=[1, 1])
        )
    for n, address in enumerate(addresses):
        for identity in rng.sample(CONTEXTS, rng.randint(0, 2)):
            state = rng.choice((ContextState.READY, ContextState.READY, ContextState.LOADING))
            view.set_context(address, identity, state, rng.uniform(0, 50), rng.choice((0, 60)))
            if rng.random() < 0.3:
                view.apply(ev.ContextShared(address=address, identity=identity, jobs=2))
        for k in range(rng.randint(0, 5)):
            held = rng.choice((*view.servers[address].contexts, None))
            view.dispatched(f"job-{n}-{k}", address, held, rng.uniform(0, 90))
            if rng.random() < 0.7:
                view.mark_started(f"job-{n}-{k}", rng.uniform(0, 90))
    for identity in CONTEXTS:
        for model in rng.sample(MODELS, rng.randint(0, 3)):
            view.measure.add_job(identity, model, rng.uniform(1, 20))
            if rng.random() < 0.6:
                view.measure.add_load(identity, model, addresses[0], rng.uniform(1, 40))
    return view


def _index_matches_a_scan(view: FleetState) -> None:
    for spare in (-2, -1, 0, 1, 2):
        scan = {a for a, s in view.servers.items() if s.slots - s.busy >= spare}
        assert set(view.index.with_spare(spare)) == scan
        assert view.index.count(spare) == len(scan)


@pytest.mark.parametrize("seed", range(40))
def test_placement_decides_as_the_scan_of_every_server_did(seed):
    rng = random.Random(seed)
    view = _random_fleet(rng)
    for _ in range(12):
        _index_matches_a_scan(view)
        for wanted in WANTS:
            for identity in (*CONTEXTS, None):
                for remaining in (1, 3, 40):
                    demand = {i: rng.choice((0, 5, 50)) for i in CONTEXTS}
                    for prefetch in (0, 1, 2):
                        kwargs = dict(remaining=remaining, demand=demand, now=NOW)
                        real = placement.choose_server(
                            view, wanted, identity, prefetch=prefetch, **kwargs
                        )
                        assert real == scanning_choose(
                            view, wanted, identity, prefetch=prefetch, **kwargs
                        )
                        if real.address is None and real.step in WHATEVER_REMAINS:
                            for other in (1, 2, 1000):
                                again = dict(kwargs, remaining=other)
                                assert real == placement.choose_server(
                                    view, wanted, identity, prefetch=prefetch, **again
                                )
        _mutate(view, rng)


def _mutate(view: FleetState, rng: random.Random) -> None:
    """One change of the kinds a run makes: a slot freed or taken, a server gone or
    come or retiring, a context evicted."""
    addresses = list(view.servers)
    what = rng.randrange(6)
    if what == 0 and view._where:
        view.release(rng.choice(sorted(view._where)))
    elif what == 1 and addresses:
        address = rng.choice(addresses)
        held = rng.choice((*CONTEXTS, None))
        view.dispatched(f"late-{rng.random()}", address, held, NOW - 1)
    elif what == 2 and len(addresses) > 1:
        view.apply(ev.ServerLeft(address=rng.choice(addresses)))
    elif what == 3:
        address = f"tcp://new{rng.randrange(1000)}"
        view.apply(ev.ServerJoined(address=address, slots=2, resources={"gpu": 1}))
    elif what == 4 and addresses:
        retires = rng.choice((None, NOW + 1, NOW + 30))
        view.apply(ev.ServerDescribed(address=rng.choice(addresses), retires_at=retires))
    elif addresses:
        address = rng.choice(addresses)
        identity = rng.choice(CONTEXTS)
        view.apply(ev.ContextEvicted(address=address, identity=identity, at=NOW - 1))


def test_refusals_hold_until_a_placement():
    refusals = Refusals()
    key = frozenset({("gpu", 1.0)})
    busy, wait = Decision(None, PlacementStep.BUSY), Decision(None, PlacementStep.WAIT)
    refusals.refused(key, "a", 5, wait)
    assert refusals.get(key, "a", 5) is wait
    assert refusals.get(key, "a", 6) is None and refusals.get(key, "b", 5) is None
    refusals.refused(key, "a", 6, busy)
    assert refusals.get(key, "a", 7) is busy  # busy whatever the work to come
    refusals.forget()
    assert refusals.get(key, "a", 5) is None


# -- one pass over the queue ---------------------------------------------------------

A, B = CONTEXTS[:2]


def _polled(at: float, *names: str) -> v.ServersPolled:
    workers = {f"tcp://{n}": {"name": n, "resources": {"gpu": 1}, "slots": 1} for n in names}
    return v.ServersPolled(workers, at)


def _held_back(jobs: list[tuple[int, str]], plan: dict[str, str] | None) -> Dispatch:
    """s0 loading A for job 0 and ``jobs`` queued behind it (membership from polls)."""
    dispatch = Dispatch("run-1", embedded=False, wait_for_server=1e9)
    dispatch.hub = False
    if plan is not None:
        dispatch.handle(v.DagPlanned(plan, 0.0))
    dispatch.handle(_polled(1.0, "s0"))
    (placed,) = of(dispatch.handle(v.JobReady(ticket(0, identity=A), 1.1)), v.Submit)
    assert placed.address == "tcp://s0"
    for n, identity in jobs:
        assert not of(dispatch.handle(v.JobReady(ticket(n, identity=identity), 1.2)), v.Submit)
    return dispatch


def _submits(commands: list) -> list[tuple[str, str | None, str]]:
    return [(c.ticket.jobid, c.address, str(c.step)) for c in of(commands, v.Submit)]


def test_a_refusal_is_forgotten_once_a_job_is_placed():
    """A's job waits while B, with work to come, has no copy anywhere; B's job is
    placed; A's next job, asking what the first asked, now starts a second copy."""
    plan = {str(n): A for n in range(20)} | {str(n): B for n in range(20, 25)}
    dispatch = _held_back([(1, A), (20, B), (2, A)], plan)
    out = dispatch.handle(_polled(2.0, "s0", "s1", "s2"))
    assert _submits(out) == [("20", "tcp://s1", "any"), ("2", "tcp://s2", "cold-start")]


def test_without_a_dag_the_work_to_come_is_the_jobs_held():
    """No DAG named A or B: their demand is the jobs the machine holds, so B's one
    queued job keeps A's eighth from a second copy while B has none."""
    dispatch = _held_back([*((n, A) for n in range(1, 10)), (20, B)], None)
    assert dispatch.demand.unplanned
    out = dispatch.handle(_polled(2.0, "s0", "s1", "s2"))
    assert _submits(out) == [("20", "tcp://s1", "any")]


# -- whole runs: the same event log as with every job asked about on every pass ---------


def _workload():
    made = from_spec(
        "scale",
        {
            "contexts": {
                "a": {"bytes": 30e9},
                "b": {"bytes": 30e9},
                "c": {"bytes": 50e9, "shareable": False},
            },
            "stages": [
                {"rule": "ra", "context": "a", "items": 900, "per_job": 10},
                {"rule": "rb", "context": "b", "items": 600, "per_job": 10, "priority": 2},
                {"rule": "plain", "count": 12},
                {"rule": "rc", "context": "c", "count": 20, "after": ["rb"]},
                {"rule": "rd", "context": "a", "count": 30, "after": ["rc"], "gpu_model": "a10"},
            ],
        },
    )
    for context in made.contexts.values():
        context.load = {LoadKind.SOURCE: 12.0, LoadKind.CACHE: 3.0}
    return made


TIMES = JobTimes(
    item={("ra", "*"): 0.3, ("rb", "*"): 0.3, ("rc", "*"): 3, ("rd", "*"): 3, ("plain", "*"): 1},
    slowdown={"titanx": 2.0, "a10": 1.0, "h100": 0.4},
    cv=0.3,
    slot_gain={2: 1.6},
)
KINDS = [
    ServerKind("a10", 5, slots=2, budget=int(70e9)),
    ServerKind("titanx", 4, budget=int(70e9)),
    ServerKind("h100", 2, slots=2, budget=int(120e9)),
]
STORAGE = Storage(shared_bandwidth=2e9, local_bandwidth=1e9, peer_bandwidth=1e9, peer=True)
RUNS = {
    "killed": (Fleet(KINDS, restart=5.0), Preemption(rates={"titanx": 2 / 60, "a10": 1 / 60})),
    "drained": (Fleet(KINDS), Preemption(rates={"*": 2 / 60}, signal="TERM", grace=10.0)),
    "pilots": (
        Fleet(KINDS, pool=PoolSpec(maximum=8, queue_wait=5.0, walltime=150.0, retire_margin=20)),
        Preemption(),
    ),
}


def _run(name: str, *, planned: bool = True, jobs: int = 24):
    fleet, preemption = RUNS[name]
    sim = engine.Simulation(
        _workload(),
        fleet,
        TIMES,
        storage=STORAGE,
        preemption=preemption,
        options=Options(seed=5, jobs=jobs, limit=3000.0),
    )
    handle = sim.dispatch.handle
    commands: list[str] = []

    def recorded(stimulus: v.Stimulus) -> list[v.Command]:
        if isinstance(stimulus, v.DagPlanned) and not planned:
            return []  # a run whose DAG named no context: the jobs held are counted
        out = handle(stimulus)
        commands.extend(repr(c) for c in out if not isinstance(c, v.Record))
        return out

    sim.dispatch.handle = recorded  # type: ignore[method-assign]
    result = sim.run()
    return result, commands


@pytest.mark.parametrize(
    ("name", "planned", "jobs"),
    [("killed", True, 24), ("drained", True, 60), ("pilots", True, 24), ("killed", False, 60)],
)
def test_a_run_is_the_run_that_asked_about_every_job_on_every_pass(
    monkeypatch, name, planned, jobs
):
    fast, fast_commands = _run(name, planned=planned, jobs=jobs)
    with monkeypatch.context() as patch:
        patch.setattr(dispatch_module, "choose_server", scanning_choose)
        patch.setattr(Refusals, "get", lambda self, *args: None)
        slow, slow_commands = _run(name, planned=planned, jobs=jobs)
    assert fast.jobs > 50 and len(fast.events) > 300
    assert fast.events == slow.events
    assert fast_commands == slow_commands
    assert replace(fast, wall=0.0, dispatch_cpu=0.0) == replace(slow, wall=0.0, dispatch_cpu=0.0)
