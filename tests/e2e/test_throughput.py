"""Thousands of jobs and dozens of servers: the real snakemake CLI on DAGs of no-op
context jobs, under Snakemake's default scheduler and the greedy one, and 64 real
servers of which a quarter are killed at once (the injector, one SIGKILL each).

The rates are the benchmark's (``workflows/bench/throughput.py``), never asserted
here; what is asserted is that nothing is lost and nothing is counted twice."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from snakemake_executor_context.executor.pacing import HOLD_SECONDS, tell_now
from snakemake_executor_context.snakemake_internals import CANDIDATES, thin_selections
from tests.conftest import BIN, context_run

SNAKEFILE = """
from snakemake_executor_context import declare_context

declare_context(config, "noop", "loader.py:load")

rule all:
    input: expand("out/{i}.txt", i=range(int(config["size"])))

rule noop:
    output: "out/{i}.txt"
    resources: context="noop"
    script: "noop.py"
"""
LOADER = "def load():\n    return {'loaded': True}\n"
SCRIPT = """
import time

time.sleep(float(snakemake.config.get("seconds", 0)))
with open(snakemake.output[0], "w") as f:
    f.write("done\\n")
"""
#: Put before SCRIPT: a mark of each job's start (the jobs running are those started,
#: less those with an output).
STARTED = """
import os

os.makedirs("started", exist_ok=True)
open(f"started/{snakemake.wildcards.i}", "w").close()
"""
#: Appended to SCRIPT: a marker for each run of it, once its output is written.
MARKER = """
import os

os.makedirs("runs", exist_ok=True)
open(f"runs/{snakemake.wildcards.i}.{os.getpid()}.{time.time_ns()}", "w").close()
"""


def _noop_workflow(directory: Path) -> Path:
    directory.mkdir(parents=True)
    for name, text in {"Snakefile": SNAKEFILE, "loader.py": LOADER, "noop.py": SCRIPT}.items():
        (directory / name).write_text(text)
    return directory


def _catalog(workdir: Path, query: str) -> list[tuple]:
    with sqlite3.connect(workdir / ".snakemake/context/catalog.db") as db:
        return db.execute(query).fetchall()


def _every_job_once(workdir: Path, size: int, output: str) -> None:
    """Every output written, Snakemake told of each job once, and the catalog's counts
    exact: one run, ``size`` jobs ok, none failed, one ok attempt each."""
    missing = [i for i in range(size) if (workdir / "out" / f"{i}.txt").read_text() != "done\n"]
    assert not missing, missing[:10]
    assert output.count("(Rule: noop)") == size
    ((jobs_ok, jobs_failed),) = _catalog(workdir, "select jobs_ok, jobs_failed from runs")
    assert (jobs_ok, jobs_failed) == (size, 0)
    outcomes = _catalog(workdir, "select outcome, count(*) from jobs group by outcome")
    assert outcomes == [("ok", size)]
    ((ok_attempts, ok_jobs),) = _catalog(
        workdir,
        "select count(*), count(distinct job_id) from attempts where outcome = 'ok'",
    )
    assert ok_jobs == size
    assert ok_attempts == size


@pytest.mark.slow
@pytest.mark.parametrize(
    ("scheduler", "size"),
    [
        ("ilp", 1000),
        ("greedy", 1000),
        # Each took 2 minutes in CI, beside the other tests.
        pytest.param("ilp", 2000, marks=pytest.mark.long),
        pytest.param("greedy", 2000, marks=pytest.mark.long),
    ],
)
def test_thousands_of_context_jobs_under_each_scheduler(tmp_path, scheduler, size):
    """Thousands of ready jobs: Snakemake's default scheduler solved an integer program
    over all of them per finished job (5 jobs/s at 8,000) before the executor thinned
    its selections; both schedulers now run every job once."""
    workdir = _noop_workflow(tmp_path / scheduler)
    args = ["--scheduler", scheduler, "--context-servers", "2", "--jobs", "16", "all"]
    run = context_run(workdir, *args, "--config", f"size={size}", timeout=300).check()
    _every_job_once(workdir, size, run.output)
    # Written by the embedded cluster's hub, not by Snakemake's process.
    (log,) = (workdir / ".snakemake/context/cluster").glob("*.log")
    assert "hub INFO context catalog:" in log.read_text()


#: Runs Snakemake's command line in this process, counting the passes of its scheduler's
#: loop that select jobs and the most timer threads alive at one of them.
COUNTING_DRIVER = """
import json, sys, threading
from snakemake.scheduling import job_scheduler

seen = {"passes": 0, "timers": 0}
select = job_scheduler.JobScheduler.job_selector

