"""How a run's embedded cluster ends, with the real snakemake command line: a
scheduler killed mid-run is one line (no traceback) and leaves the catalog right,
no zygote outlives the run, Dask's own log records go to the cluster log, not to a
job's log, and the run's servers leave the catalog's fleet with the run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import BIN, HEADER, WORKFLOWS, context_run

pytestmark = pytest.mark.slow


def _catalog(workdir: Path, query: str) -> list[tuple]:
    with sqlite3.connect(workdir / ".snakemake/context/catalog.db") as db:
        return db.execute(query).fetchall()


def _left_in(workdir: Path) -> list[str]:
    """Processes whose working directory is the workflow's (servers, zygotes, jobs)."""
    found = []
    for process in psutil.process_iter(["cwd", "cmdline"]):
        cwd = process.info["cwd"]
        if cwd and (cwd == str(workdir) or cwd.startswith(f"{workdir}/")):
            found.append(" ".join(process.info["cmdline"] or []))
    return found


def test_a_killed_scheduler_is_one_line_and_leaves_the_catalog_right(tmp_path):
    workdir = tmp_path / "wf"
    shutil.copytree(WORKFLOWS / "reuse", workdir)
    process = subprocess.Popen(
        [
            str(BIN / "snakemake"),
            *("--executor", "context", "--jobs", "2", "--context-servers", "2"),
            *("--config", "count=8", "sleep=4"),
        ],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "TOY_LOAD_SECONDS": "0.2"},
        start_new_session=True,
    )
    try:
        cluster = workdir / ".snakemake/context/cluster"
        deadline = time.monotonic() + 120
        while not list(workdir.glob(".snakemake/context/logs/use/*.log")):
            assert process.poll() is None and time.monotonic() < deadline, "no job started"
            time.sleep(0.2)
        (pid_file,) = cluster.glob("*.pid")
        os.kill(json.loads(pid_file.read_text())["pid"], signal.SIGKILL)
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode != 0, output
    died = [line for line in output.splitlines() if "the cluster's scheduler died:" in line]
    assert len(died) == 1, output
    (line,) = died
    assert "was killed by SIGKILL" in line, line
    assert "Traceback" not in output and "distributed.client" not in output, output
    assert "cancelled in Dask" not in output, output
    # No attempt is left running in the catalog, and the servers left.
    assert not _catalog(workdir, "select key from attempts where outcome is null")
    servers = _catalog(workdir, "select name, left, left_reason from servers")
    assert servers and all(left for _, left, _ in servers), servers
    assert all("the cluster's scheduler died" in reason for _, _, reason in servers), servers
    time.sleep(1)
    assert not _left_in(workdir)


FAILS_AT_ONCE = (
    HEADER.replace("value=5", "")
    + """
rule all:
    input: "plain.txt"

rule first:
    output: "first.txt"
    resources: context="toy"
    script: "fail.py"

rule plain:
    input: "first.txt"
    output: "plain.txt"
    shell: "touch {output}"
"""
)

#: Each server's zygote imports Snakemake when the run starts; on a loaded node that
#: takes seconds. This makes it take 20 s (the zygotes only).
SLOW_ZYGOTE = """
import sys, time
if "snakemake_executor_context.server.zygote" in sys.orig_argv:
    time.sleep(20)
"""


def test_no_zygote_outlives_a_failed_run(make_workflow):
    """A run that fails at once ends while its servers' zygotes (started for the plain
    job to come) are still importing Snakemake: 1 s after its exit, none is left."""
    workdir = make_workflow(
        {
            "Snakefile": FAILS_AT_ONCE,
            "loader.py": "def load():\n    return {}\n",
            "fail.py": "raise SystemExit('failing at once')\n",
            "site/sitecustomize.py": SLOW_ZYGOTE,
        }
    )
    path = os.pathsep.join(filter(None, [str(workdir / "site"), os.environ.get("PYTHONPATH")]))
    run = context_run(
        workdir,
        *("--context-servers", "2", "--context-plain-jobs", "servers"),
        env={"PYTHONPATH": path},
    )
    assert run.returncode != 0, run.output
    assert "failing at once" in run.output, run.output
    time.sleep(1)
    assert not _left_in(workdir)


DASK_RECORD = """
import logging
import time

from distributed import get_worker
from snakemake_executor_context import load_context

load_context(snakemake)
loop = get_worker().loop
# A record of Dask's own, logged on the server's event loop while this job runs.
loop.add_callback(logging.getLogger("distributed.worker").warning, "MARKER-%s", "dask")
time.sleep(2)
with open(snakemake.output[0], "w") as out:
    out.write("ok")
"""


def test_dasks_log_records_go_to_the_cluster_log_and_the_server_leaves_the_fleet(
    toy_workflow,
):
    workdir = toy_workflow(
        """
                rule all:
                    input: "out.txt"

                rule logs:
                    output: "out.txt"
                    resources: context="toy"
                    script: "scripts/logs.py"
            """,
        {
            "scripts/logs.py": DASK_RECORD,
        },
    )
    context_run(workdir, "--context-servers", "1").check()
    (job_log,) = (workdir / ".snakemake/context/logs/logs").glob("*.log")
    assert "MARKER-dask" not in job_log.read_text(), job_log.read_text()
    (cluster_log,) = (workdir / ".snakemake/context/cluster").glob("*.log")
    assert "MARKER-dask" in cluster_log.read_text()
    # The run's server left the catalog's fleet with it: `status` counts no server up
    # (it counted one more with every run).
    catalog = str(workdir / ".snakemake/context/catalog.db")
    status = subprocess.run(
        [str(BIN / "snakemake-context"), "status", "--json", "--catalog", catalog],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    fleet = json.loads(status.stdout)["fleet"]
    assert sum(row["servers"] for row in fleet) == 0 and sum(r["left"] for r in fleet) == 1


def test_a_quick_shutdown_drops_no_record_and_leaves_no_process(tmp_path):
    """The embedded cluster ends with its run at once (its servers killed, not closed
    one by one): after the exit of a 30-job run every job, attempt and load is in the
    catalog, finished, the run and its servers are closed, nothing is left running
    and the servers' deaths are not recorded as losses."""
    workdir = tmp_path / "wf"
    shutil.copytree(WORKFLOWS / "reuse", workdir)
    run = context_run(
        workdir,
        *("--context-servers", "2", "--config", "count=30", "sleep=0.1"),
        env={"TOY_LOAD_SECONDS": "0.5"},
    ).check()
    assert not _left_in(workdir), _left_in(workdir)
    summary = run.summaries()[-1]
    loads = sum(inv["loads"] for inv in summary["servers"].values())
    assert _catalog(workdir, "select count(*), count(finished) from jobs where outcome='ok'") == [
        (30, 30)
    ]
    assert _catalog(workdir, "select count(*) from attempts where finished is null") == [(0,)]
    assert _catalog(workdir, "select count(*) from placements where load_seconds is not null") == [
        (loads,)
    ]
    assert loads >= 1
    assert _catalog(workdir, "select count(*) from runs where finished is null") == [(0,)]
    assert _catalog(workdir, "select count(*) from servers where left is null") == [(0,)]
    assert _catalog(workdir, "select count(*) from server_losses") == [(0,)]
