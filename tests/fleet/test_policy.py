"""Pure placement policy over the in-memory fleet view, and the view's upkeep from
events (no cluster, no database)."""

from __future__ import annotations

import math

from snakemake_executor_context.fleet import events as ev
from snakemake_executor_context.fleet.outcome import Outcome, ServerIdentity
from snakemake_executor_context.fleet.placement import (
    choose_server,
    expected_wait,
    load_cost,
    victims,
)
from snakemake_executor_context.fleet.resources import Requirements, job_resources
from snakemake_executor_context.fleet.state import FleetState

GPU1 = job_resources(Requirements(gpu=1))


#: The time of a decision where a test names none: after every event of these tests
#: (placement reads no clock: it is told the time).
NOW = 1000.0


def choose(*args, **kwargs):
    """The policy without prefetching (tested on its own below)."""
    kwargs.setdefault("now", NOW)
    return choose_server(*args, prefetch=kwargs.pop("prefetch", 0), **kwargs)


A, B = "a" * 64, "b" * 64


def _fleet(models=("h200", "h200", "h200", "h200"), warm=(0, 1), budget=None) -> FleetState:
    """Servers s0.. of the given GPU models; those in ``warm`` hold context A."""
    view = FleetState()
    for i, model in enumerate(models):
        server = view.add_server(
            f"tcp://s{i}",
            name=f"s{i}",
            resources={"gpu": 1, "mem_mb": 64000, f"gpu_model:{model}": 1},
            slots=1,
        )
        server.budget = budget
    for i in warm:
        view.set_context(f"tcp://s{i}", A, "ready", at=1.0, nbytes=40)
    return view


def _place(view: FleetState, identity=A, **kwargs):
    decision = choose(view, GPU1, identity, **kwargs)
    if decision.address is not None:
        view.dispatched(f"job-{len(view._where)}", decision.address, identity, at=2.0)
    return decision


def test_warm_servers_take_the_context_jobs_while_they_have_free_slots():
    view = _fleet()
    first, second = _place(view), _place(view)
    assert {first.address, second.address} == {"tcp://s0", "tcp://s1"}
    assert first.step == second.step == "warm"
    # Both warm slots busy, the cold servers idle, but A never measured and no job
    # of it running yet: nothing shows a load would beat waiting, so it waits.
    third = _place(view)
    assert (third.address, third.step) == (None, "unmeasured")
    # Once measured, the wait-or-load rule decides.
    view.measure.add_job(A, "h200", 4.0)
    view.measure.add_load(A, "h200", "tcp://s0", 1.0)
    third = _place(view)
    assert third.step == "load" and third.address in {"tcp://s2", "tcp://s3"}


def test_a_freed_warm_slot_is_taken_again():
    view = _fleet()
    key = "job-x"
    view.dispatched(key, "tcp://s0", A, at=2.0)
    assert choose(view, GPU1, A).address == "tcp://s1"
    view.release(key)
    view.learn(_outcome("tcp://s0", started=2.0, reused=(A,)))
    view.dispatched("job-y", "tcp://s1", A, at=3.0)
    assert choose(view, GPU1, A).address == "tcp://s0"


def test_unmeasured_times_are_bounded_by_what_runs():
    """A long first job must not keep idle servers idle; a guess never evicts."""
    view = _fleet(warm=(0,))
    view.measure.add_load(A, "h200", "tcp://s0", 0.5)  # its load was quick
    view.apply(ev.JobStarted(at=100.0, key="first", address="tcp://s0", context=A))
    # Just started: no job time shown yet.
    assert choose(view, GPU1, A, now=100.2).step == "wait"
    # Running for 2 s already: a warm slot is at least 2 s away, a load 0.5 s.
    decision = choose(view, GPU1, A, now=102.0)
    assert decision.step == "load" and decision.address in {"tcp://s1", "tcp://s2", "tcp://s3"}
    # The same, but every idle server holds another context and no size is known.
    crowded = _fleet(warm=(0,))
    crowded.measure.add_job(A, "h200", 30.0)
    for i in (1, 2, 3):
        crowded.set_context(f"tcp://s{i}", B, "ready", at=1.0)
    crowded.apply(ev.JobStarted(at=100.0, key="first", address="tcp://s0", context=A))
    assert choose(crowded, GPU1, A, now=500.0).step == "wait"
    # A load in progress bounds the load time from below.
    loading = _fleet(warm=())
    loading.set_context("tcp://s0", A, "loading", at=100.0)
    loading.dispatched("first", "tcp://s0", A, at=100.0)
    assert choose(loading, GPU1, A, now=103.0).step == "unmeasured"


