"""Placement that sees the work still to come: real runs of the real snakemake command
line (embedded cluster, and an attached plain Dask cluster that a server joins
mid-run), with loaders that sleep for a known time."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import BIN, context_run, plain_dask_cluster

pytestmark = pytest.mark.slow


def _use(run) -> tuple[Counter, dict[str, dict]]:
    """Jobs per server name, and each server's inventory by name (last summary)."""
    summary = run.summaries()[-1]
    jobs = Counter(job["server"] for job in summary["jobs"])
    servers = {inv["server"]["name"]: inv for inv in summary["servers"].values()}
    return jobs, servers


def test_the_rest_of_the_run_pays_for_a_second_load(workflow):
    """60 jobs of 0.5 s, a 2.5 s load, --jobs 4: Snakemake hands over 4 jobs at a
    time (2 s of work, less than the load), but the run's 60 are what the second
    server's load is weighed against."""
    workdir = workflow("demand")
    run = context_run(
        workdir, "--context-servers", "2", "--config", "count=60", "load=2.5", "sleep=0.5"
    ).check()
    jobs, servers = _use(run)
    assert {name: inv["loads"] for name, inv in servers.items()} == {"cpu0": 1, "cpu1": 1}
    assert min(jobs.values()) >= 20, jobs
    assert "busy" in run.output and "idle" in run.output  # the summary says so per server
    use = run.summaries()[-1]["server_use"]
    assert set(use) == {"cpu0", "cpu1"} and all(row["busy"] > 0 for row in use.values())


def test_few_jobs_do_not_pay_for_a_second_load(workflow):
    """3 jobs of 1 s and a 20 s load: no server loads for work it cannot win."""
    workdir = workflow("demand")
    run = context_run(
        workdir, "--context-servers", "2", "--config", "count=3", "load=20", "sleep=1"
    ).check()
    _, servers = _use(run)
    assert sum(inv["loads"] for inv in servers.values()) == 1


@pytest.mark.parametrize(("budget", "max_loads", "max_evictions"), [("150MB", 3, 1), ("1GB", 4, 0)])
def test_two_contexts_on_two_servers(workflow, budget, max_loads, max_evictions):
    """More jobs than --jobs, two contexts of 100 MB: with room for one per server
    the two never take turns; with room for both, nothing is evicted."""
    workdir = workflow("demand")
    run = context_run(
        workdir,
        "--context-servers",
        "2",
        "--context-contexts-memory",
        budget,
        "--config",
        "count=12",
        "count_b=12",
        "load=2",
        "sleep=0.5",
        "nbytes=100000000",
    ).check()
    _, servers = _use(run)
    loads = sum(inv["loads"] for inv in servers.values())
    evictions = sum(inv["evictions"] for inv in servers.values())
    assert loads <= max_loads and evictions <= max_evictions, (loads, evictions)


def _loads_started(workdir: Path) -> list[float]:
    """When each load of the run began, from the catalog (placements.loading_at)."""
    with sqlite3.connect(workdir / ".snakemake/context/catalog.db") as db:
        return sorted(at for (at,) in db.execute("SELECT loading_at FROM placements"))


@pytest.mark.parametrize("by_function", [0, 1], ids=["named", "by-a-function"])
def test_cold_start_eight_jobs_load_on_both_idle_servers_at_once(workflow, by_function):
    """Nothing measured, 8 jobs of one context and 2 idle cold servers: both servers
    start loading within 0.5 s of each other (the second no longer waits for a job
    time), and both run jobs; also when the rule names its context by a function of
    its wildcards (the run's DAG still counts its jobs)."""
    workdir = workflow("demand")
    config = ("count=8", "load=3", "sleep=0.5", f"by_function={by_function}")
    run = context_run(workdir, "--context-servers", "2", "--jobs", "2", "--config", *config).check()
    started = _loads_started(workdir)
    assert len(started) == 2 and started[1] - started[0] <= 0.5, started
    jobs, _ = _use(run)
    assert set(jobs) == {"cpu0", "cpu1"} and min(jobs.values()) >= 3, jobs
    placed = {job["placed_by"] for job in run.summaries()[-1]["jobs"]}
    assert "cold-start" in placed, placed


