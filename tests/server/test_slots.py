"""Slots: a server runs several jobs of one context at once against one loaded copy.

The gate's policy is tested as a pure function; the rest with the real `snakemake`
command line on real clusters: jobs that wait on a file barrier until N of them have
started prove they overlap (a run without overlap would time out at the barrier and
say so in the job's output, failing the test, never hanging it).
"""

from __future__ import annotations

import json
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import pytest

from snakemake_executor_context.server.slots.gate import Entry, SlotGate, fitting_slots, may_start
from tests.conftest import BIN, context_run, persistent_cluster

GROUP_A = ("workdir-a",)
GROUP_B = ("workdir-b",)


# --------------------------------------------------------------------------------------
# The policy, without processes.


def test_jobs_of_one_group_share_and_another_group_waits_for_it_to_drain():
    a1, a2 = Entry("a1", GROUP_A, "ctx"), Entry("a2", GROUP_A, "ctx")
    b1 = Entry("b1", GROUP_B, "ctx")
    assert may_start(a2, [a1], [], {})
    assert not may_start(b1, [a1], [], {})
    # b1 waits ahead of a2: a2 does not overtake it (no starvation of group b).
    assert not may_start(a2, [a1], [b1], {})
    assert may_start(b1, [], [], {})


def test_a_plain_job_never_waits_and_an_exclusive_one_runs_alone():
    plain = Entry("p", None, None)
    solo = Entry("s", GROUP_A, "solo", exclusive=True)
    a1 = Entry("a1", GROUP_A, "ctx")
    assert may_start(plain, [a1, solo], [], {})
    assert not may_start(solo, [a1], [], {})
    assert may_start(solo, [plain], [], {})
    assert not may_start(a1, [solo], [], {})


def test_a_context_limit_caps_its_jobs_not_others():
    running = [Entry("a1", GROUP_A, "ctx"), Entry("a2", GROUP_A, "ctx")]
    assert not may_start(Entry("a3", GROUP_A, "ctx"), running, [], {"ctx": 2})
    assert may_start(Entry("a3", GROUP_A, "other"), running, [], {"ctx": 2})
    assert may_start(Entry("a3", GROUP_A, "ctx"), running, [], {"ctx": 3})


def test_slots_that_fit_in_memory():
    gb = 1_000_000_000
    assert fitting_slots(4, capacity=12 * gb, loaded=1 * gb, per_job=2 * gb) == 4
    assert fitting_slots(4, capacity=6 * gb, loaded=1 * gb, per_job=2 * gb) == 2
    assert fitting_slots(4, capacity=2 * gb, loaded=1 * gb, per_job=2 * gb) == 1
    assert fitting_slots(4, capacity=2 * gb, loaded=1 * gb, per_job=0) == 4


def test_the_gate_blocks_a_second_group_until_the_first_leaves():
    gate = SlotGate(4)
    gate.enter(Entry("a1", GROUP_A, "ctx"))
    entered = threading.Event()

    def other() -> None:
        gate.enter(Entry("b1", GROUP_B, "ctx"))
        entered.set()

    thread = threading.Thread(target=other)
    thread.start()
    assert not entered.wait(0.5)
    assert gate.snapshot()["waiting"] == ["b1"]
    assert gate.leave("a1") is False  # nothing ran beside it
    assert entered.wait(5)
    thread.join(5)
    gate.enter(Entry("b2", GROUP_B, "ctx"))
    assert gate.leave("b2") is True and gate.leave("b1") is True


# --------------------------------------------------------------------------------------
# Real runs.

LOADER = """
import os
from snakemake_executor_context import declare_job_memory, loader

def load(declared=True, job_bytes=10_000_000):
    with open("loads.log", "a") as log:
        log.write(f"{os.getpid()}\\n")
    if declared:
        declare_job_memory(job_bytes)
    return {"pid": os.getpid()}

@loader(shareable=False)
def load_solo():
    return {"pid": os.getpid()}
"""

