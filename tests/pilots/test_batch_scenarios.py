"""The scenarios every batch system's pilots go through, once each on a real SLURM and
a real Grid Engine: a context workflow runs on the pilots, a pilot the batch system
deletes is survived as a preemption, a rule no pilot can run fails at start, and
pilots retire before their walltime and are replaced while work remains.

The ``slurm`` fixture is Debian's slurm-wlm and munge as a single-node cluster
(``tests/slurm/slurm-up.sh``: 8 declared CPUs on these 2-core machines, two fake GPU
types ``fakea`` and ``fakeb`` of 2 GPUs each, preemption by partition tier); the
``sge`` fixture Debian's Son of Grid Engine 8.1.9 (``tests/sge/sge-up.sh``: a queue
``gpu.q`` of 8 slots, a consumable ``gpu`` complex of 4 on the host, a project
``ctxproj``, accounting flushed at once). Each installs and starts its system where
it can (root, Debian's packages reachable), stops what it started, and skips with the
reason elsewhere; ``SNAKEMAKE_CONTEXT_REQUIRE_SLURM=1`` and
``SNAKEMAKE_CONTEXT_REQUIRE_SGE=1`` (set by CI) turn the skip into a failure.

What one system alone has (SLURM's GPU types and preemption, Grid Engine's ``qacct``)
is in ``test_slurm.py`` and, without a batch system, ``test_batch.py``; the queues are
read in ``tests/batchpools.py``.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.batchpools import (
    SGE_POOL,
    SGE_SPOOLED_SCRIPTS,
    SLURM_GPU_MODELS,
    pilot_pool,
    sge_pilots,
    sge_qacct,
    sge_qstat_j,
    slurm_pilots,
    wait,
)
from tests.batchpools import pool_books as _pool_books
from tests.conftest import BIN, WORKFLOWS, context_run

pytestmark = pytest.mark.slow


def _no_check(*_: object) -> None:
    """A system with nothing more to check at this point."""


@dataclass(frozen=True)
class System:
    """One batch system under the scenarios: how its queue is read and what it says."""

    name: str
    #: What every pool here asks of it (the fixture's queue, project, GPU type).
    fixed: tuple[str, ...]
    pilots: Callable[[], list[dict[str, str]]]
    running: Callable[[dict[str, str]], bool]
    #: The command that deletes a job from its queue, as an administrator would.
    delete: str
    #: Seconds its queue takes to let go of the pilots a stopped pool leaves.
    leave_seconds: float
    #: The name every pilot's server starts with (its GPU type's).
    prefix: str
    #: The first scenario's jobs, and what it checks of the first running pilot and,
    #: once the pool is down, of the jobs it ran.
    jobs: int
    first_pilot: Callable[[dict[str, str], Path], None] = _no_check
    after_down: Callable[[Path, list[str]], None] = _no_check
    deleted: Callable[[str], None] = _no_check
    #: A rule no pilot can run: its Snakefile, the run's request, and the line that
    #: refuses it at start with what that line must say.
    unrunnable: str = ""
    unrunnable_request: tuple[str, ...] = ()
    refusal: tuple[str, ...] = ()
    #: The retiring pool's walltime and margin (a pilot lives walltime - margin, less
    #: its stagger of 5 s), and what the system says of a retired pilot.
    walltime: tuple[str, str] = ("00:01:00", "40")
    retired: Callable[[dict], None] = _no_check
    extra_first: tuple[str, ...] = field(default=())


def _slurm_first(pilot: dict[str, str], scheduler_file: Path) -> None:
    assert "gpu:fakea:1" in pilot["gres"], pilot


def _slurm_after_down(scheduler_file: Path, job_ids: list[str]) -> None:
    """The pool's books are in the catalog, each pilot's batch allocation too, and
    every pilot's end: the ledger charges what SLURM charged."""
    catalog = scheduler_file.with_suffix(".db")
    with sqlite3.connect(catalog) as db:
        pilots = db.execute("select name, registered, ended from pilots").fetchall()
        servers = db.execute("select name, allocated_at, joined, left from servers").fetchall()
    # Every pilot that served registered; one the pool asked for while the run's demand
    # lasted may still be starting when `down` ends it (seen once on a slow machine):
    # it has an end, and no registration.
    served = {name for name, *_ in servers}
    assert served and served <= {name for name, registered, _ in pilots if registered}, pilots
    assert all(ended for _, _, ended in pilots), pilots
    assert all(left is not None for *_, left in servers), servers
    assert all(at is not None and at <= joined for _, at, joined, _ in servers), servers
    from snakemake_executor_context.catalog.reading.ledger import read_ledger, window_of
    from snakemake_executor_context.catalog.store import open_reader
    from snakemake_executor_context.fleet.buckets import Bucket
    from tests.fleet.test_ledger import assert_partition

    store = open_reader(catalog)
    with store.session() as session:
        ledger = read_ledger(session, window_of(session, since=0.0))
    store.close()
    assert_partition(ledger)
    assert ledger.totals().get(Bucket.ALLOCATED_BEFORE, 0.0) > 0, ledger.totals()


