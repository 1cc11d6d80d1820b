"""A loss charged to what caused it: a job lost with each of several servers, none by
the cluster's word, is charged to its crash budget; a server that lost its scheduler
comes back; every attempt of a finished run has an outcome. Pure functions, the
dispatch machine, the catalog's recorder, and real runs of the snakemake CLI."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from snakemake_executor_context.dispatch import vocabulary as v
from snakemake_executor_context.fleet.losses import (
    Budgets,
    LossHistory,
    LossKind,
    charged,
    classify,
)
from tests.catalog_builder import CatalogBuilder
from tests.conftest import TOY_LOADER, context_run, toy_files
from tests.dispatch.test_dispatch import join, leave, machine, of, ticket

NOTHING_KNOWN = classify()
HEARTBEAT = classify(heartbeat=True)
INJECTED = classify(exit_code=-9, injected=9)
SIGTERM = classify(exit_code=-15)
DRAINED = classify(drained="SIGTERM")
EXIT_3 = classify(exit_code=3)


def test_what_the_cluster_said_is_a_preemption_however_often_it_hits_a_job():
    for said in (INJECTED, SIGTERM, DRAINED):
        assert said.said and said.kind == LossKind.PREEMPTION
        assert [c.kind for c in charged([said] * 4)] == [LossKind.PREEMPTION] * 4
    assert not NOTHING_KNOWN.said and not HEARTBEAT.said and not EXIT_3.said


def test_a_loss_no_job_explains_is_a_preemption_once_and_the_jobs_crash_when_repeated():
    assert charged([NOTHING_KNOWN]) == [NOTHING_KNOWN], "one loss: nothing explains it"
    first, second = charged([NOTHING_KNOWN, HEARTBEAT])
    assert first.kind == second.kind == LossKind.CRASH
    assert first.why.startswith("lost (connection closed, no exit code known); lost with each")
    assert "of the 2 servers that ran it" in second.why
    # what the cluster said in between stays a preemption, and is not counted
    kinds = [c.kind for c in charged([NOTHING_KNOWN, INJECTED, SIGTERM])]
    assert kinds == [LossKind.PREEMPTION] * 3
    kinds = [c.kind for c in charged([EXIT_3, INJECTED, NOTHING_KNOWN])]
    assert kinds == [LossKind.CRASH, LossKind.PREEMPTION, LossKind.CRASH]
    assert charged([classify(expected=True), NOTHING_KNOWN])[1].kind == LossKind.PREEMPTION


def test_the_second_unexplained_loss_exhausts_a_crash_budget_of_one_naming_the_job():
    history, budgets = LossHistory(), Budgets(preemptions=10, crashes=1)
    title = "Rule 'close' (i=0)"
    assert history.charge(NOTHING_KNOWN, "cpu1", "a.log", budgets, title) is None
    assert history.describe_charge(NOTHING_KNOWN, budgets) == (
        "charged to the preemption budget (1 of 10)"
    )
    failed = history.charge(NOTHING_KNOWN, "cpu0", "a.2.log", budgets, title)
    assert failed is not None and failed.startswith(f"{title}: its server crashed or was lost")
    assert "2 time(s), more than the crash budget of 1 (--context-crash-budget)" in failed
    assert "cpu1 (no exit code known); cpu0 (no exit code known)" in failed
    assert "a.log, a.2.log" in failed and "os.closerange" in failed
    assert history.describe_charge(NOTHING_KNOWN, budgets) == (
        "charged to the crash budget (2 of 1)"
    )
    assert history.count(LossKind.PREEMPTION) == 0


def _lose_twice(dispatch, facts):
    """A job placed, its server lost, placed again (after the lease if nobody saw the
    server die), lost again: the second loss's commands."""
    (submit,) = of(dispatch.handle(v.JobReady(ticket(1), 0.0)), v.Submit)
    out = leave(dispatch, submit.address, at=1.0, **facts)
    assert not of(out, v.ReportError)
    (submit,) = of(join(dispatch, "tcp://back", at=2.0) + dispatch.handle(v.Tick(60.0)), v.Submit)
    return leave(dispatch, submit.address, at=61.0, **facts)


