"""Three small real runs (the real snakemake command line, an embedded cluster, one
with the preemption injector killing servers), each replayed by the simulator with the
times its catalog recorded: the predicted makespan lands within 15% of the measured.

The simulator drives the real dispatch machine; what it is given is what the
catalog measured (job and load times, when servers joined and were lost), never the
run's outcome (its makespan, its jobs per server)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from snakemake_executor_context.simulate.replay import Replay, replay
from tests.conftest import BIN, context_run

pytestmark = pytest.mark.slow

#: The issue's bound on a replay's makespan error.
TOLERANCE = 0.15


def _check(workdir: Path, config: dict[str, object]) -> Replay:
    result = replay(
        str(workdir / ".snakemake" / "context" / "catalog.db"),
        snakefile=workdir / "Snakefile",
        workdir=workdir,
        config=config,
    )
    print(result.describe())
    assert result.predicted.jobs == len(result.measured.jobs)
    assert abs(result.makespan_error) <= TOLERANCE, result.describe()
    return result


def test_a_run_with_one_context_is_replayed_within_15_percent(workflow):
    """16 jobs of 1 s, a 3 s load, 2 servers, --jobs 4 (placement weighs the second
    server's load against the run's remaining work)."""
    workdir = workflow("demand")
    config = {"count": 16, "load": 3, "sleep": 1}
    context_run(
        workdir, "--context-servers", "2", "--config", *[f"{k}={v}" for k, v in config.items()]
    ).check()
    result = _check(workdir, config)
    assert set(result.measured.per_server()) == set(result.predicted.per_server)


def test_a_run_that_converts_then_loads_from_the_cache_is_replayed_within_15_percent(
    workflow, tmp_path
):
    """A loader that converts once (4 s) into a cache the three servers share, then
    loads from it (1 s): loads of two kinds. 6 jobs make one load before anything is
    measured (the cold start asks 4 jobs per server); 18 would start all three at once,
    two of them waiting for the conversion's lock. Jobs of 3 s: with jobs of 1 s the
    replay missed by -10.5% on an idle machine and -15.8% in a loaded CI run (measured
    10.2 s, predicted 8.5 s), where a second of latency is a large part of the run;
    with 3 s, +5.9% idle and -1.0% beside two busy loops."""
    workdir = workflow("demand")
    config = {"count": 6, "load": 4, "sleep": 3, "loader": "convert_once"}
    context_run(
        workdir,
        "--context-servers",
        "3",
        "--jobs",
        "6",
        "--config",
        *[f"{k}={v}" for k, v in config.items()],
        env={"DEMAND_CACHE": str(tmp_path / "cache")},
    ).check()
    result = _check(workdir, config)
    kinds = {load.kind.value for load in result.measured.loads}
    assert kinds == {"conversion", "cache"}, result.measured.loads
    assert set(result.predicted.loads) == kinds, result.predicted.loads


def test_a_run_under_injected_kills_is_replayed_within_15_percent(workflow):
    """20 jobs of 1 s on 2 servers; the injector kills a server every 4 s, twice,
    alternating, each back after 1 s: the replay kills them when the catalog
    recorded the losses."""
    workdir = workflow("preempt")
    injector = subprocess.Popen(
        [
            str(BIN / "snakemake-context"),
            "inject",
            "--scheduler-file",
            str(workdir / ".snakemake/context/cluster"),
            "--every",
            "4",
            "--alternate",
            "--count",
            "2",
            "--replace-after",
            "1",
            "--log",
            str(workdir / "inject.jsonl"),
        ],
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        config = {"count": 20, "sleep": 1}
        context_run(
            workdir,
            "--context-servers",
            "2",
            "--retries",
            "0",
            "--config",
            *[f"{k}={v}" for k, v in config.items()],
        ).check()
    finally:
        deadline = time.monotonic() + 30
        while injector.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if injector.poll() is None:
            injector.terminate()
            injector.wait()
    result = _check(workdir, config)
    assert len(result.measured.losses) >= 1
    assert result.predicted.losses == len(result.measured.losses)