def test_wait_or_load_both_ways():
    view = _fleet()
    view.measure.add_job(A, "h200", 1.0)  # a job takes 1 s
    view.measure.add_load(A, "h200", "tcp://s0", 10.0)  # a load 10 s
    view.dispatched("j0", "tcp://s0", A, at=2.0)
    view.dispatched("j1", "tcp://s1", A, at=2.0)
    warm = [view.servers["tcp://s0"], view.servers["tcp://s1"]]
    # Few jobs ahead: a warm slot comes sooner than a load ends.
    assert expected_wait(view, A, warm, remaining=4, now=NOW) == 2.0
    decision = choose(view, GPU1, A, remaining=4)
    assert (decision.address, decision.step) == (None, "wait")
    assert "warm slot in 2.0 s <= load 10.0 s" in decision.reason
    # Many jobs ahead: loading on a cold server wins.
    decision = choose(view, GPU1, A, remaining=31)
    assert decision.step == "load" and decision.address in {"tcp://s2", "tcp://s3"}
    assert "warm slot in 15.5 s > load 10.0 s" in decision.reason


def test_a_load_that_evicts_a_wanted_context_costs_its_reload_too():
    view = _fleet(warm=(0,), budget=60)
    view.set_context("tcp://s1", B, "ready", at=1.0, nbytes=40)
    view.measure.bytes.update({A: 40, B: 40})
    for identity in (A, B):
        view.measure.add_job(identity, "h200", 1.0)
        view.measure.add_load(identity, "h200", "tcp://s9", 3.0)
    view.dispatched("j0", "tcp://s0", A, at=2.0)
    for i in (2, 3):  # only s1 is free
        view.dispatched(f"busy{i}", f"tcp://s{i}", None, at=2.0)
    s1 = view.servers["tcp://s1"]
    assert victims(s1, A, 40) == [B]
    # s1 holds the last warm copy of B, which has work to come: never evicted.
    assert load_cost(view, A, s1, {B: 2}, now=NOW) == math.inf
    view.set_context("tcp://s2", B, "ready", at=1.0, nbytes=40)  # another copy
    assert load_cost(view, A, s1, {B: 0}, now=NOW) == 3.0
    assert load_cost(view, A, s1, {B: 2}, now=NOW) == 6.0
    # 4 jobs ahead: a wait of 5 s beats a 6 s load-and-reload, though not a 3 s load.
    assert choose(view, GPU1, A, remaining=5, demand={A: 5, B: 2}).step == "wait"
    assert choose(view, GPU1, A, remaining=5, demand={A: 5}).step == "load"


def test_room_for_both_means_no_victim():
    view = _fleet(warm=(), budget=100)
    view.set_context("tcp://s0", B, "ready", at=1.0, nbytes=40)
    assert victims(view.servers["tcp://s0"], A, 40) == []
    assert victims(view.servers["tcp://s0"], A, 70) == [B]
    view.servers["tcp://s0"].budget = None  # size unknown: assume it must go
    assert victims(view.servers["tcp://s0"], A, 40) == [B]


def test_cold_order_cache_then_fastest_then_any():
    view = _fleet(models=("a100", "h200", "a100", "h200"), warm=())
    # Fastest: A runs in 1 s on an H200 and 3 s on an A100.
    view.measure.add_job(A, "h200", 1.0)
    view.measure.add_job(A, "a100", 3.0)
    decision = choose(view, GPU1, A)
    assert (decision.address, decision.step) == ("tcp://s1", "fastest")
    # A local cache beats speed.
    view.servers["tcp://s2"].cached.add(A)
    assert (choose(view, GPU1, A).address, choose(view, GPU1, A).step) == (
        "tcp://s2",
        "cached",
    )
    # Nothing measured, nothing cached: any, the one holding the fewest contexts.
    plain = _fleet(warm=())
    plain.set_context("tcp://s0", B, "ready", at=1.0)
    decision = choose_server(plain, GPU1, A, now=NOW)
    assert decision.step == "any" and decision.address == "tcp://s1"