WORK = """
import json, os, sys, threading, time
from snakemake_executor_context import load_context

ctx = load_context(snakemake)
started = time.time()
me = snakemake.wildcards.i
print(f"print-of-job-{me}")
sys.stderr.write(f"stderr-of-job-{me}\\n")
barrier = int(snakemake.params.barrier)
reached = True
if barrier:
    os.makedirs("barrier", exist_ok=True)
    open(f"barrier/{snakemake.rule}-{me}", "w").close()
    deadline = time.time() + 30
    while len([n for n in os.listdir("barrier") if n.startswith(snakemake.rule)]) < barrier:
        if time.time() > deadline:
            reached = False
            break
        time.sleep(0.05)
time.sleep(float(snakemake.params.hold))
with open(snakemake.output[0], "w") as out:
    json.dump({"start": started, "end": time.time(), "pid": os.getpid(),
               "reached": reached, "context_pid": ctx["pid"], "cwd": os.getcwd()}, out)
"""


def _snakefile(rules: str, *, declared: bool = True) -> str:
    return textwrap.dedent(f"""
        from snakemake_executor_context import declare_context

        declare_context(
            config, "toy", "loader.py:load", declared={declared},
            job_bytes=int(config.get("job_bytes", 10_000_000)),
        )
        declare_context(config, "solo", "loader.py:load_solo")
        declare_context(config, "solo-declared", "loader.py:load", shareable=False, declared=True)
        N = int(config.get("count", 4))
        """) + textwrap.dedent(rules)


FOUR = """
rule all:
    input: expand("out/{i}.json", i=range(N))

rule work:
    output: "out/{i}.json"
    params: barrier=config.get("barrier", 0), hold=config.get("hold", 0.3)
    threads: 1
    resources: context=config.get("context", "toy"), gpu=1
    script: "scripts/work.py"
"""


def _workflow(make_workflow, rules: str = FOUR, *, declared: bool = True, name=None) -> Path:
    return make_workflow(
        {
            "Snakefile": _snakefile(rules, declared=declared),
            "loader.py": LOADER,
            "scripts/work.py": WORK,
        },
        name=name,
    )


def _records(workdir: Path, pattern: str = "out/*.json") -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(workdir.glob(pattern))}


def _overlap(a: dict, b: dict) -> bool:
    return a["start"] < b["end"] and b["start"] < a["end"]


ONE_SERVER_FOUR_SLOTS = ("--context-servers", "1", "--context-slots", "4")


@pytest.mark.slow
def test_four_jobs_of_one_context_overlap_on_one_server_with_one_load(make_workflow):
    workdir = _workflow(make_workflow)
    context_run(workdir, *ONE_SERVER_FOUR_SLOTS, "--config", "barrier=4").check()
    records = _records(workdir)
    assert len(records) == 4
    assert all(r["reached"] for r in records.values()), records
    assert len({r["pid"] for r in records.values()}) == 1
    assert (workdir / "loads.log").read_text().count("\n") == 1
    logs = sorted((workdir / ".snakemake" / "context" / "logs" / "work").glob("*.log"))
    assert len(logs) == 4
    beside = 0
    for log in logs:
        text = log.read_text()
        (own,) = [i for i in range(4) if f"print-of-job-{i}" in text]
        assert f"stderr-of-job-{own}" in text
        assert not any(f"-of-job-{j}" in text for j in range(4) if j != own), text
        # Each log says where fd-level output went while others ran beside it.
        beside += "run beside this one" in text
        assert "run beside this one" in text or "started beside this job" in text, text
    assert beside >= 3
    # The catalog records the server's slots (the monitor shows busy/free from it).
    from sqlalchemy import select

    from snakemake_executor_context.catalog.models import Server
    from snakemake_executor_context.catalog.store import open_reader

    reader = open_reader(workdir / ".snakemake" / "context" / "catalog.db")
    try:
        with reader.session() as session:
            assert set(session.scalars(select(Server.slots))) == {4}
    finally:
        reader.close()


@pytest.mark.slow
def test_without_declared_memory_a_context_runs_alone_until_measured(make_workflow):
    workdir = _workflow(make_workflow, declared=False)
    run = context_run(
        workdir, *ONE_SERVER_FOUR_SLOTS, "--config", "count=5", "hold=1.0", "barrier=0"
    ).check()
    records = sorted(_records(workdir).values(), key=lambda r: r["start"])
    first, rest = records[0], records[1:]
    # The first job ran alone (its working memory was measured), the others together.
    assert not any(_overlap(first, other) for other in rest)
    assert any(_overlap(a, b) for a in rest for b in rest if a is not b), records
    assert "runs up to 4 jobs of context 'toy' at once" in run.output, run.output
    assert "per job (measured)" in run.output


