"""Survival estimates (Kaplan-Meier with censoring, from the catalog and from the
fleet's events) and the placement that weighs them: pure, no cluster."""

from __future__ import annotations

import math

import pytest

from snakemake_executor_context.catalog.reading.fleetseed import survival_history
from snakemake_executor_context.fleet import events as ev
from snakemake_executor_context.fleet.placement import choose_server
from snakemake_executor_context.fleet.poolsizing import PoolDemand, kind_survival, next_kind
from snakemake_executor_context.fleet.resources import Requirements, job_resources
from snakemake_executor_context.fleet.state import FleetState
from snakemake_executor_context.fleet.survival import (
    LIKELY,
    MIN_LIVES,
    PRIOR_MEAN_LIFE,
    Life,
    SurvivalBook,
    kaplan_meier,
    survival_group,
)
from tests.catalog_builder import CatalogBuilder

GPU1 = job_resources(Requirements(gpu=1))
A = "a" * 64

#: Six lives (seconds, died): deaths at 2, 5 and 8; censored at 3, 5 (beside the
#: death at 5) and 10. By hand: S(2) = 5/6; at 5, 4 at risk, 1 dies: 5/6 * 3/4 =
#: 0.625; at 8, 2 at risk, 1 dies: 0.3125.
FIXTURE = [(2, True), (3, False), (5, True), (5, False), (8, True), (10, False)]
HAND = {1: 1.0, 2: 5 / 6, 4: 5 / 6, 5: 0.625, 7.9: 0.625, 8: 0.3125, 10: 0.3125}


def test_kaplan_meier_matches_the_hand_computed_curve():
    curve = kaplan_meier([Life(s, died) for s, died in FIXTURE])
    assert curve.times == (2, 5, 8)
    for t, expected in HAND.items():
        assert curve.at(t) == pytest.approx(expected)
    assert (curve.lives, curve.deaths, curve.horizon) == (6, 3, 10)
    # Beyond the longest life: the group's deaths over its seconds (3 / 33).
    assert curve.tail_rate == pytest.approx(3 / 33)
    assert curve.at(12) == pytest.approx(0.3125 * math.exp(-2 * 3 / 33))
    # Conditional: a server of age 3 lives 3 s more with S(6) / S(3) = 0.625 / (5/6).
    assert curve.survives(3, 3) == pytest.approx(0.75)
    # Remaining life at 6: area under S from 6 (0.625 to 8, 0.3125 to 10, then the
    # tail's 0.3125 / rate) over S(6).
    area = 0.625 * 2 + 0.3125 * 2 + 0.3125 * 33 / 3
    assert curve.remaining(6) == pytest.approx(area / 0.625)


def test_censored_lives_are_not_deaths():
    censored = kaplan_meier([Life(100, False)] * 5)
    died = kaplan_meier([Life(100, True)] * 5)
    assert censored.at(99) == died.at(99) == 1.0
    assert censored.at(100) == 1.0 and died.at(100) == 0.0
    # Nothing ever lost: the tail is one death over the seconds seen and the prior.
    assert censored.tail_rate == pytest.approx(1 / (500 + PRIOR_MEAN_LIFE))
    assert censored.mean() > died.mean()


def _fixture_catalog(tmp_path):
    """The fixture's lives in a real catalog, recorded through the writer's own code:
    servers of group 'short' that were lost (injected, crashed) or closed, and one
    that is still alive (not an ended life: left out of the history)."""
    builder = CatalogBuilder(tmp_path / "catalog.db")
    start = builder.now
    for n, (seconds, died) in enumerate(FIXTURE):
        builder.now = start + 100 * n
        address = builder.server(f"s{n}", group="short")
        builder.now += seconds
        if died:
            builder.lose_server(address)
        else:
            builder.leave(address)
    builder.server("alive", group="short")
    builder.server("p0", partition="gpu-long", pool="a10")
    builder.commit()
    return builder