def test_gpu_model_and_busy_and_unrunnable():
    view = _fleet(models=("a100", "h200"), warm=())
    h200 = job_resources(Requirements(gpu=1, gpu_model="h200"))
    assert choose(view, h200, A).address == "tcp://s1"
    view.dispatched("j", "tcp://s1", A, at=1.0)
    assert choose(view, h200, A).step == "busy"
    l40 = job_resources(Requirements(gpu=1, gpu_model="l40s"))
    assert choose(view, l40, A).step == "unrunnable"


def test_plain_jobs_keep_off_servers_that_hold_contexts():
    view = _fleet(warm=(0, 1, 2))
    assert choose(view, GPU1, None).address == "tcp://s3"


def test_view_follows_events():
    view = FleetState()
    view.apply(
        ev.ServerJoined(
            address="tcp://w", name="gpu0", resources={"gpu": 1, "gpu_model:h200": 1}, slots=2
        )
    )
    view.apply(
        ev.ServerDescribed(
            address="tcp://w", memory_budget=100, gpu={"name": "NVIDIA H200", "uuid": "GPU-1"}
        )
    )
    server = view.servers["tcp://w"]
    assert (server.slots, server.gpu_model, server.budget) == (2, "h200", 100)
    view.apply(ev.ContextLoading(at=10, address="tcp://w", identity=A, from_cache=True))
    assert view.warm[A] == {"tcp://w"} and A in server.cached
    view.apply(ev.ContextReady(at=12, address="tcp://w", identity=A, load_seconds=2.0, bytes=9))
    assert server.contexts[A].state == "ready"
    assert view.measure.load_seconds(A, "h200", "tcp://w") == 2.0
    # Another run's job occupies a slot until its server says it finished.
    view.apply(ev.JobStarted(at=13, run_id="other", key="k1", address="tcp://w", context=A))
    assert server.busy == 1 and server.free
    view.apply(ev.JobStarted(at=13, run_id="other", key="k2", address="tcp://w", context=A))
    assert not server.free
    view.apply(
        ev.JobFinished(
            at=15, key="k1", address="tcp://w", context=A, started=13, finished=15, gpu_model="h200"
        )
    )
    assert server.busy == 1
    assert view.measure.job_seconds(A, "h200") == 2.0
    # An eviction, then a late "ready" from before it: still gone.
    view.apply(ev.ContextEvicted(at=20, address="tcp://w", identity=A))
    view.set_context("tcp://w", A, "ready", at=18)
    assert A not in server.contexts and A not in view.warm
    view.apply(ev.ServerLeft(at=30, address="tcp://w"))
    assert "tcp://w" not in view.servers
    # A late event of the server that left does not bring it back.
    view.apply(ev.ServerDescribed(at=31, address="tcp://w"))
    assert "tcp://w" not in view.servers


def test_own_results_measure_jobs_and_loads():
    """What an executor learns from its own job's result (the dispatch machine's
    tests check that the server's echo of it is not counted again)."""
    view = _fleet(warm=())
    view.dispatched("mine", "tcp://s0", A, at=1.0)
    view.release("mine")
    view.learn(_outcome("tcp://s0", started=1.0, finished=7.5, loaded=(A,), load_seconds=4))
    assert view.measure.job_seconds(A, "h200") == 2.5
    assert view.measure.load_seconds(A, "h200", "tcp://s3") == 4.0
    assert view.servers["tcp://s0"].free
    assert view.servers["tcp://s0"].contexts[A].state == "ready"


def test_a_failed_job_does_not_leave_a_phantom_load():
    view = _fleet(warm=())
    view.dispatched("mine", "tcp://s0", A, at=1.0)
    assert view.warm[A] == {"tcp://s0"}  # expected to load it
    view.release("mine")
    view.learn(_outcome("tcp://s0", ok=False, started=1.5))  # failed before loading
    assert A not in view.warm


def test_a_server_that_leaves_is_dropped_with_its_contexts():
    """Membership comes from the hub's events: a ServerLeft drops the server, its
    slots and its warm contexts (the dispatch tests check the poll without a hub)."""
    view = _fleet(warm=(0,))
    view.dispatched("mine", "tcp://s0", A, at=1.0)
    view.apply(ev.ServerLeft(at=5.0, address="tcp://s0", reason="lost"))
    assert sorted(view.servers) == ["tcp://s1", "tcp://s2", "tcp://s3"]
    assert A not in view.warm and view.where("mine") is None
    view.apply(ev.ServerJoined(at=6.0, address="tcp://new", name="n", resources={"gpu": 1}))
    assert "tcp://new" in view.servers