def _sge_first(pilot: dict[str, str], scheduler_file: Path) -> None:
    # What qmaster accepted: bash, the GPU consumable, the walltime, the memory (1GB,
    # 953 MiB), the queue and the project.
    accepted = sge_qstat_j(pilot["id"])
    assert accepted["hard resource_list"] == "gpu=1,h_rt=1200,mem_free=953M", accepted
    assert accepted["hard_queue_list"] == "gpu.q" and accepted["project"] == "ctxproj"
    assert accepted["shell_list"] == "NONE:/bin/bash", accepted
    # The job script the execution daemon runs: the credentials from beside the
    # scheduler file.
    (script,) = SGE_SPOOLED_SCRIPTS.glob(f"*/job_scripts/{pilot['id']}")
    tls = scheduler_file.with_suffix(".tls")
    assert f"--tls-ca-file {tls}/" in script.read_text(), script.read_text()


def _sge_after_down(scheduler_file: Path, job_ids: list[str]) -> None:
    # Grid Engine's accounting knows every pilot: its name, queue, project, account
    # string (the extra directive) and the GPU it booked.
    for job_id in job_ids:
        record = wait(lambda j=job_id: sge_qacct(j), 30, f"pilot {job_id} in qacct")
        assert record["jobname"] == "snakemake-context", record
        assert record["qname"] == "gpu.q" and record["project"] == "ctxproj", record
        assert record["account"] == "ctxtest", record
        assert "gpu=1" in record["category"], record


def _sge_deleted(job_id: str) -> None:
    assert sge_qacct(job_id)["failed"].startswith("100"), sge_qacct(job_id)


def _sge_retired(books: dict) -> None:
    # A pilot that retired at its lifetime ended its job itself: qacct says failed 0,
    # exit status 0, read as COMPLETED.
    assert books["account"]["preempted"] == 0, books
    retired = [r for r in books["records"] if r["batch_state"] == "COMPLETED"]
    assert retired, books
    assert sge_qacct(retired[0]["job_id"])["exit_status"] == "0"


SGE_UNRUNNABLE = """
rule all:
    input: "out/big.txt"

rule big:
    output: "out/big.txt"
    resources: gpu=8
    shell: "touch {output}"
"""

