"""The simulator (snakemake_executor_context/simulate): it drives the real dispatch
machine and placement (never a copy of them), is deterministic with a seed, accounts
for every GPU-second once, and its command line names what it is missing in one line.
The replays of real runs are in tests/simulate/test_simulate_replay.py."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from snakemake_executor_context.dispatch import machine as dispatch_module
from snakemake_executor_context.dispatch.vocabulary import StopRunning
from snakemake_executor_context.fleet.buckets import Bucket
from snakemake_executor_context.fleet.loads import LoadKind
from snakemake_executor_context.fleet.placement import Decision, PlacementStep
from snakemake_executor_context.simulate import engine
from snakemake_executor_context.simulate.clock import Clock
from snakemake_executor_context.simulate.model import (
    Fleet,
    JobTimes,
    Options,
    PoolSpec,
    Preemption,
    ServerKind,
    Storage,
)
from snakemake_executor_context.simulate.result import describe
from snakemake_executor_context.simulate.shared import Shared
from snakemake_executor_context.simulate.simledger import ledger
from snakemake_executor_context.simulate.workload import from_spec
from tests.conftest import BIN, REPO, bench_module

paper = bench_module("paper")
PACKAGE = REPO / "snakemake_executor_context"
SIMULATE = PACKAGE / "simulate"


def _workload(jobs: int = 40, items: int = 10):
    made = from_spec(
        "test",
        {
            "contexts": {"m": {"bytes": 4e9}},
            "stages": [
                {"rule": "infer", "context": "m", "items": jobs * items, "per_job": items},
                {"rule": "merge", "local": True, "after": ["infer"]},
            ],
        },
    )
    made.contexts["m"].load = {LoadKind.SOURCE: 8.0, LoadKind.CACHE: 2.0}
    return made


TIMES = JobTimes(item={("infer", "a10"): 0.2, ("infer", "titanx"): 0.4})
FLEET = Fleet([ServerKind("a10", 3), ServerKind("titanx", 3)], join_at=0.5)


# -- the real code, driven, never copied ---------------------------------------------


def _functions(path: Path) -> dict[str, str]:
    """Each function of a module (5 statements or more): its body with every name
    replaced, so that a renamed copy compares equal."""

    class Anonymous(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:
            return ast.copy_location(ast.Name(id="_", ctx=node.ctx), node)

        def visit_arg(self, node: ast.arg) -> ast.AST:
            return ast.copy_location(ast.arg(arg="_"), node)

    out = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            statements = sum(isinstance(n, ast.stmt) for n in ast.walk(node)) - 1
            if statements >= 5:
                body = ast.Module(body=node.body, type_ignores=[])
                out[f"{path.name}:{node.name}"] = ast.dump(Anonymous().visit(body))
    return out


DECISION_CODE = [
    PACKAGE / "dispatch" / "machine.py",
    PACKAGE / "dispatch" / "inflight.py",
    PACKAGE / "fleet" / "placement.py",
    PACKAGE / "fleet" / "state.py",
    PACKAGE / "fleet" / "index.py",
    PACKAGE / "fleet" / "poolsizing.py",
    PACKAGE / "fleet" / "losses.py",
    PACKAGE / "fleet" / "eviction.py",
    PACKAGE / "fleet" / "peerchoice.py",
    PACKAGE / "fleet" / "accounting.py",
    PACKAGE / "server" / "slots" / "gate.py",
]


def test_the_simulator_imports_the_decision_code_and_copies_none_of_it():
    imported: set[str] = set()
    ours: dict[str, str] = {}
    for path in SIMULATE.glob("*.py"):
        ours.update(_functions(path))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                module = "." * node.level + node.module
                imported.update(f"{module}.{alias.name}" for alias in node.names)
    for needed in (
        "..dispatch.machine.Dispatch",
        "..fleet.poolsizing.pilots_wanted",
        "..fleet.poolsizing.growth_limit",
        "..fleet.poolsizing.useful_pilots",
        "..fleet.poolsizing.next_kind",
        "..fleet.poolsizing.pilots_to_release",
        "..fleet.eviction.to_evict",
        "..fleet.losses.finishes_in_grace",
        "..fleet.peerchoice.choose_origin",
        "..fleet.accounting.account",
        "..server.slots.gate.may_start",
    ):
        assert needed in imported, f"the simulator does not import {needed}"
    real: dict[str, str] = {}
    for path in DECISION_CODE:
        real.update(_functions(path))
    names = {name.split(":")[1] for name in real}
    copied = sorted(
        f"{ours_name} is {real_name}"
        for ours_name, body in ours.items()
        for real_name, real_body in real.items()
        if body == real_body
    )
    assert not copied, copied
    redefined = sorted(
        name
        for name in (n.split(":")[1] for n in ours)
        if name in names and name.startswith(("choose", "expected_wait", "load_cost", "pilots"))
    )
    assert not redefined, redefined


def test_every_decision_is_the_real_placements(monkeypatch):
    """The simulated jobs go where the real placement sends them: counted, and when
    placement refuses every job, nothing runs."""
    calls = []
    real = dispatch_module.choose_server

    def counted(*args, **kwargs):
        decision = real(*args, **kwargs)
        calls.append(decision.step)
        return decision

    monkeypatch.setattr(dispatch_module, "choose_server", counted)
    result = engine.Simulation(_workload(), FLEET, TIMES).run()
    assert result.jobs == 41 and len(calls) >= 40
    placed = sum(result.placed.values())
    placing = {"warm", "queued", "load", "any", "cold-start"}
    assert placed == sum(1 for step in calls if step in placing)

    monkeypatch.setattr(
        dispatch_module, "choose_server", lambda *a, **k: Decision(None, PlacementStep.BUSY)
    )
    stuck = engine.Simulation(_workload(), FLEET, TIMES, options=Options(limit=600.0)).run()
    assert stuck.jobs == 0 and stuck.per_server == {f"a10-{i}": 0 for i in range(3)} | {
        f"titanx-{i}": 0 for i in range(3)
    }


# -- deterministic ---------------------------------------------------------------------


def _eventful(seed: int):
    times = replace(TIMES, cv=0.3)
    return engine.Simulation(
        _workload(60),
        replace(FLEET, restart=2.0),
        times,
        preemption=Preemption(rates={"*": 2 / 60}),
        options=Options(seed=seed),
    ).run()


def test_the_same_seed_gives_the_same_event_log():
    first, again, other = _eventful(7), _eventful(7), _eventful(8)
    assert first.preemptions > 0 and first.attempts_lost > 0
    assert first.events == again.events and len(first.events) > 200
    assert first.makespan == again.makespan
    assert other.events != first.events


# -- what a run took -------------------------------------------------------------------


def test_each_servers_buckets_add_up_to_its_life():
    """Every second of every server in exactly one bucket: with kills, drains (TERM),
    a pool's pilots and loads of every kind."""
    for preemption, fleet in (
        (Preemption(rates={"*": 3 / 60}), replace(FLEET, restart=2.0)),
        (Preemption(rates={"titanx": 3 / 60}, signal="TERM", grace=5.0), FLEET),
        (Preemption(), replace(FLEET, pool=PoolSpec(maximum=4, queue_wait=5.0))),
    ):
        sim = engine.Simulation(_workload(60), fleet, TIMES, preemption=preemption)
        result = sim.run()
        assert result.jobs == 61
        end = result.makespan
        for server in sim.every:
            buckets = ledger([server], end).buckets
            life = (server.left if server.left is not None else end) - server.joined
            assert sum(buckets.values()) == pytest.approx(life, abs=1e-6), server.name
        if fleet.pool is not None:
            assert (
                result.ledger.buckets[Bucket.ALLOCATED_BEFORE] > 0
            )  # pilots start before registering
            assert result.pool and result.pool["started"] >= 1