def test_snapshot_round_trip():
    view = _fleet()
    view.measure.add_job(A, "h200", 1.5)
    view.apply(ev.JobStarted(at=5, run_id="r", key="k", address="tcp://s2"))
    copy = FleetState()
    copy.load_wire(view.to_wire())
    assert copy.warm == view.warm
    assert copy.measure.job_seconds(A, "h200") == 1.5
    assert not copy.servers["tcp://s2"].free


def test_events_round_trip_as_plain_data():
    event = ev.ServerLeft(
        address="tcp://x", reason="lost", lost=[ev.LostJob(key="k", started=1.0).to_wire()]
    )
    wire = ev.encode([event, ev.RunHeartbeat(run_id="r")])
    assert all(isinstance(item, dict) for item in wire)
    decoded = list(ev.decode(tuple(wire)))  # Dask delivers lists as tuples
    assert decoded[0] == event and decoded[0].lost_jobs()[0].key == "k"
    assert list(ev.decode([{"kind": "from-the-future"}, "junk"])) == []


def test_prefetch_queues_behind_a_warm_job_instead_of_waiting():
    """With measured times saying wait, a job is queued on a warm server (one deep)."""
    view = _fleet(warm=(0,))
    view.measure.job[(A, "h200")] = _mean(1.0)
    view.measure.load[(A, "h200")] = _mean(30.0)
    assert _place(view).address == "tcp://s0"  # the warm slot
    queued = choose_server(view, GPU1, A, now=10.0)
    assert (queued.address, queued.step) == ("tcp://s0", "queued")
    view.dispatched("job-q", "tcp://s0", A, at=2.0)
    # One deep: the next one waits in the executor's queue.
    assert choose_server(view, GPU1, A, now=10.0).step == "wait"
    # Nothing measured yet: no queueing behind a job that may be long.
    fresh = _fleet(warm=(0,))
    _place(fresh)
    assert choose_server(fresh, GPU1, A, now=2.5).address is None
    # Nor with only the load measured (two long first jobs ran one after the other on
    # one server of two, the second queued behind the first).
    loaded = _fleet(warm=(0,))
    loaded.measure.load[(A, "h200")] = _mean(30.0)
    _place(loaded)
    loaded.mark_started("job-0", 2.0)  # running for 0.5 s: a wait, not a load
    decision = choose_server(loaded, GPU1, A, now=2.5)
    assert (decision.address, decision.step) == (None, "wait")


def test_a_queued_job_goes_behind_the_warm_job_that_ends_first():
    """Equally busy warm servers: the job is queued behind the running job that
    started first, not by address. (A replay in CI queued by the cluster's random
    ports and missed the measured makespan by 16%: one job of 3 s behind a job that
    had just started while another server's job was about to end.)"""
    view = _fleet(warm=(0, 1))
    view.measure.job[(A, "h200")] = _mean(3.0)
    view.measure.load[(A, "h200")] = _mean(30.0)
    view.dispatched("late", "tcp://s0", A, at=8.0)
    view.mark_started("late", 8.0)
    view.dispatched("early", "tcp://s1", A, at=5.0)
    view.mark_started("early", 5.0)
    queued = choose_server(view, GPU1, A, now=8.1)
    assert (queued.address, queued.step) == ("tcp://s1", "queued")


def _mean(seconds: float):
    from snakemake_executor_context.fleet.measure import Mean

    mean = Mean()
    mean.add(seconds)
    return mean


def test_an_idle_server_loads_when_the_remaining_work_pays_for_it():
    """The rule: load when the work still to come, shared over the warm slots, takes
    longer than the load (job 1 s, load 5 s, one warm slot)."""
    view = _fleet(warm=(0,))
    view.measure.add_job(A, "h200", 1.0)
    view.measure.add_load(A, "h200", "tcp://s9", 5.0)
    view.dispatched("j0", "tcp://s0", A, at=2.0)
    assert choose(view, GPU1, A, remaining=5).step == "wait"  # 5 s of work, 5 s load
    assert choose(view, GPU1, A, remaining=6).step == "load"
    view.dispatched("j1", "tcp://s1", A, at=2.0)  # s1 warm (loading) now: 2 slots
    assert choose(view, GPU1, A, remaining=10).step == "wait"
    assert choose(view, GPU1, A, remaining=11).step == "load"