def test_a_catalogs_history_leaves_the_choice_to_the_measured_rule(workflow):
    """A first run measures a 4 s load and a 0.2 s job; the next run of 8 jobs starts
    from that history: 8 jobs of 0.2 s on the warm server beat a 4 s load, so one
    load, not the two a cold start would make."""
    workdir = workflow("demand")
    config = ("--config", "load=4", "sleep=0.2")
    context_run(workdir, "--context-servers", "1", *config, "count=1").check()
    (workdir / "a/0.txt").unlink()
    run = context_run(workdir, "--context-servers", "2", *config, "count=8").check()
    _, servers = _use(run)
    assert sum(inv["loads"] for inv in servers.values()) == 1, servers
    assert "cold-start" not in {job["placed_by"] for job in run.summaries()[-1]["jobs"]}


def test_a_converting_load_under_a_lock_converts_once_and_the_other_loads_the_cache(
    workflow, tmp_path
):
    """The first load converts (6 s) under a lock, later ones read the converted cache
    (1 s): with 8 jobs and nothing measured both servers start loading at once; the
    second waits for the lock, finds the conversion done and loads from the cache,
    so the conversion happens once."""
    workdir = workflow("demand")
    cache = tmp_path / "cache"
    run = context_run(
        workdir,
        "--context-servers",
        "2",
        "--config",
        "count=8",
        "load=6",
        "sleep=1",
        "loader=convert_once",
        env={"DEMAND_CACHE": str(cache)},
    ).check()
    log = [line.split() for line in (cache / "loads.log").read_text().splitlines()]
    loads = sorted(float(at) for what, at, _ in log if what == "load")
    conversions = [pid for what, _, pid in log if what == "conversion"]
    assert len(loads) == 2 and loads[1] - loads[0] <= 0.5, log
    assert len(conversions) == 1, log
    summary = run.summaries()[-1]
    loaded = [job for job in summary["jobs"] if job["loaded"]]
    assert len({job["server"] for job in loaded}) == 2, loaded
    assert int(conversions[0]) in {job["pid"] for job in loaded}, (conversions, loaded)
    jobs, _ = _use(run)
    assert min(jobs.values()) >= 3, jobs


def test_a_server_that_joins_mid_run_gets_work(workflow, tmp_path):
    """An attached plain Dask cluster: a second worker (a pilot) joins while the run is
    under way, and loads the context because the work still to come pays for it."""
    workdir = workflow("demand")
    worker_args = ("--resources", "gpu=1,mem_mb=4000")
    with plain_dask_cluster(tmp_path, *worker_args) as scheduler:
        snakemake = subprocess.Popen(
            [
                str(BIN / "snakemake"),
                "--executor",
                "context",
                "--jobs",
                "4",
                "--context-scheduler-file",
                str(scheduler),
                "--context-allow-plaintext",
                "--config",
                "count=30",
                "load=1.5",
                "sleep=0.5",
            ],
            cwd=workdir,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        joined = None
        try:
            deadline = time.monotonic() + 120
            while len(list((workdir / "a").glob("*.txt"))) < 3:
                assert snakemake.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
            joined = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "distributed.cli.dask_worker",
                    "--scheduler-file",
                    str(scheduler),
                    "--nthreads",
                    "1",
                    "--no-dashboard",
                    "--name",
                    "pilot",
                    *worker_args,
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            output, _ = snakemake.communicate(timeout=240)
        finally:
            if snakemake.poll() is None:
                os.killpg(snakemake.pid, 9)
            if joined is not None:
                joined.terminate()
                joined.wait(timeout=30)
    assert snakemake.returncode == 0, output
    runs = sorted((workdir / ".snakemake/context/runs").glob("*.json"))
    summary = json.loads(Path(runs[-1]).read_text())
    jobs = Counter(job["server"] for job in summary["jobs"])
    assert jobs["pilot"] >= 5, jobs
    pilot_loads = [job for job in summary["jobs"] if job["server"] == "pilot" and job["loaded"]]
    assert len(pilot_loads) == 1