def _most_at_once(records: list[dict]) -> int:
    moments = sorted([(r["start"], 1) for r in records] + [(r["end"], -1) for r in records])
    level = most = 0
    for _, step in moments:
        level += step
        most = max(most, level)
    return most


@pytest.mark.slow
def test_a_slot_count_memory_cannot_hold_is_refused_naming_both_numbers(make_workflow):
    import psutil

    # Each job declares 40% of the server's memory: 2 fit, not the 4 slots.
    third = psutil.virtual_memory().total * 2 // 5
    workdir = _workflow(make_workflow)
    run = context_run(
        workdir, *ONE_SERVER_FOUR_SLOTS, "--config", f"job_bytes={third}", "hold=1.0"
    ).check()
    assert "refuses 4 slots for context 'toy'" in run.output, run.output
    assert "per job (declared)" in run.output and "it runs 2 of its jobs at once" in run.output
    assert _most_at_once(list(_records(workdir).values())) == 2


@pytest.mark.slow
@pytest.mark.parametrize("context", ["solo", "solo-declared"])
def test_an_unshareable_context_gets_a_whole_server(make_workflow, context):
    workdir = _workflow(make_workflow)
    context_run(
        workdir, *ONE_SERVER_FOUR_SLOTS, "--config", f"context={context}", "hold=0.5"
    ).check()
    records = sorted(_records(workdir).values(), key=lambda r: r["start"])
    assert len(records) == 4
    overlapping = [(a, b) for a in records for b in records if a is not b and _overlap(a, b)]
    assert not overlapping, records


TWO_GROUPS = """
rule all:
    input: expand("out/{i}.json", i=range(N)), expand("two/{i}.json", i=range(N))

rule work:
    output: "out/{i}.json"
    params: barrier=0, hold=0.6
    threads: 1
    resources: context="toy", gpu=1
    script: "scripts/work.py"

rule wide:
    output: "two/{i}.json"
    params: barrier=0, hold=0.6
    threads: 2
    resources: context="toy", gpu=1
    script: "scripts/work.py"
"""


@pytest.mark.slow
def test_jobs_with_different_threads_never_share_a_server_at_once(make_workflow):
    workdir = _workflow(make_workflow, TWO_GROUPS)
    context_run(workdir, *ONE_SERVER_FOUR_SLOTS, "--cores", "8").check()
    ones = list(_records(workdir).values())
    twos = list(_records(workdir, "two/*.json").values())
    assert len(ones) == 4 and len(twos) == 4
    assert not [(a, b) for a in ones for b in twos if _overlap(a, b)]
    assert any(_overlap(a, b) for a in ones for b in ones if a is not b)


@pytest.fixture
def four_slot_cluster(tmp_path: Path):
    with persistent_cluster(tmp_path / "cluster", "--servers", "1", "--slots", "4") as path:
        yield path