def test_a_load_costs_what_its_kind_costs():
    """A conversion (10 s) is not a load from the converted cache (1 s): a server
    whose cache probe says the weights are there costs the latter."""
    view = _fleet(warm=(0,))
    view.measure.add_job(A, "h200", 1.0)
    view.measure.add_load(A, "h200", "tcp://s0", 11.0, conversions=1, reload_seconds=1.0)
    view.dispatched("j0", "tcp://s0", A, at=2.0)
    assert view.measure.load_seconds(A, "h200", "tcp://s1") == 11.0
    assert view.measure.load_seconds(A, "h200", "tcp://s1", cached=True) == 1.0
    assert choose(view, GPU1, A, remaining=5).step == "wait"  # 5 s < a conversion
    view.servers["tcp://s1"].cached.add(A)
    decision = choose(view, GPU1, A, remaining=5)
    assert (decision.step, decision.address) == ("load", "tcp://s1")
    # A loader that never converts: every load is of one kind.
    view.measure.add_load(B, "h200", "tcp://s2", 4.0)
    assert view.measure.load_seconds(B, "h200", "tcp://s3") == 4.0
    assert view.measure.load_seconds(B, "h200", "tcp://s3", cached=True) == 4.0


def test_demand_comes_from_the_plan_then_follows_the_jobs():
    from snakemake_executor_context.dispatch.inflight import Demand

    demand = Demand()
    assert demand.counts([A, A, B]) == {A: 2, B: 1}  # no plan: what the executor holds
    demand.plan({"1": A, "2": A, "3": A, "4": None})
    assert demand.knows(A) and not demand.knows(B) and demand.unknown == 1
    assert demand.counts([A, B, B]) == {A: 3, B: 2}  # B: only what the executor holds
    demand.ended(A, "1")
    demand.ended(A, "1")  # reported once, however often it is said
    demand.ready(A, "9")  # a job the plan did not know (a checkpoint's)
    demand.ready(A, "2")  # already counted
    assert demand.counts([]) == {A: 3}


def test_a_pilot_that_retires_before_a_job_would_end_gets_none():
    view = _fleet(models=("h200", "h200"), warm=(0, 1))
    view.measure.add_job(A, "h200", 30.0)
    view.apply(ev.ServerDescribed(address="tcp://s0", name="s0", retires_at=110.0))
    # At t=100 a 30 s job would outlast s0 (it retires at 110): it goes to s1.
    assert choose(view, GPU1, A, now=100.0).address == "tcp://s1"
    view.dispatched("job-on-s1", "tcp://s1", A, at=100.0)
    # s1 busy, s0 retiring first: the job waits rather than start there.
    decision = choose(view, GPU1, A, now=100.0)
    assert decision.address is None
    # Early enough, s0 takes it; an unmeasured context is not held back.
    assert choose(view, GPU1, A, now=70.0).address == "tcp://s0"
    assert choose(view, GPU1, B, now=100.0).address != "tcp://s1"


def _outcome(address: str, *, ok: bool = True, **fields) -> Outcome:
    """A result of context A's job on ``address``, as its server seals it."""
    return Outcome("job.1", ServerIdentity("s", "h", 1, address), ok=ok, context=A, **fields)


def _cold_fleet(n: int) -> FleetState:
    return _fleet(models=("h200",) * n, warm=())


def test_cold_start_both_idle_servers_load_when_eight_jobs_wait():
    """Nothing measured, 8 jobs of a context and 2 idle cold servers: both load at
    once (the second no longer waits for a job time to be measured)."""
    view = _cold_fleet(2)
    first = _place(view, remaining=8)
    second = _place(view, remaining=8)
    assert first.step == "any" and second.step == "cold-start", second
    assert {first.address, second.address} == {"tcp://s0", "tcp://s1"}
    assert "8 job(s) to come for 2 server(s)" in second.reason


def test_cold_start_three_jobs_make_one_load():
    view = _cold_fleet(2)
    assert _place(view, remaining=3).address == "tcp://s0"
    second = _place(view, remaining=3)
    assert (second.address, second.step) == (None, "unmeasured")


