"""Groups of context jobs (``--groups``, ``--group-components``): one dispatch on one
server for the whole group, its members in-process against the loaded context, each
recorded as a job of its own; a group lost with its server reruns whole. (Snakemake's
own group workflows run in-process in :mod:`tests.e2e.test_snakemake_suite`.)"""

from __future__ import annotations

import json
import re
import shutil
import signal
import sqlite3
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import WORKFLOWS, context_run, toy_files
from tests.e2e.test_preemption import _background_run, _signal_busy_server

pytestmark = pytest.mark.slow


@pytest.fixture
def preempt(tmp_path: Path) -> Path:
    target = tmp_path / "preempt"
    shutil.copytree(WORKFLOWS / "preempt", target)
    return target


def _rows(workdir: Path, query: str) -> list[tuple]:
    with sqlite3.connect(workdir / ".snakemake/context/catalog.db") as db:
        return db.execute(query).fetchall()


def _grouped(size: int) -> tuple[str, ...]:
    return ("--groups", "work=shard", "--group-components", f"shard={size}")


def test_a_group_of_fifty_context_jobs_loads_once_per_server(preempt):
    """100 jobs of ``gpu=1`` in groups of 50 on 2 servers of one GPU each: each group
    needs one server's GPU (not 50), runs as one dispatch, and every member is a job
    of its own in the catalog, with its own log."""
    run = context_run(
        preempt,
        "--context-servers",
        "2",
        *_grouped(50),
        "--config",
        "count=100",
        "sleep=0",
    ).check()
    assert sorted(int(p.stem) for p in (preempt / "out").glob("*.txt")) == list(range(100))
    groups = _rows(
        preempt,
        "SELECT a.outcome FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE j.kind = 'group'",
    )
    assert groups == [("ok",), ("ok",)], groups
    members = _rows(
        preempt,
        "SELECT a.outcome, a.placed_by, a.log, s.name FROM attempts a "
        "JOIN jobs j ON j.id = a.job_id JOIN servers s ON s.id = a.server_id "
        "WHERE j.kind = 'context' AND j.rule = 'work'",
    )
    assert len(members) == 100 and {(o, p) for o, p, _, _ in members} == {("ok", "group")}
    assert all((preempt / log).is_file() for _, _, log, _ in members)
    loads = _rows(preempt, "SELECT server_id, count(*) FROM placements GROUP BY server_id")
    assert loads and all(count == 1 for _, count in loads), loads
    assert "runs as one subprocess" not in run.output
    summary = run.summaries()[-1]
    assert len([job for job in summary["jobs"] if job["placed_by"] == "group"]) == 100


def test_a_server_killed_during_a_group_reruns_the_group_and_counts_each_member_once(preempt):
    """SIGKILL the server while the third of a group's 6 members runs: the group
    reruns whole on the other server, the rerun writes each member's output once,
    and the catalog holds one ok attempt per member (the lost attempt's finished
    members are never recorded: only a group's result records them)."""
    proc = _background_run(
        preempt, "--context-servers", "2", *_grouped(6), "--config", "count=6", "sleep=1"
    )
    _signal_busy_server(preempt, signal.SIGKILL, nth=3)
    killed = time.time()
    output, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, output
    writes = [line.split() for line in (preempt / "work-writes.txt").read_text().splitlines()]
    assert len([at for _, at in writes if float(at) < killed]) == 2, writes
    assert sorted(int(i) for i, at in writes if float(at) > killed) == list(range(6)), writes
    assert sorted(int(p.stem) for p in (preempt / "out").glob("*.txt")) == list(range(6))
    groups = _rows(
        preempt,
        "SELECT a.outcome FROM attempts a JOIN jobs j ON j.id = a.job_id "
        "WHERE j.kind = 'group' ORDER BY a.id",
    )
    assert groups == [("lost",), ("ok",)], groups
    members = _rows(
        preempt,
        "SELECT j.jobid, a.outcome FROM attempts a JOIN jobs j ON j.id = a.job_id "
        "WHERE j.kind = 'context'",
    )
    assert len(members) == 6 and {o for _, o in members} == {"ok"}, members


KEEP_GOING = textwrap.dedent("""
    rule all:
        input: "ok/b.txt", "flaky/b.txt", "bad/b.txt"

    rule a:
        output: "{g}/a.txt"
        group: "{g}"
        resources: context="toy"
        script: "scripts/a.py"

    rule b:
        input: "{g}/a.txt"
        output: "{g}/b.txt"
        group: "{g}"
        resources: context="toy"
        script: "scripts/b.py"
""")
# Each member notes its run; b fails in group "bad" always, in "flaky" at its first run.
MEMBER_SCRIPT = textwrap.dedent("""
    from snakemake_executor_context import load_context

    group, rule = snakemake.wildcards.g, snakemake.rule
    with open(f"{group}-runs.txt", "a") as f:
        f.write(rule + "\\n")
    with open(f"{group}-runs.txt") as f:
        runs = f.read().split().count(rule)
    if rule == "b" and (group == "bad" or (group == "flaky" and runs == 1)):
        raise SystemExit(f"b of {group} fails at its run {runs}")
    with open(snakemake.output[0], "w") as f:
        f.write(str(load_context(snakemake)["value"]))
""")