@pytest.mark.slow
def test_two_workflow_directories_never_share_a_server_at_once(make_workflow, four_slot_cluster):
    first = _workflow(make_workflow, name="first")
    second = _workflow(make_workflow, name="second")
    attach = ("--context-scheduler-file", str(four_slot_cluster), "--config", "hold=0.8")
    runs: dict[str, object] = {}

    def run(workdir: Path) -> None:
        runs[workdir.name] = context_run(workdir, *attach)

    threads = [threading.Thread(target=run, args=(w,)) for w in (first, second)]
    threads[0].start()
    # The second starts once the first's first job is done: a run places one job of a
    # context until one is measured, and then the rest in the server's slots at once.
    # (Started 0.5 s after, under CI's load the two runs' jobs alternated one by one,
    # and the first's never overlapped.)
    deadline = time.monotonic() + 120
    while not list(first.glob("out/*.json")) and time.monotonic() < deadline:
        time.sleep(0.02)
    threads[1].start()
    for thread in threads:
        thread.join(300)
    for result in runs.values():
        result.check()  # type: ignore[attr-defined]
    a, b = list(_records(first).values()), list(_records(second).values())
    assert {r["cwd"] for r in a} == {str(first)} and {r["cwd"] for r in b} == {str(second)}
    assert len({r["pid"] for r in a + b}) == 1  # one server ran them all
    assert not [(x, y) for x in a for y in b if _overlap(x, y)]
    assert any(_overlap(x, y) for x in a for y in a if x is not y)
    status = subprocess.run(
        [str(BIN / "snakemake-context"), "status", "--scheduler-file", str(four_slot_cluster)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "CPU: 1 server(s) x 4 slot(s): 0 busy, 4 free" in status.stdout, status.stdout
    assert "0/4 slot(s) busy" in status.stdout
    assert "up to 4 job(s) at once" in status.stdout  # toy declares its job memory


def test_placement_gives_an_unshareable_context_an_idle_server():
    from snakemake_executor_context.fleet.placement import choose_server
    from snakemake_executor_context.fleet.state import ContextState, FleetState

    fleet = FleetState()
    for address in ("tcp://a", "tcp://b"):
        fleet.add_server(address, name=address[-1], resources={"gpu": 1}, slots=4)
        fleet.set_context(address, "solo", ContextState.READY, 1.0)
    fleet.note_context("solo", shareable=False)
    fleet.dispatched("job-1", "tcp://a", "solo", 2.0)
    assert fleet.servers["tcp://a"].busy == 4  # one job holds every slot
    second = choose_server(fleet, {"gpu": 1}, "solo", now=3.0, prefetch=0)
    assert second.address == "tcp://b"
    fleet.dispatched("job-2", "tcp://b", "solo", 3.0)
    assert choose_server(fleet, {"gpu": 1}, "solo", now=3.0, prefetch=0).address is None
    # A shareable context's jobs fill the slots of one server.
    fleet.release("job-1")
    fleet.release("job-2")
    fleet.dispatched("job-3", "tcp://a", "toy", 4.0)
    fleet.set_context("tcp://a", "toy", ContextState.READY, 4.0)
    fleet.measure.add_job("toy", "cpu", 1.0)  # measured: its jobs may share the server
    assert fleet.servers["tcp://a"].busy == 1
    assert choose_server(fleet, {"gpu": 1}, "toy", now=5.0).address == "tcp://a"


def test_no_more_jobs_than_slots_run_at_once():
    a = [Entry(f"a{i}", GROUP_A, "ctx") for i in range(3)]
    assert may_start(a[2], a[:2], [], {}, slots=3)
    assert not may_start(a[2], a[:2], [], {}, slots=2)
    assert not may_start(Entry("p", None, None), a[:2], [], {}, slots=2)


@pytest.mark.slow
def test_a_server_killed_with_four_jobs_in_its_slots_loses_none(tmp_path):
    """A SIGKILL of a 4-slot server hits every job in its slots: each goes back to
    the queue once (one loss, several jobs), reruns, and writes its output once."""
    import shutil

    from tests.conftest import WORKFLOWS
    from tests.e2e.test_preemption import _background_run, _catalog, _injector, _kills

    workdir = tmp_path / "preempt"
    shutil.copytree(WORKFLOWS / "preempt", workdir)
    args = ("--jobs", "4", *ONE_SERVER_FOUR_SLOTS, "--retries", "0")
    process = _background_run(workdir, *args, "--config", "count=12", "sleep=2.5")
    try:
        # The kill waits for two jobs in the server's slots, not for a time: a kill at a
        # fixed second hit a server still starting under CI's load (busy: False).
        logs = workdir / ".snakemake/context/logs/work"
        deadline = time.time() + 120
        while len(list(logs.glob("*.log"))) < 2 and time.time() < deadline:
            time.sleep(0.05)
        kill = ("--every", "0.2", "--first-after", "0", "--count", "1", "--signal", "KILL")
        _injector(workdir, *kill).wait(timeout=60)
        output, _ = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, output
    kills = _kills(workdir)
    assert len(kills) == 1 and kills[0]["busy"], kills
    for i in range(12):
        assert (workdir / f"out/{i}.txt").read_text() == f"{i}\n"
    ((reason, jobs_lost),) = _catalog(workdir, "select reason, jobs_lost from server_losses")
    assert reason.startswith("preemption: injected SIGKILL")
    assert jobs_lost >= 2, jobs_lost  # the jobs of several slots, each counted once
    assert output.count("lost (preemption: injected SIGKILL)") == 1