SYSTEMS = {
    "slurm": System(
        name="slurm",
        fixed=("--gpu-type", "fakea"),
        pilots=slurm_pilots,
        running=lambda job: job["state"] == "RUNNING",
        delete="scancel",
        leave_seconds=30,
        prefix="pilot-fakea-",
        jobs=6,
        first_pilot=_slurm_first,
        after_down=_slurm_after_down,
        # A GPU type the pool does not ask for: refused by the plugin before a pilot.
        unrunnable=SLURM_GPU_MODELS,
        unrunnable_request=("backend=slurm", "gpu_type=fakea", "memory=1GB"),
        refusal=("Rule 'on_b' asks for gpu=1, gpu_model=fakeb, which no pilot of the pool",),
        # SLURM counts whole minutes: 00:01:10 would be 2.
        walltime=("00:01:00", "40"),
    ),
    "sge": System(
        name="sge",
        fixed=SGE_POOL,
        pilots=sge_pilots,
        running=lambda job: job["state"] == "r",
        delete="qdel",
        leave_seconds=60,
        prefix="pilot-sgefake-",
        jobs=30,
        # An extra directive: Grid Engine's account string, which qacct records.
        extra_first=("--directive", "-A ctxtest"),
        first_pilot=_sge_first,
        after_down=_sge_after_down,
        deleted=_sge_deleted,
        # More GPUs than any queue offers: refused by Grid Engine's own `qsub -w v`.
        unrunnable=SGE_UNRUNNABLE,
        unrunnable_request=(
            "backend=sge",
            "queue=gpu.q",
            "gpus=8",
            "gpu_type=sgefake",
            "memory=1GB",
        ),
        refusal=("Grid Engine would never run", "-l gpu=8", "offers only hc:gpu=4", "Fix:"),
        walltime=("00:01:10", "45"),
        retired=_sge_retired,
    ),
}


@pytest.fixture(params=sorted(SYSTEMS))
def batch(request: pytest.FixtureRequest) -> System:
    """The batch system of this run of a scenario, started (``tests/conftest.py``
    groups each system's scenarios into the process that runs its daemons)."""
    request.getfixturevalue(request.param)
    return SYSTEMS[request.param]


@pytest.fixture
def pool(tmp_path: Path, batch: System) -> Iterator[Callable[..., Path]]:
    """``pool(*options)``: `snakemake-context up --backend <system> ...`; stopped after."""
    yield from pilot_pool(tmp_path, batch.name, batch.fixed, batch.pilots, batch.leave_seconds)


def _reuse_workflow(tmp_path: Path) -> Path:
    workdir = tmp_path / "wf"
    shutil.copytree(WORKFLOWS / "reuse", workdir)
    return workdir


def _outputs_correct(workdir: Path, count: int) -> None:
    # The reuse workflow's toy context holds 7 * 3; job i writes "<pid> <21 + i>".
    for i in range(count):
        assert (workdir / "out" / f"{i}.txt").read_text().split()[1] == str(21 + i), i


def test_a_context_workflow_runs_on_pilots(tmp_path: Path, batch: System, pool) -> None:
    scheduler_file = pool("--min-pilots", "1", "--max-pilots", "2", *batch.extra_first)
    first = wait(lambda: [p for p in batch.pilots() if batch.running(p)], 60, "a running pilot")
    batch.first_pilot(first[0], scheduler_file)
    workdir = _reuse_workflow(tmp_path)
    run = context_run(
        workdir,
        "--context-scheduler-file",
        str(scheduler_file),
        "--config",
        f"count={batch.jobs}",
        "sleep=0.2",
        env={"TOY_LOAD_SECONDS": "0.5"},
        timeout=300,
    ).check()
    _outputs_correct(workdir, batch.jobs)
    summary = run.summaries()[-1]
    jobs = summary["jobs"]
    assert len(jobs) == batch.jobs and all(job["ok"] for job in jobs), summary
    # The jobs ran on the pool's pilots, named after their GPU type.
    records = _pool_books(scheduler_file)["records"]
    assert {job["server"] for job in jobs} <= {r["name"] for r in records}, summary
    assert all(job["server"].startswith(batch.prefix) for job in jobs), summary
    job_ids = [r["job_id"] for r in records]
    subprocess.run(
        [str(BIN / "snakemake-context"), "down", "--scheduler-file", str(scheduler_file)],
        capture_output=True,
        timeout=60,
    )
    wait(lambda: not batch.pilots(), batch.leave_seconds, "the pilots to leave the queue")
    batch.after_down(scheduler_file, job_ids)