def test_loads_from_the_source_share_the_filesystem():
    clock = Clock()
    link = Shared(clock, lambda n: 100.0)
    ends: dict[str, float] = {}
    link.add("a", 100.0, lambda: ends.setdefault("a", clock.now))
    clock.after(0.5, link.add, "b", 100.0, lambda: ends.setdefault("b", clock.now))
    clock.run(lambda: len(ends) == 2)
    # a alone for 0.5 s (50 bytes), then both at 50 bytes/s: a ends at 1.5, b at 2.0.
    assert ends == pytest.approx({"a": 1.5, "b": 2.0})


def test_the_paper_model_runs_at_a_small_size():
    """The paper's workload and fleet, scaled down: full beats partial beats
    agnostic, and peer transfers spare the shared filesystem."""
    params = paper.Params(claim_seconds=0.05, init_seconds=10.0, source_seconds=20.0)
    runs = {mode: paper.run(params, mode, claims=4000) for mode in ("full", "partial", "agnostic")}
    assert runs["full"].makespan < runs["partial"].makespan < runs["agnostic"].makespan
    assert runs["agnostic"].loads == {"source": 40}
    fleet, slow = paper.mixed_fleet(12, pool=PoolSpec(queue_wait=5.0, loads_per_source=0))
    grown = paper.run(replace(params, slowdowns=slow), "full", fleet, claims=4000, peer=True)
    assert grown.jobs == 40 and grown.loads.get("peer", 0) > 0