def test_keep_going_and_retries_rerun_and_fail_a_group_whole(make_workflow):
    """Three groups of two context jobs, with --keep-going --retries 1, as Snakemake
    treats a group under any remote executor (the local one runs no groups): the
    group whose second member fails once runs whole again and is made; the one whose
    second member always fails runs twice and fails, its first member's output
    removed; the third is made, and the run exits non-zero."""
    workdir = make_workflow(
        toy_files(KEEP_GOING, {"scripts/a.py": MEMBER_SCRIPT, "scripts/b.py": MEMBER_SCRIPT})
    )
    run = context_run(workdir, "--context-servers", "1", "--keep-going", "--retries", "1")
    assert run.returncode != 0, run.output
    made = sorted(str(p.relative_to(workdir)) for p in workdir.glob("*/*.txt"))
    assert made == ["flaky/a.txt", "flaky/b.txt", "ok/a.txt", "ok/b.txt"], run.output
    assert (workdir / "flaky-runs.txt").read_text().split() == ["a", "b", "a", "b"]
    assert (workdir / "bad-runs.txt").read_text().split() == ["a", "b", "a", "b"]
    assert (workdir / "ok-runs.txt").read_text().split() == ["a", "b"]


HUNG_GROUP = textwrap.dedent("""
    rule all:
        input: expand("{g}/{i}.txt", g=["ok", "hung"], i=range(3))

    rule a:
        output: "{g}/{i}.txt"
        group: "{g}"
        resources: context="toy", runtime=1
        script: "scripts/a.py"
""")
# Each member notes its run; in group "hung" the second to run sleeps in C, where no
# cancellation lands: its server restarts.
HANGING_MEMBER = textwrap.dedent("""
    import time

    from snakemake_executor_context import load_context

    group, i = snakemake.wildcards.g, snakemake.wildcards.i
    with open(f"{group}-runs.txt", "a") as f:
        f.write(i + "\\n")
    with open(f"{group}-runs.txt") as f:
        if group == "hung" and len(f.read().split()) == 2:
            time.sleep(300)
    with open(snakemake.output[0], "w") as f:
        f.write(str(load_context(snakemake)["value"]))
""")


def test_a_hung_member_is_stopped_at_its_own_runtime_and_every_member_is_recorded(
    make_workflow,
):
    """Two groups of three jobs of ``runtime=1``, the second member of one hanging: it
    is stopped by its own rule's minute (not the group's three), the failure names it
    in its group, each of the six members has its row (the hung one failed, the one
    after it not run), and the run counts the six jobs Snakemake planned, not the
    groups beside them."""
    workdir = make_workflow(toy_files(HUNG_GROUP, {"scripts/a.py": HANGING_MEMBER}))
    run = context_run(
        workdir,
        "--context-servers",
        "1",
        "--keep-going",
        "--group-components",
        "{g}=3",  # the group as the rule names it, before its wildcards
        env={"SNAKEMAKE_CONTEXT_TIME_SCALE": "0.02"},
        timeout=200,
    )
    assert run.returncode != 0, run.output
    first, hung = (workdir / "hung-runs.txt").read_text().split()
    (unrun,) = {"0", "1", "2"} - {first, hung}
    assert re.search(
        rf"Rule 'a' \(g=hung, i={hung}\) in group 'hung': stopped by its runtime limit of "
        r"1 min \(the `runtime` resource of rule 'a'",
        run.output,
    ), run.output
    assert "rule 'group" not in run.output
    members = _rows(
        workdir,
        "SELECT j.wildcards, j.outcome, j.message, a.outcome FROM jobs j "
        "JOIN attempts a ON a.job_id = j.id WHERE j.kind = 'context'",
    )
    by = {(json.loads(w)["g"], json.loads(w)["i"]): rest for w, *rest in members}
    assert len(members) == 6 and set(by) == {(g, i) for g in ("ok", "hung") for i in "012"}
    assert {by["ok", i][0] for i in "012"} == {"ok"}, members
    assert by["hung", first][0::2] == ["failed", "ok"], members
    outcome, message, attempt = by["hung", hung]
    assert (outcome, attempt) == ("failed", "failed") and "runtime limit of 1 min" in message
    outcome, message, attempt = by["hung", unrun]
    assert (outcome, attempt) == ("failed", "cancelled"), members
    assert f"Rule 'a' (g=hung, i={unrun}) in group 'hung': not run" in message
    (counts,) = _rows(workdir, "SELECT jobs_total, jobs_ok, jobs_failed FROM runs")
    assert counts == (6, 3, 3), counts


COUNTED = textwrap.dedent("""
    rule all:
        input: expand("loud/{i}.txt", i=range(3)), expand("bad/{i}.txt", i=range(2))

    rule shout:
        output: "loud/{i}.txt"
        group: "loud"
        shell: "echo {wildcards.i} > {output}"

    rule bad:
        output: "bad/{i}.txt"
        group: "bad"
        resources: context="toy"
        script: "scripts/bad.py"
""")


def test_a_runs_counts_are_the_jobs_snakemake_planned_a_groups_each(make_workflow):
    """A group of three plain jobs (Snakemake's one subprocess) is three jobs ok, and
    a group of two context jobs whose first fails is two failed: the run's counts are
    the jobs Snakemake planned, never a group's besides its jobs'."""
    workdir = make_workflow(toy_files(COUNTED, {"scripts/bad.py": "raise RuntimeError('bad')"}))
    run = context_run(
        workdir,
        "--context-servers",
        "1",
        "--keep-going",
        "--group-components",
        "loud=3",
        "bad=2",
        timeout=120,
    )
    assert run.returncode != 0, run.output
    assert sorted(p.name for p in (workdir / "loud").glob("*.txt")) == ["0.txt", "1.txt", "2.txt"]
    (counts,) = _rows(workdir, "SELECT jobs_total, jobs_ok, jobs_failed FROM runs")
    assert counts == (5, 3, 2), counts