def test_a_deleted_pilot_is_survived_and_counted_as_a_preemption(
    tmp_path: Path, batch: System, pool
) -> None:
    scheduler_file = pool("--min-pilots", "2", "--max-pilots", "2")
    wait(lambda: len(batch.pilots()) == 2, 60, "two pilots")
    workdir = _reuse_workflow(tmp_path)
    process = subprocess.Popen(
        [
            str(BIN / "snakemake"),
            *("--executor", "context", "--jobs", "2", "--retries", "0"),
            *("--context-scheduler-file", str(scheduler_file)),
            *("--config", "count=12", "sleep=2"),
        ],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "TOY_LOAD_SECONDS": "0.5"},
    )
    try:
        wait(
            lambda: (workdir / "out").exists() and len(list((workdir / "out").glob("*.txt"))) >= 2,
            120,
            "the first outputs",
        )
        victim = next(p["id"] for p in batch.pilots() if batch.running(p))
        subprocess.run([batch.delete, victim], check=True, capture_output=True)
        output, _ = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, output
    _outputs_correct(workdir, 12)
    assert "Error in rule" not in output, output
    # The executor counts the lost jobs against their preemption budget.
    assert "lost (preemption: " in output, output

    def deleted_record():
        records = _pool_books(scheduler_file).get("records", [])
        return [r for r in records if r["job_id"] == victim and r["batch_state"]]

    (record,) = wait(deleted_record, 60, "the pool to read the deleted pilot's state")
    assert record["batch_state"] == "CANCELLED" and not record["released"], record
    batch.deleted(victim)
    books = _pool_books(scheduler_file)
    assert books["account"]["preempted"] >= 1 and books["account"]["crashed"] == 0, books
    # The pool keeps its minimum: the deleted pilot was replaced.
    assert books["account"]["submitted"] >= 3, books


def test_a_rule_no_pilot_can_run_fails_at_start(tmp_path: Path, batch: System) -> None:
    workdir = tmp_path / "unrunnable"
    workdir.mkdir()
    (workdir / "Snakefile").write_text(batch.unrunnable)
    run = context_run(workdir, "--context-pilots", *batch.unrunnable_request, timeout=120)
    assert run.returncode != 0
    lines = [x for x in run.output.splitlines() if batch.refusal[0] in x]
    assert len(lines) == 1, run.output
    assert all(part in lines[0] for part in batch.refusal), lines[0]
    assert "Traceback" not in run.output
    assert not batch.pilots()


def test_pilots_retire_before_walltime_and_are_replaced_while_work_remains(
    tmp_path: Path, batch: System, pool
) -> None:
    walltime, margin = batch.walltime
    scheduler_file = pool(
        *("--min-pilots", "0", "--max-pilots", "1", "--walltime", walltime),
        *("--retire-margin", margin, "--lifetime-stagger", "5", "--pilot-idle-timeout", "3"),
    )
    workdir = _reuse_workflow(tmp_path)
    context_run(
        workdir,
        "--context-scheduler-file",
        str(scheduler_file),
        "--context-tuning",
        "wait_for_server=120",
        "--config",
        "count=10",
        "sleep=3",
        env={"TOY_LOAD_SECONDS": "0.5"},
        timeout=400,
    ).check()
    _outputs_correct(workdir, 10)
    books = wait(
        lambda: (b := _pool_books(scheduler_file))["account"]["running"] == 0 and b,
        60,
        "idle pilots to be released",
    )
    # 30 s of jobs on one pilot at a time that lives at most 25 s: at least two pilots.
    assert books["account"]["submitted"] >= 2, books
    assert books["account"]["crashed"] == 0, books
    batch.retired(books)
