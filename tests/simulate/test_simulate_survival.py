"""The simulator's lifetimes (issue 39): hazards draw lives of the stated shape, a
server whose life ends is preempted and counted, a run with lifetimes is
deterministic, and ``simulate --survival`` / ``--lifetimes`` reach the dispatch
machine and the preemptions."""

from __future__ import annotations

import math
import random
import statistics
from pathlib import Path

import pytest

from snakemake_executor_context import cli
from snakemake_executor_context.errors import SettingError
from snakemake_executor_context.fleet.loads import LoadKind
from snakemake_executor_context.fleet.losses import LossKind
from snakemake_executor_context.simulate import engine
from snakemake_executor_context.simulate.hazard import (
    Bathtub,
    Memoryless,
    Weibull,
    parse_hazard,
    parse_lifetimes,
)
from snakemake_executor_context.simulate.model import (
    Fleet,
    JobTimes,
    Options,
    PoolSpec,
    Preemption,
    ServerKind,
)
from snakemake_executor_context.simulate.workload import from_spec

DRAWS = 20_000


def _draws(hazard, seed: int = 3) -> list[float]:
    rng = random.Random(seed)
    return [hazard.draw(rng) for _ in range(DRAWS)]


# -- hazards -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "hazard",
    [
        Memoryless(600.0),
        Weibull(0.7, 900.0),
        Weibull(3.0, 900.0),
        Bathtub(60, 300, 3600, 1800, 120),
    ],
    ids=["exp", "weibull-falling", "weibull-rising", "bathtub"],
)
def test_draws_have_the_stated_mean(hazard):
    mean = statistics.fmean(_draws(hazard))
    assert mean == pytest.approx(hazard.mean(), rel=0.05)


def test_the_means_are_the_known_ones():
    assert Memoryless(600.0).mean() == 600.0
    assert Weibull(1.0, 900.0).mean() == pytest.approx(900.0)  # shape 1: memoryless
    assert Weibull(2.0, 900.0).mean() == pytest.approx(900.0 * math.sqrt(math.pi) / 2)
    # A bathtub of one rate throughout is memoryless.
    assert Bathtub(500, 100, 500, 200, 500).mean() == pytest.approx(500.0)


def test_the_bathtubs_stretches_die_at_their_own_rates():
    tub = Bathtub(60.0, 300.0, 3600.0, 1800.0, 120.0)
    lives = _draws(tub)
    early = sum(1 for life in lives if life < 300.0) / DRAWS
    assert early == pytest.approx(1 - math.exp(-300 / 60), abs=0.01)
    # Of those alive at 300 s, the share alive at 1,800 s: mid-life's rate alone.
    alive = [life for life in lives if life >= 300.0]
    mid = sum(1 for life in alive if life >= 1800.0) / len(alive)
    assert mid == pytest.approx(math.exp(-1500 / 3600), abs=0.06)
    # Beyond 1,800 s the remaining life is memoryless with the late mean.
    late = [life - 1800.0 for life in lives if life >= 1800.0]
    assert statistics.fmean(late) == pytest.approx(120.0, rel=0.25)
    # The inverse CDF lands on the stretches' edges.
    assert tub.life(1 - math.exp(-5)) == pytest.approx(300.0)
    assert tub.survival(1800.0) == pytest.approx(math.exp(-5 - 1500 / 3600))


def test_specs_are_read_and_bad_ones_refused_in_one_line():
    assert parse_hazard("exp:2min") == Memoryless(120.0)
    assert parse_hazard("weibull:0.7:1h") == Weibull(0.7, 3600.0)
    assert parse_hazard("bathtub:60:300:3600:1800:120") == Bathtub(60, 300, 3600, 1800, 120)
    lives = parse_lifetimes("gpu-short=exp:120, long=exp:30min")
    assert lives == {"gpu-short": Memoryless(120.0), "long": Memoryless(1800.0)}
    assert parse_lifetimes("exp:60") == {"*": Memoryless(60.0)}
    for text, expected in (
        ("a=exp", "expected exp:MEAN"),
        ("a=poisson:3", "expected exp:MEAN"),
        ("a=exp:soon", "is not a number of seconds"),
        ("a=exp:0.5", "below 1 s"),
        ("a=exp:nan", "is not a number of seconds"),
        ("a=exp:100d", "is not a number of seconds"),
        ("a=exp:1e9", "beyond the simulator's span"),
        ("a=weibull:0:60", "the shape is 0.1 to 100"),
        ("a=bathtub:60:300:60", "expected exp:MEAN"),
        ("a=bathtub:60:900:60:300:60", "EARLY_END (900) is after LATE_START (300)"),
        ("=exp:60", "expected PARTITION=SPEC"),
        ("a=exp:60,a=exp:90", "'a' is named twice"),
        (",", "names no lifetime"),
    ):
        with pytest.raises(SettingError) as raised:
            parse_lifetimes(text)
        message = str(raised.value)
        assert expected in message and "\n" not in message, message
        assert message.startswith("--lifetimes"), message


# -- in the simulator ------------------------------------------------------------------


def _workload(jobs: int = 30, items: int = 10):
    made = from_spec(
        "test",
        {
            "contexts": {"m": {}},
            "stages": [{"rule": "infer", "context": "m", "items": jobs * items, "per_job": items}],
        },
    )
    made.contexts["m"].load = {LoadKind.SOURCE: 5.0, LoadKind.CACHE: 2.0}
    return made