def test_the_ledger_cuts_a_simulated_load_as_the_catalogs_and_splits_by_rule():
    """The simulator's ledger is the fleet's account of its servers' lives: a load from
    a peer is its transfer (loading_peer), then the load from the cache it filled
    (loading_cache), as a real one's ContextReady splits it; a pilot is charged its
    allocation before it registered; each rule's jobs carry their own seconds."""
    params = paper.Params(claim_seconds=0.05, init_seconds=10.0, source_seconds=20.0)
    fleet, slow = paper.mixed_fleet(12, pool=PoolSpec(queue_wait=5.0, loads_per_source=0))
    result = paper.run(replace(params, slowdowns=slow), "full", fleet, claims=4000, peer=True)
    buckets = result.ledger.buckets
    peer_loads = result.loads["peer"]
    # Each peer load's rest is its state's creation (10 s), from the cache it filled.
    assert buckets[Bucket.LOADING_CACHE] == pytest.approx(10.0 * peer_loads)
    assert buckets[Bucket.LOADING_PEER] > 0 and buckets[Bucket.ALLOCATED_BEFORE] > 0
    infer = result.ledger.rules["infer"]
    assert infer[Bucket.RUNNING] == pytest.approx(buckets[Bucket.RUNNING])
    assert infer[Bucket.LOADING_PEER] == pytest.approx(buckets[Bucket.LOADING_PEER])
    assert Bucket.ALLOCATED_BEFORE not in infer and Bucket.IDLE_WARM not in infer
    assert sum(sum(r.values()) for r in result.ledger.rules.values()) == pytest.approx(
        result.ledger.total
    )
    text = describe(result)
    assert "GPU-hours by rule" in text and "loading_peer" in text.split("by rule")[1]


def test_a_command_the_simulator_does_not_carry_out_is_an_error():
    """As the executor's adapter, the simulated one refuses a command of dispatch it
    does not know, naming it, instead of dropping it."""
    sim = engine.Simulation(_workload(4), FLEET, TIMES)
    with pytest.raises(TypeError, match="does not carry out: StopRunning"):
        sim._carry(StopRunning(("infer-1",)))
    with pytest.raises(TypeError, match="does not carry out: 'a command'"):
        sim._carry("a command")  # type: ignore[arg-type]


# -- the command line --------------------------------------------------------------------


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "snakemake-context"), "simulate", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def factcheck(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "workflows" / "factcheck", tmp_path / "factcheck")
    shutil.copytree(REPO / "workflows" / "llm", tmp_path / "llm")
    return tmp_path / "factcheck"