def counted(self, jobs):
    seen["passes"] += 1
    alive = sum(isinstance(t, threading.Timer) for t in threading.enumerate())
    seen["timers"] = max(seen["timers"], alive)
    return select(self, jobs)

job_scheduler.JobScheduler.job_selector = counted
from snakemake.cli import main
sys.argv = ["snakemake", *sys.argv[1:]]
try:
    main()
finally:
    with open("passes.json", "w") as f:
        json.dump(seen, f)
"""


@pytest.mark.slow
def test_finished_jobs_wake_snakemakes_loop_once_per_report_and_one_timer_is_pending(tmp_path):
    """Snakemake's scheduler, under its default job rate limit, starts a 1 s timer that
    wakes its loop at every pass over ready jobs, and every such wake-up is a pass that
    starts another: before, 1,000 jobs made 3,507 passes with 262 timer threads alive
    at once, the loop busy for the whole run. And each job told finished woke it once
    more. Now one wake-up is pending at a time and the jobs told together wake it once:
    fewer passes than half the jobs (285 for 1,000 measured)."""
    size = 400
    workdir = _noop_workflow(tmp_path / "passes")
    (workdir / "count.py").write_text(COUNTING_DRIVER)
    args = ["--executor", "context", "--context-servers", "2", "--jobs", "8", "all"]
    run = subprocess.run(
        [str(BIN / "python"), "count.py", *args, "--config", f"size={size}"],
        cwd=workdir, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    _every_job_once(workdir, size, run.stdout + run.stderr)
    seen = json.loads((workdir / "passes.json").read_text())
    assert seen["timers"] <= 2, seen
    assert seen["passes"] < size // 2, seen


@pytest.mark.slow
@pytest.mark.parametrize(
    ("servers", "size", "seconds"),
    # 64 servers on 2 cores: about 2 minutes alone, 4 beside CI's other tests.
    [(16, 200, 2), pytest.param(64, 1000, 5, marks=[pytest.mark.long, pytest.mark.timeout(900)])],
)
def test_a_quarter_of_the_servers_killed_at_once_lose_no_job_and_count_every_loss(
    tmp_path, servers, size, seconds
):
    """``servers`` servers, ``size`` jobs of ``seconds`` (longer than the injector takes
    to reach its targets: about 3 s at 64 servers); once a fifth of the outputs exist
    a quarter of the servers get SIGKILL in the same turn of the injector, cutting off
    the jobs they ran. The run exits 0; every job is reported once with exactly one ok
    attempt; every attempt has an outcome; every attempt not ok is lost, in a loss row
    of a killed server, and the loss rows count them all (before: the hub's record of
    several killed servers was empty, and 2 attempts kept no outcome). A job whose
    server said it had ended ok, but died holding its result, is not run again
    (before: 9-12 of 1,000 ran twice). Each run of the script leaves a marker: a job
    whose script ran twice must have a lost attempt (its server died between the
    script's end and its report of it, a few milliseconds: nothing told anyone it ended)."""
    workdir = _noop_workflow(tmp_path / "fleet")
    (workdir / "noop.py").write_text(STARTED + SCRIPT + MARKER)
    command = [str(BIN / "snakemake"), "--executor", "context", "--jobs", str(servers)]
    command += ["--context-servers", str(servers), "all", "--config", f"size={size}"]
    command += [f"seconds={seconds}"]
    run = subprocess.Popen(
        command, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 240
    out, begun = workdir / "out", workdir / "started"
    while time.monotonic() < deadline and run.poll() is None:
        done = sum(1 for _ in out.iterdir()) if out.is_dir() else 0
        running = (sum(1 for _ in begun.iterdir()) if begun.is_dir() else 0) - done
        # Snakemake hands jobs in waves: the kills land inside one, not between two.
        if done >= size // 5 and running >= servers // 2:
            break
        time.sleep(0.02)
    decided = time.time()
    killed = servers // 4
    injected = subprocess.run(
        [str(BIN / "snakemake-context"), "inject", "--scheduler-file",
         str(workdir / ".snakemake/context/cluster"), "--fraction", "0.25", "--count",
         str(killed), "--first-after", "0", "--signal", "KILL", "--log",
         str(workdir / "inject.jsonl")],
        cwd=workdir, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    try:
        output, _ = run.communicate(timeout=600)
    finally:
        run.kill()
    assert injected.returncode == 0, injected.stdout + injected.stderr
    kills = [json.loads(line) for line in (workdir / "inject.jsonl").read_text().splitlines()]
    assert len(kills) == killed
    assert run.returncode == 0, output[-6000:]
    _every_job_once(workdir, size, output)
    assert _catalog(workdir, "select count(*) from attempts where outcome is null") == [(0,)]
    outcomes = dict(_catalog(workdir, "select outcome, count(*) from attempts group by outcome"))
    lost = outcomes.pop("lost", 0)
    outcomes.pop("cancelled", None)  # queued behind a running job, never started there
    assert outcomes == {"ok": size}
    assert 0 < lost <= killed, (outcomes, kills, output[-3000:])  # a slot each
    unlinked = "select count(*) from attempts where outcome = 'lost' and loss_id is null"
    assert _catalog(workdir, unlinked) == [(0,)]
    ((counted,),) = _catalog(workdir, "select sum(jobs_lost) from server_losses")
    assert counted == lost
    where = "select distinct s.address from server_losses l join servers s on s.id = l.server_id"
    assert {address for (address,) in _catalog(workdir, where)} <= {k["address"] for k in kills}
    runs = Counter(marker.name.split(".")[0] for marker in (workdir / "runs").iterdir())
    assert set(runs) == {str(i) for i in range(size)}
    twice = {i for i, count in runs.items() if count > 1}
    with_a_loss = """
        select o.path from attempts a join job_outputs o on o.job_id = a.job_id
        where a.outcome = 'lost'"""
    lost_jobs = {Path(path).stem for (path,) in _catalog(workdir, with_a_loss)}
    assert twice <= lost_jobs, (twice, lost_jobs)
    late = kills[0]["at"] - decided
    print(f"{killed} of {servers} killed {late:.1f} s after the decision: {lost} attempts lost")
    print(f"{len(twice)} scripts ran twice")
    noted = _catalog(workdir, "select count(*) from events where kind = 'kill-injected'")
    assert noted == [(killed,)]


def test_a_success_is_held_only_while_the_servers_have_queued_work():
    """The pacing rule: told at once when nothing is queued; held while work is
    queued, until half the handed jobs are held or the hold ends."""
    assert not tell_now(held=0, handed=8, queued=0, held_for=9.0)
    assert tell_now(held=1, handed=8, queued=0, held_for=0.0)
    assert not tell_now(held=1, handed=8, queued=5, held_for=0.0)
    assert not tell_now(held=3, handed=8, queued=2, held_for=0.0)
    assert tell_now(held=4, handed=8, queued=2, held_for=0.0)
    assert tell_now(held=1, handed=8, queued=5, held_for=HOLD_SECONDS)


def test_thinned_selections_skip_full_passes_and_keep_the_highest_priorities():
    """The wrapper around Snakemake's job selector. Snakemake's scheduler is a stand-in
    here (a namespace holding a recording selector): the real one runs in the tests
    above, and the start's check (``check_snakemake``) refuses a Snakemake without
    ``JobScheduler._job_selector``."""
    asked: list[list[int]] = []

    told: list[int] = []

    class Path(str):  # an input as Snakemake flags it
        def is_flagged(self, flag: str) -> bool:
            return flag == "temp" and self.startswith("temp")

    class Job:  # a ready job as the selector sees it: hashable, a priority, inputs
        def __init__(self, priority: int, inputs: tuple[str, ...] = ()) -> None:
            self.priority = priority
            self.input = [Path(name) for name in inputs]

    def selector(jobs, remaining, resources, sizes):
        asked.append(sorted(job.priority for job in jobs))
        told.append(len(remaining))
        return list(jobs)[: resources["_nodes"]]

    scheduler = SimpleNamespace(_job_selector=selector)
    workflow = SimpleNamespace(scheduler=scheduler)
    assert thin_selections(workflow)
    assert not thin_selections(workflow)  # once per scheduler
    jobs = {Job(p) for p in range(1000)}
    full = {"_nodes": 0, "_job_count": 5, "_cores": 10**9}
    assert scheduler._job_selector(jobs, [], full, {}) == []
    assert asked == []
    assert len(scheduler._job_selector(jobs, [], {"_nodes": 8, "_job_count": 100}, {})) == 8
    assert asked[-1] == list(range(1000 - CANDIDATES, 1000))
    few = {Job(p) for p in range(10)}
    scheduler._job_selector(few, [], {"_nodes": 8}, {})
    assert asked[-1] == list(range(10))
    # The jobs still to come matter to the integer program for temp inputs only.
    to_come = [Job(p, ("temp/a.txt",)) for p in range(500)]
    scheduler._job_selector(few, to_come, {"_nodes": 8}, {})
    assert told[-1] == 0
    scheduler._job_selector({*few, Job(99, ("temp/a.txt",))}, to_come, {"_nodes": 8}, {})
    assert told[-1] == 500