def test_cold_start_one_job_left_and_two_warm_servers_loads_nothing():
    view = _fleet(models=("h200",) * 3, warm=(0, 1))
    for i in (0, 1):
        view.dispatched(f"run{i}", f"tcp://s{i}", A, at=2.0)
        view.apply(ev.JobStarted(at=3.0, key=f"run{i}", address=f"tcp://s{i}", context=A))
    view.measure.add_load(A, "h200", "tcp://s0", 5.0)  # their loads, measured
    decision = choose(view, GPU1, A, remaining=3, now=4.0)  # 2 running, 1 to start
    assert decision.address is None, decision


def test_cold_start_counts_jobs_on_a_loading_server_as_not_started():
    """The first server's job 'started' there (its job event) but waits for the load:
    it still counts among the 8 that have not run against a loaded copy."""
    view = _cold_fleet(2)
    assert _place(view, remaining=8).address == "tcp://s0"
    view.apply(ev.ContextLoading(at=2.5, address="tcp://s0", identity=A))
    view.apply(ev.JobStarted(at=2.5, key="job-0", address="tcp://s0", context=A))
    assert choose(view, GPU1, A, remaining=8).step == "cold-start"


def test_measured_times_from_the_catalog_leave_the_decision_to_the_measured_rule():
    """A history that says a load costs 20 s and a job 1 s: 8 jobs wait for the warm
    server (8 s) instead of paying a 20 s load."""
    view = _cold_fleet(2)
    view.measure.add_job(A, "h200", 1.0)
    view.measure.add_load(A, "h200", "tcp://s9", 20.0)
    assert _place(view, remaining=8).address is not None
    view.set_context("tcp://s0", A, "ready", at=2.0)
    decision = choose(view, GPU1, A, remaining=8)
    assert (decision.address, decision.step) == (None, "wait"), decision


def test_cold_start_leaves_an_idle_server_to_a_context_nobody_holds():
    """Contexts A and B, 10 jobs each, 2 idle servers: the second server is kept for
    B (no copy anywhere) rather than made a second copy of A, which would have to be
    evicted again to load B (3 loads where 2 do)."""
    view = _cold_fleet(2)
    demand = {A: 10, B: 10}
    assert _place(view, remaining=10, demand=demand).address == "tcp://s0"
    second = choose(view, GPU1, A, remaining=10, demand=demand)
    assert second.step != "cold-start" and second.address is None, second
    assert choose(view, GPU1, A, remaining=10, demand={A: 10, B: 0}).step == "cold-start"
    for_b = _place(view, B, remaining=10, demand=demand)
    assert (for_b.address, for_b.step) == ("tcp://s1", "any"), for_b


def test_cold_start_never_evicts_to_make_room():
    view = _cold_fleet(2)
    view.set_context("tcp://s1", B, "ready", at=1.0)  # size unknown: a load would evict it
    assert _place(view, remaining=20).address == "tcp://s0"
    decision = choose(view, GPU1, A, remaining=20)
    assert decision.step != "cold-start" and decision.address is None, decision


def test_a_pilot_that_joins_mid_run_loads_when_enough_jobs_remain():
    """Two warm servers run jobs; a pilot joins: with 20 jobs left it loads at once,
    with 1 left it does not, whether times are measured or not."""
    for measured in (False, True):
        for remaining, loads in ((20, True), (1, False)):
            view = _fleet(models=("h200",) * 2, warm=(0, 1))
            for i in (0, 1):
                view.dispatched(f"run{i}", f"tcp://s{i}", A, at=2.0)
                view.apply(ev.JobStarted(at=3.0, key=f"run{i}", address=f"tcp://s{i}", context=A))
            view.measure.add_load(A, "h200", "tcp://s0", 5.0)  # the warm ones' loads
            if measured:
                view.measure.add_job(A, "h200", 1.0)
            view.add_server(
                "tcp://pilot",
                name="pilot-2",
                resources={"gpu": 1, "mem_mb": 64000, "gpu_model:h200": 1},
                slots=1,
            )
            decision = choose(view, GPU1, A, remaining=remaining, now=4.0)
            where = "tcp://pilot" if loads else None
            assert decision.address == where, (measured, remaining, decision)
            if loads:
                assert decision.step == ("load" if measured else "cold-start"), decision