TIMES = JobTimes(item={("infer", "a10"): 0.5})


def _simulation(lifetimes: str, seed: int = 1, **fleet_options) -> engine.Simulation:
    kinds = [ServerKind("a10", 2, partition="short"), ServerKind("a10", 2, partition="long")]
    return engine.Simulation(
        _workload(),
        Fleet(kinds, join_at=0.0, **fleet_options),
        TIMES,
        preemption=Preemption(lifetimes=parse_lifetimes(lifetimes)),
        options=Options(seed=seed),
    )


def test_a_server_whose_life_ends_is_preempted_and_counted():
    sim = _simulation("short=exp:20", restart=2.0)
    result = sim.run()
    short = [s for s in sim.every if s.kind.where == "short"]
    killed = [s for s in short if s.left is not None and s.left < result.makespan]
    assert killed and result.preemptions == len(killed)
    assert all(s.left is None or s.left >= result.makespan for s in sim.every if s not in short)
    # Each died at its join plus its own draw, seeded by the run and its address.
    first = killed[0]
    drawn = Memoryless(20.0).draw(random.Random(f"1 {first.address}"))
    assert first.left == pytest.approx(first.joined + drawn)
    # Restarted: a new incarnation, with its own life.
    assert any(s.address.endswith("/2") for s in short)
    # The dispatch machine saw preemptions, and the book counts deaths by partition.
    preempted = [e for e in sim.events if e[1] == "preempted"]
    assert len(preempted) == len(killed) and "end of its life" in preempted[0][2]
    book = sim.dispatch.fleet.survival
    died = [life for life in book.lives if life.died]
    assert len(died) == len(killed) and {life.group for life in died} == {"short"}
    assert result.jobs == 30 and result.failed == 0


def test_a_lost_servers_loss_is_a_preemption():
    from snakemake_executor_context.fleet import events as ev

    sim = _simulation("*=exp:15", restart=1.0)
    seen: list[ev.ServerLeft] = []
    emit = sim.emit

    def spy(event):
        if isinstance(event, ev.ServerLeft) and not event.expected:
            seen.append(event)
        emit(event)

    sim.emit = spy  # type: ignore[method-assign]
    sim.run()
    assert seen and all(e.cause().kind == LossKind.PREEMPTION for e in seen)


def test_a_run_with_lifetimes_is_deterministic():
    lives = "short=bathtub:10:20:120:200:10,long=weibull:0.8:60"
    first, again = _simulation(lives, seed=4).run(), _simulation(lives, seed=4).run()
    other = _simulation(lives, seed=5).run()
    assert first.preemptions > 0 and first.events == again.events
    assert first.makespan == again.makespan and other.events != first.events


def test_pilots_draw_lives_and_the_pool_asks_for_survival_when_on(monkeypatch):
    from snakemake_executor_context.simulate import simpool as pilots

    asked: list[object] = []
    real = pilots.next_kind

    def spy(ready, held, survival=None):
        asked.append(survival)
        return real(ready, held, survival=survival)

    monkeypatch.setattr(pilots, "next_kind", spy)
    for on in (False, True):
        asked.clear()
        kinds = [ServerKind("a10", 3, partition="short"), ServerKind("a10", 3, partition="long")]
        sim = engine.Simulation(
            _workload(40),
            Fleet(kinds, pool=PoolSpec(maximum=3, queue_wait=2.0)),
            TIMES,
            preemption=Preemption(lifetimes=parse_lifetimes("short=exp:10")),
            options=Options(seed=2, survival=on),
        )
        result = sim.run()
        assert result.preemptions > 0 and result.jobs == 40
        assert {s.name.split("-")[1] for s in sim.every} == {"short", "long"}
        if on:
            assert asked and all(isinstance(x, list) and len(x) == 2 for x in asked)
            assert all(0.0 <= p <= 1.0 for x in asked for p in x)  # type: ignore[union-attr]
        else:
            assert asked and all(x is None for x in asked)


def test_the_command_passes_survival_and_lifetimes_on(tmp_path: Path, monkeypatch, capsys):
    spec = tmp_path / "w.yaml"
    spec.write_text("contexts: {m: {}}\nstages:\n  - {rule: infer, context: m, count: 8}\n")
    made: list[engine.Simulation] = []
    real = engine.Simulation.run

    def spy(self):
        made.append(self)
        return real(self)

    monkeypatch.setattr(engine.Simulation, "run", spy)
    base = ["simulate", "--spec", str(spec), "--gpus", "a10:2", "--item-seconds", "infer=1",
            "--load-seconds", "m:source=3", "--counts", "none", "--json"]  # fmt: skip
    assert cli.main([*base, "--survival", "--lifetimes", "a10=exp:30"]) == 0, capsys.readouterr()
    assert made[-1].dispatch.fleet.survival_placement is True
    assert made[-1].preemption.lifetimes == {"a10": Memoryless(30.0)}
    assert cli.main(base) == 0
    assert made[-1].dispatch.fleet.survival_placement is False
    capsys.readouterr()
    assert cli.main([*base, "--lifetimes", "a10=exp:0"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--lifetimes a10 'exp:0'" in err[0] and "below 1 s" in err[0], err