def test_the_catalogs_lives_give_the_hand_computed_curve(tmp_path):
    builder = _fixture_catalog(tmp_path)
    with builder.store.session() as session:
        history = survival_history(session)
    builder.close()
    lives = [Life.from_wire(item) for item in history["lives"]]
    assert sorted((life.seconds, life.died) for life in lives) == sorted(FIXTURE)
    assert {life.group for life in lives} == {"short"}
    assert {life.gpu_model for life in lives} == {"h200"}
    curve = kaplan_meier(lives)
    for t, expected in HAND.items():
        assert curve.at(t) == pytest.approx(expected)
    book = SurvivalBook()
    book.merge_wire(history)
    assert book.curve("short", "h200", now=0.0).source == "group short"


def test_estimates_fall_back_from_group_to_gpu_model_to_all_to_the_prior():
    book = SurvivalBook()
    assert book.curve("short", "a10", now=0.0).source == "prior"
    book.merge_wire({"lives": [[60, True, "short", "a10"]] * (MIN_LIVES - 1)})
    assert book.curve("short", "a10", now=0.0).source == "prior"
    book.merge_wire({"lives": [[3600, False, "long", "a10"]]})
    # 2 lives in 'short', 3 of a10: the GPU model's curve.
    assert book.curve("short", "a10", now=0.0).source == "gpu a10"
    assert book.curve("other", "h200", now=0.0).source == "all servers"
    book.merge_wire({"lives": [[60, True, "short", "a10"]]})
    assert book.curve("short", "a10", now=0.0).source == "group short"
    assert survival_group("", "gpu-short", "a10") == "gpu-short/a10"
    assert survival_group("mine", "gpu-short", "a10") == "mine"


def test_a_pilot_never_survives_past_its_retirement():
    book = SurvivalBook()
    book.joined("tcp://p", 0.0)
    assert book.survives("tcp://p", 60, now=100.0) > 0.99
    assert book.survives("tcp://p", 60, now=100.0, retires_at=150.0) == 0.0
    assert book.remaining("tcp://p", now=100.0, retires_at=150.0) == 50.0


def _events_fleet(short_lives: int = 8) -> FleetState:
    """Two idle H200 servers, s0 of group 'short' and s1 of group 'long', after a
    history of short's servers lost within a minute and long's closed after hours."""
    view = FleetState()
    view.survival.merge_wire(
        {
            "lives": [[40 + 5 * n, True, "short", "h200"] for n in range(short_lives)]
            + [[4 * 3600, False, "long", "h200"]] * 4
        }
    )
    for i, group in enumerate(("short", "long")):
        address = f"tcp://s{i}"
        view.apply(
            ev.ServerJoined(
                at=900.0,
                address=address,
                name=f"s{i}",
                slots=1,
                resources={"gpu": 1, "mem_mb": 64000, "gpu_model:h200": 1},
            )
        )
        view.apply(ev.ServerDescribed(at=900.0, address=address, name=f"s{i}", group=group))
    return view


def test_the_fleets_events_feed_the_book():
    view = _events_fleet()
    assert view.survival.age("tcp://s0", 1000.0) == 100.0
    assert view.survival.curve("short", "h200", 1000.0).source == "group short"
    view.apply(ev.ServerLeft(at=1010.0, address="tcp://s0", expected=False, injected=9))
    view.apply(ev.ServerLeft(at=1020.0, address="tcp://s1", expected=True, reason="closed"))
    died, closed = view.survival.lives[-2:]
    assert (died.seconds, died.died, died.group) == (110.0, True, "short")
    assert (closed.seconds, closed.died, closed.group) == (120.0, False, "long")


