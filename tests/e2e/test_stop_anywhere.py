"""A stop at any moment of a run: SIGINT, SIGINT twice, SIGTERM, and SIGTERM then
SIGINT, to Snakemake's process group as a terminal sends them, swept over the
phases of a run (DAG building, the embedded cluster's start, the first submissions,
mid-run, the run's end and the catalog's last writes).

At every point: Snakemake exits, with no traceback; nothing the run started is
left; no lock and no half-written output stays; the catalog, where the run got a
row, records it ended and gives every attempt an outcome; and a plain rerun (no
``--rerun-incomplete``, no ``--unlock``) finishes the workflow.

Each point is a moment after a line Snakemake prints, plus a delay: lines, not
seconds from the start, so that a loaded machine moves the moments with the run.
CI runs a few points of each signal pattern; ``long`` sweeps them all.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
from contextlib import closing
from pathlib import Path

import psutil
import pytest

from tests.conftest import snakemake, toy_files
from tests.e2e.test_interrupt import descendants, snakemake_in_its_group

pytestmark = pytest.mark.slow

JOBS = 6

RULES = f"""
rule all:
    input: expand("mid/{{i}}.txt", i=range({JOBS}))

rule slow:
    output: "mid/{{i}}.txt"
    resources: context="toy"
    script: "scripts/slow.py"
"""
#: Writes half its output, then (while the workflow's `slow` file exists) waits
#: 1.5 s before writing the rest: a stop in between leaves a half-written output.
SLOW = """
import os, time
from snakemake_executor_context import load_context

load_context(snakemake)
with open(snakemake.output[0], "w") as f:
    f.write("half")
    f.flush()
    if os.path.exists("slow"):
        time.sleep(1.5)
    f.write(" whole")
