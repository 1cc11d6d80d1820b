"""Pilots on a real Grid Engine: Debian's Son of Grid Engine 8.1.9 as a single-node
cluster (``tests/sge/sge-up.sh``: a queue ``gpu.q`` of 8 slots on these 2-core
machines, a consumable ``gpu`` complex of 4 on the host, a project ``ctxproj``,
accounting flushed at once).

The fixture installs and starts Grid Engine where it can (root, Debian's packages
reachable), stops what it started, and skips with the reason elsewhere;
``SNAKEMAKE_CONTEXT_REQUIRE_SGE=1`` (set by CI) turns the skip into a failure. Run these
under ``flock /tmp/sge-tests.lock`` where other sessions share the machine.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from snakemake_executor_context.errors import ClusterError
from snakemake_executor_context.pilots.batch.sge import qacct_end_state, sge_directives
from snakemake_executor_context.pilots.batch.system import clock
from snakemake_executor_context.pilots.request import PilotOptions, jobqueue_arguments
from tests.batchpools import pilot_pool, wait
from tests.batchpools import pool_books as _pool_books
from tests.conftest import BIN, WORKFLOWS, context_run

pytestmark = pytest.mark.slow

QMASTER_PID = "/var/spool/gridengine/qmaster/qmaster.pid"
#: Where the execution daemon keeps the script of each job it runs (in a directory
#: named after the host, as the daemon resolved it).
SPOOLED_SCRIPTS = Path("/var/spool/gridengine/execd")
#: What every pool here asks of Grid Engine (the fixture's queue and project), and a
#: prologue line only bash runs (the queue's shell is /bin/sh).
POOL = (
    "--queue",
    "gpu.q",
    "--account",
    "ctxproj",
    "--gpu-type",
    "sgefake",
    "--prologue",
    '[[ -n "$BASH_VERSION" ]] || exit 3',
)


def _qstat() -> list[dict[str, str]]:
    """Every job in the queue: number, full name, state (plain qstat cuts names)."""
    out = subprocess.run(
        ["qstat", "-u", "*", "-xml"], capture_output=True, text=True, check=True
    ).stdout
    return [
        {
            "id": job.findtext("JB_job_number", ""),
            "name": job.findtext("JB_name", ""),
            "state": job.findtext("state", ""),
        }
        for job in ET.fromstring(out).iter("job_list")
    ]


def _pilots() -> list[dict[str, str]]:
    return [job for job in _qstat() if job["name"] == "snakemake-context"]


def _qstat_j(job_id: str) -> dict[str, str]:
    """What qmaster holds of a job (``qstat -j``): its requests as it accepted them."""
    out = subprocess.run(["qstat", "-j", job_id], capture_output=True, text=True).stdout
    return {
        key.strip(): value.strip()
        for key, _, value in (line.partition(":") for line in out.splitlines())
        if value
    }


def _qacct(job_id: str) -> dict[str, str]:
    """The newest accounting record of a job number."""
    out = subprocess.run(["qacct", "-j", job_id], capture_output=True, text=True).stdout
    last = re.split(r"^=+\s*$", out, flags=re.MULTILINE)[-1]
    return {
        key: value.strip()
        for key, _, value in (line.partition(" ") for line in last.splitlines())
        if key
    }


@pytest.fixture
def pool(tmp_path: Path, sge) -> Iterator:
    """Start `snakemake-context up --backend sge ...` with given options; stopped after."""
    yield from pilot_pool(tmp_path, "sge", POOL, _pilots, 60)


def _outputs_correct(workdir: Path, count: int) -> None:
    # The reuse workflow's toy context holds 7 * 3; job i writes "<pid> <21 + i>".
    for i in range(count):
        assert (workdir / "out" / f"{i}.txt").read_text().split()[1] == str(21 + i), i


def test_a_context_workflow_of_30_jobs_runs_on_sge_pilots(tmp_path: Path, pool) -> None:
    # An extra directive: Grid Engine's account string, which qacct records.
    scheduler_file = pool("--min-pilots", "1", "--max-pilots", "2", "--directive", "-A ctxtest")
    first = wait(lambda: [p for p in _pilots() if p["state"] == "r"], 60, "a running pilot")
    # What qmaster accepted: bash, the GPU consumable, the walltime, the memory (1GB,
    # 953 MiB), the queue and the project.
    accepted = _qstat_j(first[0]["id"])
    assert accepted["hard resource_list"] == "gpu=1,h_rt=1200,mem_free=953M", accepted
    assert accepted["hard_queue_list"] == "gpu.q" and accepted["project"] == "ctxproj"
    assert accepted["shell_list"] == "NONE:/bin/bash", accepted
    # The job script the execution daemon runs: the credentials from beside the
    # scheduler file.
    (script,) = SPOOLED_SCRIPTS.glob(f"*/job_scripts/{first[0]['id']}")
    tls = scheduler_file.with_suffix(".tls")
    assert f"--tls-ca-file {tls}/" in script.read_text(), script.read_text()
    workdir = tmp_path / "wf"
    shutil.copytree(WORKFLOWS / "reuse", workdir)
    run = context_run(
        workdir,
        "--context-scheduler-file",
        str(scheduler_file),
        "--config",
        "count=30",
        "sleep=0.2",
        env={"TOY_LOAD_SECONDS": "0.5"},
        timeout=300,
    ).check()
    _outputs_correct(workdir, 30)
    summary = run.summaries()[-1]
    assert len(summary["jobs"]) == 30 and all(job["ok"] for job in summary["jobs"]), summary
    assert {job["server"] for job in summary["jobs"]} <= {
        r["name"] for r in _pool_books(scheduler_file)["records"]
    }
    assert all(job["server"].startswith("pilot-sgefake-") for job in summary["jobs"]), summary
    job_ids = [r["job_id"] for r in _pool_books(scheduler_file)["records"]]
    subprocess.run(
        [str(BIN / "snakemake-context"), "down", "--scheduler-file", str(scheduler_file)],
        capture_output=True,
        timeout=60,
    )
    wait(lambda: not _pilots(), 60, "the pilots to leave the queue")
    # Grid Engine's accounting knows every pilot: its name, queue, project, account
    # string and the GPU it booked.
    for job_id in job_ids:
        record = wait(lambda j=job_id: _qacct(j), 30, f"pilot {job_id} in qacct")
        assert record["jobname"] == "snakemake-context", record
        assert record["qname"] == "gpu.q" and record["project"] == "ctxproj", record
        assert record["account"] == "ctxtest", record
        assert "gpu=1" in record["category"], record


def test_a_deleted_pilot_is_survived_and_counted_as_a_preemption(tmp_path: Path, pool) -> None:
    scheduler_file = pool("--min-pilots", "2", "--max-pilots", "2")
    wait(lambda: len(_pilots()) == 2, 60, "two pilots")
    workdir = tmp_path / "wf"
    shutil.copytree(WORKFLOWS / "reuse", workdir)
    process = subprocess.Popen(
        [
            str(BIN / "snakemake"),
            "--executor",
            "context",
            "--jobs",
            "2",
            "--retries",
            "0",
            "--context-scheduler-file",
            str(scheduler_file),
            "--config",
            "count=12",
            "sleep=2",
        ],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "TOY_LOAD_SECONDS": "0.5"},
    )
    try:
        wait(
            lambda: (
                len(list((workdir / "out").glob("*.txt"))) >= 2
                if (workdir / "out").exists()
                else False
            ),
            120,
            "the first outputs",
        )
        victim = next(p["id"] for p in _pilots() if p["state"] == "r")
        subprocess.run(["qdel", victim], check=True, capture_output=True)
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
    assert _qacct(victim)["failed"].startswith("100"), _qacct(victim)
    books = _pool_books(scheduler_file)
    assert books["account"]["preempted"] >= 1 and books["account"]["crashed"] == 0, books
    # The pool keeps its minimum: the deleted pilot was replaced.
    assert books["account"]["submitted"] >= 3, books


GPU_HUNGRY_SNAKEFILE = """
rule all:
    input: "out/big.txt"