def test_simulate_on_the_factcheck_snakefile_names_the_missing_times_in_one_line(factcheck):
    done = _cli(
        "-s", "Snakefile", "--gpus", "a10:10,titanx:10", "--preempt", "1/min", cwd=factcheck
    )
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    line = lines[0]
    assert "missing times" in line and "rule 'verify' on a10, titanx" in line
    assert "--item-seconds verify=S" in line and "--load-seconds smollm2:" in line
    assert "Traceback" not in done.stderr
    # Given the times, it predicts (the table over GPU counts too).
    done = _cli(
        "-s", "Snakefile", "--gpus", "a10:2,titanx:2", "--preempt", "1/min",
        "--item-seconds", "verify@a10=0.05", "--item-seconds", "verify@titanx=0.1",
        "--items", "verify=32", "--load-seconds", "smollm2:source=20", "--counts", "2,4",
        cwd=factcheck,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "predicted makespan" in done.stdout and "GPU-hours by bucket" in done.stdout
    assert "loading_source" in done.stdout and "GPUs  makespan" in done.stdout


def test_bad_what_if_input_is_one_line(tmp_path):
    spec = tmp_path / "w.yaml"
    spec.write_text("contexts: {m: {}}\nstages:\n  - {rule: infer, context: m, count: 8}\n")
    for args, expected in (
        (["--gpus", "a10"], "--gpus 'a10': expected MODEL:COUNT"),
        (["--gpus", "a10:2", "--preempt", "often"], "is not a rate"),
        (["--gpus", "a10:2", "--load-seconds", "x:source=1"], "no context 'x'"),
        (["--gpus", "a10:2"], "missing times"),
    ):
        done = _cli("--spec", str(spec), *args, cwd=tmp_path)
        assert done.returncode == 1 and expected in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    done = _cli(
        "--spec", str(spec), "--gpus", "a10:2", "--item-seconds", "infer=1",
        "--load-seconds", "m:source=3", "--pilots", "--queue-wait", "5", "--json",
        "--counts", "none", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert '"makespan_s"' in done.stdout and '"pool"' in done.stdout


def test_storage_defaults_model_no_transfer():
    """Without bandwidths, a load costs exactly its stated seconds."""
    result = engine.Simulation(_workload(4), Fleet([ServerKind("a10", 1)], join_at=0.0), TIMES,
                             storage=Storage()).run()  # fmt: skip
    assert result.loads == {"source": 1}
    assert result.ledger.buckets[Bucket.LOADING_SOURCE] == pytest.approx(8.0)


def test_a_run_stopped_at_the_limit_is_not_ended_and_the_bound_sees_it_first():
    """A run that reaches Options.limit is marked, so that the command refuses it
    instead of printing the limit as a makespan; the bound taken before simulating
    (the command's, and the table's per size) already exceeds the limit there."""
    from snakemake_executor_context.simulate.whatif import least_makespan

    workload, fleet = _workload(8, items=10), Fleet([ServerKind("a10", 2)], join_at=0.0)
    cut = engine.Simulation(workload, fleet, TIMES, options=Options(limit=5.0, log=False)).run()
    assert not cut.ended and cut.jobs < len(workload.jobs)
    whole = engine.Simulation(workload, fleet, TIMES, options=Options(log=False)).run()
    assert whole.ended and whole.jobs == len(workload.jobs)  # 8 and the local merge
    # 8 jobs of 10 items at 0.2 s on 2 GPUs: 16 s of work, 8 s at least, 2 s a job.
    assert least_makespan(workload, TIMES, fleet.kinds) == pytest.approx(8.0)
    assert least_makespan(workload, TIMES, fleet.kinds) <= whole.makespan


TWO_NAMES = """
from snakemake_executor_context import declare_context

declare_context(config, "first", "loader.py:load", value=5)
declare_context(config, "second", "loader.py:load", value=5)

rule all:
    input: expand("out/a{i}.txt", i=range(2)), expand("out/b{i}.txt", i=range(2))

rule a:
    output: "out/a{i}.txt"
    resources: context="first"
    script: "script.py"

rule b:
    output: "out/b{i}.txt"
    resources: context="second"
    script: "script.py"
"""


def test_measured_times_reach_a_context_under_every_name_it_is_declared_under(tmp_path, capsys):
    """The catalog keeps a context by identity under the first name it saw: a
    Snakefile's second name for it got no load time ("missing times", exit 1), and a
    name that stood for another identity in an earlier run could lend it its size."""
    from snakemake_executor_context import cli
    from snakemake_executor_context.simulate.measured import measured_contexts, read_run
    from snakemake_executor_context.simulate.snakefile import from_snakefile
    from tests.catalog_builder import CatalogBuilder

    (tmp_path / "Snakefile").write_text(TWO_NAMES)
    (tmp_path / "loader.py").write_text("def load(value=1):\n    return value\n")
    (tmp_path / "script.py").write_text("")
    workload = from_snakefile(tmp_path / "Snakefile")
    identity = workload.contexts["first"].identity
    assert workload.contexts["second"].identity == identity
    catalog = tmp_path / "catalog.db"
    with CatalogBuilder(catalog) as b:
        server = b.server("a10-0", gpu="NVIDIA A10")
        # An earlier run: "first" was another loader's (its code changed since).
        old = b.context("first", loader="old.py:load")
        earlier = b.run()
        b.load(server, old, seconds=30.0, nbytes=9_000_000_000)
        b.job(earlier, "a", server=server, context=old, seconds=1.0)
        b.finish_run(earlier)
        b.evict(server, old)
        b.commit()
        # The latest: one context, recorded under the name its first job used.
        b.context("second", loader="loader.py:load", arguments={"value": 5}, identity=identity)
        latest = b.run()
        b.load(server, identity, seconds=4.0, nbytes=1_000_000_000)
        for rule, i in (("b", 0), ("a", 0), ("a", 1), ("b", 1)):
            b.job(latest, rule, server=server, context=identity, seconds=2.0, items=1,
                  wildcards={"i": str(i)})  # fmt: skip
        b.finish_run(latest)
    models = measured_contexts(workload, read_run(str(catalog)))
    assert set(models) == {"first", "second"}
    for model in models.values():
        assert model.identity == identity and model.nbytes == 1_000_000_000
        assert model.load == {LoadKind.SOURCE: 4.0}
    argv = ["simulate", "-s", str(tmp_path / "Snakefile"), "--catalog", str(catalog)]
    assert cli.main([*argv, "--counts", "none", "--json"]) == 0, capsys.readouterr().err
    predicted = json.loads(capsys.readouterr().out)["predicted"]
    assert predicted["jobs"] == 4 and predicted["loads"] == {"source": 1}, predicted