"""
WHOLE = "half whole"
CLUSTER_FILES = ".snakemake/context/cluster/*"

#: The phases, each a line Snakemake prints (or, for the cluster's start, which prints
#: nothing until it is done, a file it makes) and the delays after it.
PHASES = {
    "dag": ("Building DAG of jobs...", (0.0, 0.3, 0.6)),
    "cluster-start": (CLUSTER_FILES, (0.0, 0.2, 0.5)),
    "submit": ("Execute 2 jobs...", (0.0, 0.05)),
    "mid-run": ("2 of 7 steps", (0.0, 0.4)),
    "end": ("7 of 7 steps (100%) done", (0.0, 0.03, 0.1)),
    "ledger": ("Where this run's GPU-seconds went", (0.0,)),
}
#: The signal patterns: each a list of (seconds after the last, signal).
PATTERNS = {
    "SIGINT": [(0.0, "SIGINT")],
    "SIGINT-twice": [(0.0, "SIGINT"), (0.1, "SIGINT")],
    "SIGTERM": [(0.0, "SIGTERM")],
    "SIGTERM-then-SIGINT": [(0.0, "SIGTERM"), (0.3, "SIGINT")],
}
POINTS = [(phase, delay) for phase, (_, delays) in PHASES.items() for delay in delays]


#: The points CI runs: three phases of each pattern, each phase twice in all (the
#: issue's moments among them: Ctrl-C in the cluster's start and mid-run, SIGTERM in
#: the cluster's start, a second Ctrl-C while the first cancels).
CI_POINTS = {
    "SIGINT": [("cluster-start", 0.2), ("mid-run", 0.0), ("end", 0.03)],
    "SIGINT-twice": [("dag", 0.3), ("mid-run", 0.4), ("ledger", 0.0)],
    "SIGTERM": [("cluster-start", 0.0), ("submit", 0.0), ("end", 0.1)],
    "SIGTERM-then-SIGINT": [("dag", 0.6), ("submit", 0.05), ("ledger", 0.0)],
}


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_a_stop_in_each_phase_leaves_a_plain_rerun_that_finishes(make_workflow, pattern):
    for phase, delay in CI_POINTS[pattern]:
        _stop_and_rerun(make_workflow, pattern, phase, delay)


@pytest.mark.long
@pytest.mark.parametrize("pattern", list(PATTERNS))
@pytest.mark.parametrize(("phase", "delay"), POINTS)
def test_a_stop_at_every_point_leaves_a_plain_rerun_that_finishes(
    make_workflow, pattern, phase, delay
):
    _stop_and_rerun(make_workflow, pattern, phase, delay)


def test_ctrl_c_in_the_middle_of_groups_leaves_a_plain_rerun_that_finishes(make_workflow):
    """The same stop, its jobs in groups of three: once the first half-written output
    exists, and a moment later."""
    grouped = RULES.replace('resources: context="toy"', 'resources: context="toy"\n    group: "g"')
    for delay in (0.0, 0.5):
        _stop_and_rerun(
            make_workflow, "SIGINT", "mid/*.txt", delay, grouped, ["--group-components", "g=3"]
        )


def _stop_and_rerun(
    make_workflow,
    pattern: str,
    phase: str,
    delay: float,
    rules: str = RULES,
    more: tuple[str, ...] | list[str] = (),
) -> None:
    """Run the workflow, send ``pattern`` ``delay`` s after ``phase`` (a phase's name,
    or a glob of files), check what the stop left, then a plain rerun."""
    where = f"{pattern} at {phase}+{delay:g}s"
    workdir = make_workflow(toy_files(rules, {"scripts/slow.py": SLOW, "slow": ""}))
    args = ["--executor", "context", "--jobs", "2", "--context-servers", "2", *more]
    trigger = PHASES[phase][0] if phase in PHASES else phase
    lines: list[str] = []
    seen = threading.Event()
    with snakemake_in_its_group(args, workdir) as process:

        def read() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                lines.append(line)
                if trigger in line:
                    seen.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        started: dict[int, psutil.Process] = {}
        deadline = time.monotonic() + 120
        while not (seen.wait(0.01) or ("*" in trigger and any(workdir.glob(trigger)))):
            started.update((p.pid, p) for p in descendants(process))
            assert process.poll() is None or seen.is_set(), f"{where}: ended first\n" + "".join(
                lines
            )
            assert time.monotonic() < deadline, f"{where}: no {trigger!r}\n" + "".join(lines)
        time.sleep(delay)
        for pause, name in PATTERNS[pattern]:
            time.sleep(pause)
            started.update((p.pid, p) for p in descendants(process))
            if process.poll() is None:
                os.killpg(process.pid, getattr(signal, name))
        process.wait(timeout=60)
        reader.join(timeout=10)
    output = "".join(lines)
    shown = f"{where} (rc {process.returncode}):\n{output[-4000:]}"
    assert "Traceback" not in output, shown
    assert 'File "' not in output, shown  # no frames either
    _, alive = psutil.wait_procs(list(started.values()), timeout=10)
    assert not alive, f"{where}: left {alive}\n{shown}"
    locks = workdir / ".snakemake/locks"
    assert not (locks.is_dir() and any(locks.iterdir())), f"{where}: a lock stayed\n{shown}"
    half = {p.name for p in (workdir / "mid").glob("*.txt") if p.read_text() != WHOLE}
    assert not half, f"{where}: half-written {half}\n{shown}"
    _catalog_closed(workdir / ".snakemake/context/catalog.db", where, shown)

    (workdir / "slow").unlink()
    rerun = snakemake(workdir, *args, timeout=180)
    assert rerun.returncode == 0, f"{where}: the plain rerun failed\n{rerun.output[-3000:]}"
    written = {p.name: p.read_text() for p in (workdir / "mid").glob("*.txt")}
    assert written == {f"{i}.txt": WHOLE for i in range(JOBS)}, where


def _catalog_closed(catalog: Path, where: str, shown: str) -> None:
    """Every run the catalog has is ended, ok or interrupted (no job here fails), and
    every attempt has its outcome."""
    if not catalog.exists():
        return  # stopped before the run's catalog was made
    with closing(sqlite3.connect(catalog)) as db:
        tables = db.execute("select name from sqlite_master where name = 'runs'").fetchall()
        if not tables:
            return  # stopped while it was made: the rerun makes it
        open_runs = db.execute("select run_id from runs where finished is null").fetchall()
        assert not open_runs, f"{where}: a run not ended {open_runs}\n{shown}"
        unended = db.execute("select key from attempts where outcome is null").fetchall()
        assert not unended, f"{where}: attempts without an outcome {unended}\n{shown}"
        stopped = db.execute("select count(*) from runs where not ok").fetchone()
        noted = db.execute("select count(*) from events where kind = 'run-interrupted'")
        assert noted.fetchone() == stopped, f"{where}: not recorded interrupted\n{shown}"