rule big:
    output: "out/big.txt"
    resources: gpu=8
    shell: "touch {output}"
"""


def test_a_rule_needing_more_gpus_than_any_queue_offers_fails_at_start(tmp_path: Path, sge) -> None:
    workdir = tmp_path / "big"
    workdir.mkdir()
    (workdir / "Snakefile").write_text(GPU_HUNGRY_SNAKEFILE)
    run = context_run(
        workdir,
        "--context-pilots",
        "backend=sge",
        "queue=gpu.q",
        "gpus=8",
        "gpu_type=sgefake",
        "memory=1GB",
        timeout=120,
    )
    assert run.returncode != 0
    (line,) = [x for x in run.output.splitlines() if "Grid Engine would never run" in x]
    assert "-l gpu=8" in line and "offers only hc:gpu=4" in line and "Fix:" in line, line
    assert "Traceback" not in run.output
    assert not _pilots()


def test_pilots_retire_before_walltime_and_are_replaced_while_work_remains(
    tmp_path: Path, pool
) -> None:
    # Walltime 1:10, margin 45 s, stagger 5 s: each pilot retires after 20-25 s.
    scheduler_file = pool(
        "--min-pilots",
        "0",
        "--max-pilots",
        "1",
        "--walltime",
        "00:01:10",
        "--retire-margin",
        "45",
        "--lifetime-stagger",
        "5",
        "--pilot-idle-timeout",
        "3",
    )
    workdir = tmp_path / "wf"
    shutil.copytree(WORKFLOWS / "reuse", workdir)
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
    assert books["account"]["crashed"] == 0 and books["account"]["preempted"] == 0, books
    # A pilot that retired at its lifetime ended its job itself: qacct says failed 0,
    # exit status 0, read as COMPLETED.
    retired = [r for r in books["records"] if r["batch_state"] == "COMPLETED"]
    assert retired, books
    assert _qacct(retired[0]["job_id"])["exit_status"] == "0"


# What Grid Engine writes, and how it is read (no Grid Engine needed).

QACCT = """==============================================================
qname        gpu.q
jobname      snakemake-context
jobnumber    {number}
failed       {failed}
exit_status  {status}
"""


@pytest.mark.parametrize(
    ("failed", "status", "state"),
    [
        ("0    ", "0", "COMPLETED"),
        ("0    ", "3", "FAILED"),
        ("100 : assumedly after job", "137                  (Killed)", "CANCELLED"),
        ("37  : qmaster enforced h_rt, h_cpu, or h_vmem limit", "137", "TIMEOUT"),
        ("28  : changing into working directory", "0", "FAILED"),
    ],
)
def test_qacct_records_read_as_batch_states(failed: str, status: str, state: str) -> None:
    # An older job of the same number first (a recreated cell numbers jobs anew).
    older = QACCT.format(number=4, failed="0", status="0")
    assert qacct_end_state(older + QACCT.format(number=4, failed=failed, status=status)) == state
    assert qacct_end_state("") is None


def test_sge_pilot_directives() -> None:
    assert sge_directives(1, "2GB", ()) == ["-S /bin/bash", "-l mem_free=1907M"]
    assert sge_directives(1, "16GB", ("-S /bin/zsh",)) == ["-l mem_free=15258M"]
    assert clock(93605) == "26:00:05"  # h_rt: hours past 24 kept in the hours
    _, kwargs = jobqueue_arguments(PilotOptions(backend="sge", walltime="26:00:05"))
    assert kwargs["walltime"] == "26:00:05" and kwargs["resource_spec"] == "gpu=1"
    _, kwargs = jobqueue_arguments(PilotOptions(backend="sge", walltime="93605"))
    assert kwargs["walltime"] == "26:00:05"
    # SLURM's day form is not Grid Engine's: refused by name, never misread.
    with pytest.raises(ClusterError, match=r"'1-02:00:05'.*not a walltime SGE reads"):
        jobqueue_arguments(PilotOptions(backend="sge", walltime="1-02:00:05"))
    assert kwargs["job_extra_directives"] == ["-S /bin/bash", "-l mem_free=15258M"]
    with pytest.raises(ClusterError, match=r"--context-pilots cores=4 on Grid Engine.*-pe smp 4"):
        jobqueue_arguments(PilotOptions(backend="sge", cores=4))
    assert jobqueue_arguments(PilotOptions(backend="sge", cores=4, extra_directives=("-pe smp 4",)))