def test_a_load_goes_to_the_server_likely_to_live_through_it():
    view = _events_fleet()
    view.measure.add_load(A, "h200", "tcp://elsewhere", 30.0)
    view.measure.add_job(A, "h200", 20.0)
    # Off: the old order (fewest contexts, then the name): s0, the short-lived one.
    off = choose_server(view, GPU1, A, now=1000.0, prefetch=0)
    assert (off.address, off.step) == ("tcp://s0", "any")
    view.survival_placement = True
    on = choose_server(view, GPU1, A, now=1000.0, prefetch=0)
    assert (on.address, on.step) == ("tcp://s1", "liveliest")
    assert view.survival.survives("tcp://s0", 50.0, now=1000.0) < LIKELY


def test_a_load_on_a_short_lived_server_costs_more_than_waiting():
    view = _events_fleet()
    view.survival_placement = True
    # s1 (long) already holds A and is busy; s0 (short) is the only cold one.
    view.set_context("tcp://s1", A, "ready", at=950.0)
    view.dispatched("running", "tcp://s1", A, at=950.0)
    view.measure.add_load(A, "h200", "tcp://s1", 30.0)
    view.measure.add_job(A, "h200", 20.0)
    # 3 jobs to come on one warm slot: a 60 s wait beats a 30 s load only when the
    # load is likely to be lost (s0's servers die within a minute).
    decision = choose_server(view, GPU1, A, remaining=3, now=1000.0, prefetch=0)
    assert decision.address is None and decision.step == "wait"
    assert "lives through it" in decision.reason
    view.survival_placement = False
    decision = choose_server(view, GPU1, A, remaining=3, now=1000.0, prefetch=0)
    assert (decision.address, decision.step) == ("tcp://s0", "load")


def test_long_jobs_go_to_the_long_lived_server_and_short_jobs_to_either():
    view = _events_fleet()
    view.survival_placement = True
    for address in ("tcp://s0", "tcp://s1"):
        view.set_context(address, A, "ready", at=950.0)
    # A 200 s job: s0 would likely be lost first.
    view.measure.add_job(A, "h200", 200.0)
    assert choose_server(view, GPU1, A, now=1000.0, prefetch=0).address == "tcp://s1"
    # With s1 busy, the short-lived server still takes the job (nothing waits on a guess).
    view.dispatched("running", "tcp://s1", A, at=1000.0)
    assert choose_server(view, GPU1, A, now=1000.0, prefetch=0).address == "tcp://s0"
    # A job short for both: the usual order (s0 by its address), not survival.
    short = _events_fleet()
    short.survival_placement = True
    for address in ("tcp://s0", "tcp://s1"):
        short.set_context(address, A, "ready", at=950.0)
    short.measure.add_job(A, "h200", 0.5)
    assert choose_server(short, GPU1, A, now=1000.0, prefetch=0).address == "tcp://s0"


def test_the_pool_prefers_the_kind_whose_pilots_live_longer():
    assert next_kind([0, 0], [0, 0]) == 0
    assert next_kind([0, 0], [0, 0], survival=[0.2, 0.95]) == 1
    # Both likely: alike, the kind held least.
    assert next_kind([0, 0], [3, 1], survival=[0.95, LIKELY]) == 1
    # Demand for a GPU type comes first.
    assert next_kind([5, 0], [0, 0], survival=[0.2, 0.95]) == 0


def test_the_pool_asks_survival_only_of_a_run_that_weighs_it():
    book = SurvivalBook()
    book.merge_wire(
        {
            "lives": [[20 + n, True, "gpu-short/a10", "a10"] for n in range(5)]
            + [[7200, False, "gpu-long/a10", "a10"]] * 5
        }
    )
    kinds = [("gpu-short/a10", "a10"), ("gpu-long/a10", "a10")]
    assert kind_survival(PoolDemand(ready=4), book, kinds, now=0.0) is None
    demand = PoolDemand(ready=4, load_seconds=30.0, job_seconds=20.0, survival=True)
    assert PoolDemand.from_wire(demand.to_wire()) == demand
    short, long_lived = kind_survival(demand, book, kinds, now=0.0) or []
    assert long_lived > LIKELY > short
    assert next_kind([4, 4], [0, 0], survival=[short, long_lived]) == 1