def test_the_dispatch_charges_a_job_lost_with_each_of_two_servers_to_its_crash_budget():
    dispatch = machine(servers=1, budgets=Budgets(preemptions=10, crashes=1))
    (error,) = of(_lose_twice(dispatch, {}), v.ReportError)
    assert "crash budget of 1 (--context-crash-budget)" in error.message
    assert error.message.startswith("Rule 'score' (i=1): its server crashed or was lost")
    # the same two kills, injected: preemptions, and the job runs again
    dispatch = machine(servers=1, budgets=Budgets(preemptions=10, crashes=1))
    out = _lose_twice(dispatch, {"exit_code": -9, "injected": 9})
    assert not of(out, v.ReportError) and dispatch.queued == 1


def test_servers_lost_under_different_jobs_are_preemptions_of_each():
    dispatch = machine(servers=2, budgets=Budgets(preemptions=10, crashes=0))
    (first,) = of(dispatch.handle(v.JobReady(ticket(1, identity=None), 0.0)), v.Submit)
    (second,) = of(dispatch.handle(v.JobReady(ticket(2, identity=None), 0.1)), v.Submit)
    for submit, at in ((first, 1.0), (second, 2.0)):
        out = leave(dispatch, submit.address, at=at)
        assert not of(out, v.ReportError), "one loss under each job: nothing explains it"


def test_an_embedded_run_whose_lost_servers_do_not_come_back_says_so():
    dispatch = machine(servers=1, embedded=True, wait=30.0, planned=1)
    (submit,) = of(dispatch.handle(v.JobReady(ticket(1), 0.0)), v.Submit)
    assert not of(leave(dispatch, submit.address, at=1.0, exit_code=-9, injected=9), v.ReportError)
    assert not of(dispatch.handle(v.Tick(20.0)), v.ReportError), "it may come back yet"
    (error,) = of(dispatch.handle(v.Tick(32.0)), v.ReportError)
    assert error.message.startswith("No context server can run rule 'score' after waiting 31 s")
    assert "0 of 1 planned servers are running, the lost ones did not come back" in error.message
    assert "change the rule's resources" not in error.message


def test_an_attempt_no_word_ended_ends_cancelled_with_its_run(tmp_path):
    with CatalogBuilder(tmp_path / "catalog.db") as catalog:
        server = catalog.server("cpu0", gpu=None)
        run_id = catalog.run()
        done = catalog.start_job(run_id, "score", server=server)
        catalog.start_job(run_id, "score", server=server)  # moved off, never told
        catalog.finish_job(done)
        catalog.finish_run(run_id, ok=False)
        catalog.commit()
    outcomes = _catalog(tmp_path / "catalog.db", "select outcome from attempts order by id")
    assert outcomes == [("ok",), ("cancelled",)]


# -- real runs -------------------------------------------------------------------------


def _catalog(path: Path, query: str) -> list[tuple]:
    with sqlite3.connect(path) as db:
        return db.execute(query).fetchall()


CLOSERANGE = """
import os

from snakemake_executor_context import load_context

load_context(snakemake)
print("closing every descriptor", flush=True)
os.closerange(3, 65536)  # as a daemonising helper does
open(snakemake.output[0], "w").write("never\\n")
"""


@pytest.mark.slow
def test_a_job_that_closes_every_descriptor_fails_on_its_crash_budget(toy_workflow):
    """Each attempt takes its server down with no exit code known in time: the second
    is the job's, and with --context-crash-budget 1 the run ends naming it (before:
    10 preemptions, 6-7 minutes)."""
    workdir = toy_workflow(
        """
                rule close:
                    output: "closed.txt"
                    resources: context="toy"
                    script: "scripts/close.py"
            """,
        {
            "scripts/close.py": CLOSERANGE,
        },
    )
    began = time.monotonic()
    run = context_run(workdir, "--context-servers", "1", "--context-crash-budget", "1", timeout=110)
    took = time.monotonic() - began
    assert run.returncode != 0
    (line,) = [line for line in run.output.splitlines() if "crash budget of" in line]
    assert "Rule 'close': its server crashed or was lost" in line, line
    assert "2 time(s), more than the crash budget of 1 (--context-crash-budget)" in line, line
    assert "preemption budget" not in run.output
    assert took < 100, took


CUT_ONCE = """
import os
import time

from distributed import get_worker

from snakemake_executor_context import load_context

obj = load_context(snakemake)
if not os.path.exists("cut-once"):
    open("cut-once", "w").close()
    get_worker().batched_stream.comm.abort()  # the scheduler's connection, gone for good
    time.sleep(2)
with open(snakemake.output[0], "w") as f:
    f.write(str(obj["value"]))
"""


@pytest.mark.slow
def test_the_embedded_cluster_brings_back_a_server_that_lost_its_scheduler(toy_workflow):
    """Dask's server closes itself, and its nanny with it, when its scheduler's
    connection closes: the run's only server was gone, the run waited 120 s and
    failed saying "change the rule's resources". Its nanny starts it again now."""
    workdir = toy_workflow(
        """
                rule all:
                    input: "after.txt"

                rule cut:
                    output: "cut.txt"
                    resources: context="toy"
                    script: "scripts/cut.py"

                rule after:
                    input: "cut.txt"
                    output: "after.txt"
                    resources: context="toy"
                    script: "scripts/cut.py"
            """,
        {
            "scripts/cut.py": CUT_ONCE,
        },
    )
    run = context_run(
        workdir, "--context-servers", "1", "--context-tuning", "wait_for_server=20", timeout=110
    )
    run.check()
    assert "Server cpu0 lost" in run.output
    assert (workdir / "after.txt").read_text() == "5"
    log = next((workdir / ".snakemake/context/cluster").glob("*.log")).read_text()
    assert "lost its scheduler (worker-handle-scheduler-connection-broken)" in log


HANGING_LOADER = (
    TOY_LOADER
    + """
import time

def hang():
    time.sleep(300)  # in C: the job's thread cannot be stopped
"""
)


@pytest.mark.slow
def test_a_loader_hung_past_its_runtime_leaves_no_attempt_without_an_outcome(make_workflow):
    """The hung load makes its server restart; the job sent behind it to that server
    ends cancelled and runs on the restarted one (before: its outcome stayed NULL)."""
    workdir = make_workflow(
        toy_files(
            """
                declare_context(config, "stuck", "loader.py:hang")

                localrules: later

                rule all:
                    input: "hung.txt", "ok.txt"

                rule hung:
                    output: "hung.txt"
                    resources: context="stuck", runtime=1
                    script: "scripts/use.py"

                # ok is handed over a second after hung, to the one server hung holds.
                rule later:
                    output: "later.txt"
                    shell: "sleep 1; touch {output}"

                rule ok:
                    input: "later.txt"
                    output: "ok.txt"
                    resources: context="toy"
                    script: "scripts/use.py"
            """,
            {"loader.py": HANGING_LOADER},
        )
    )
    fast_clock = {"SNAKEMAKE_CONTEXT_TIME_SCALE": "0.02"}  # a minute of runtime: 1.2 s
    run = context_run(workdir, "--context-servers", "1", "--jobs", "2", env=fast_clock, timeout=110)
    assert run.returncode != 0
    assert "stopped by its runtime limit of 1 min" in run.output, run.output
    assert (workdir / "ok.txt").read_text() == "5"
    attempts = _catalog(
        workdir / ".snakemake/context/catalog.db", "select key, outcome from attempts order by id"
    )
    assert all(outcome for _, outcome in attempts), attempts
    outcomes = sorted((key.split("-")[0], outcome) for key, outcome in attempts)
    assert outcomes == [("hung", "failed"), ("ok", "cancelled"), ("ok", "ok")], attempts
