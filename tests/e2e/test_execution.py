"""Snakemake semantics under --executor context: groups, dry runs, reporting, eviction."""

from __future__ import annotations

import re
import sqlite3
import textwrap
from pathlib import Path

import psutil
import pytest

from tests.conftest import context_run

pytestmark = pytest.mark.slow


def _cluster_processes(workdir: Path | None = None) -> list[psutil.Process]:
    """Cluster processes (of a workflow directory: its scheduler file lies there; other
    sessions' clusters on this machine do not count). Its forkserver and servers, forks
    of it, carry its command line: the cluster's is the one whose parent does not."""
    serve = "snakemake_executor_context.cluster.serve serve"
    found = []
    for proc in psutil.process_iter(["cmdline", "ppid"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        ours = workdir is None or str(workdir) in cmdline
        if serve in cmdline and ours:
            try:
                forked = serve in " ".join(psutil.Process(proc.info["ppid"]).cmdline())
            except psutil.Error:
                forked = False
            if not forked:
                found.append(proc)
    return found


def test_group_of_context_rule_and_shell_rule(toy_workflow):
    """A mixed group runs as one dispatch on a server, each member by its route: the
    context rule in-process, the shell rule as its own job command; each is a job of
    its own in the catalog."""
    workdir = toy_workflow(
        """
            rule all:
                input: "b.txt"

            rule a:
                output: "a.txt"
                group: "g"
                resources: context="toy"
                script: "scripts/use.py"

            rule b:
                input: "a.txt"
                output: "b.txt"
                group: "g"
                shell: "cat {input} > {output}; echo -n +shell >> {output}"
        """,
    )
    run = context_run(workdir).check()
    assert (workdir / "b.txt").read_text() == "5+shell"
    assert "runs as one subprocess" not in run.output
    with sqlite3.connect(workdir / ".snakemake/context/catalog.db") as db:
        rows = db.execute(
            "SELECT j.kind, j.rule, a.outcome, a.placed_by FROM attempts a "
            "JOIN jobs j ON j.id = a.job_id ORDER BY j.rule"
        ).fetchall()
    assert rows == [
        ("context", "a", "ok", "group"),
        ("plain", "b", "ok", "group"),
        ("group", "group g", "ok", "any"),
    ], rows
    assert re.search(r"server\(s\) on the embedded cluster .*, started in \d+\.\d s\.", run.output)


def test_group_with_an_integer_name(make_workflow):
    """`group: 0` (common in real Snakefiles) once crashed the run: the group id
    went into the log path as an int."""
    workdir = make_workflow(
        {
            "Snakefile": textwrap.dedent("""
            rule all:
                input: "b.txt"

            rule a:
                output: "a.txt"
                group: 0
                shell: "echo a > {output}"

            rule b:
                input: "a.txt"
                output: "b.txt"
                group: 0
                shell: "cat {input} > {output}; echo b >> {output}"
        """),
        }
    )
    context_run(workdir).check()
    assert (workdir / "b.txt").read_text() == "a\nb\n"
    assert list((workdir / ".snakemake/context/logs/0").glob("job.*.log"))


def test_a_group_no_server_can_run_gets_the_unrunnable_message(make_workflow):
    """Once an AttributeError in the status thread ('GroupJob' has no 'rule'). The GPUs
    are asked for by a function, so that no check at start can see them: the group
    reaches placement, which refuses it."""
    workdir = make_workflow(
        {
            "Snakefile": textwrap.dedent("""
            rule all:
                input: "b.txt"

            rule a:
                output: "a.txt"
                group: 0
                resources: gpu=lambda wildcards: 2
                shell: "echo a > {output}"

            rule b:
                input: "a.txt"
                output: "b.txt"
                group: 0
                shell: "cat {input} > {output}"
        """),
        }
    )
    run = context_run(workdir, "--context-servers", "1")
    assert run.returncode != 0
    assert "No context server can run group '0': gpu=2 but the servers have at most 1" in (
        run.output
    ), run.output
    assert "AttributeError" not in run.output


def test_a_group_of_context_jobs_no_server_can_run_names_its_widest_member(toy_workflow):
    """Two context jobs of gpu=1 share a group on a one-GPU server (Snakemake's gpu=2
    for the group is not what it needs); a member asking for 2 GPUs is named, with the
    fix on its rule, in the one line the user sees."""
    workdir = toy_workflow(
        """
            rule all:
                input: "b.txt"

            rule a:
                output: "a.txt"
                group: "g"
                resources: context="toy", gpu=1
                script: "scripts/use.py"

            rule b:
                input: "a.txt"
                output: "b.txt"
                group: "g"
                resources: context="toy", gpu=lambda wildcards: config.get("gpus", 1)
                script: "scripts/use.py"
        """,
    )
    context_run(workdir, "--context-servers", "1").check()
    (workdir / "b.txt").unlink()
    run = context_run(workdir, "--context-servers", "1", "--config", "gpus=2")
    assert run.returncode != 0
    assert (
        "No context server can run rule 'b' in group 'g' (a group's members run on one "
        "server, which needs its widest member's resources, not their sum): gpu=2 but the "
        "servers have at most 1"
    ) in run.output, run.output
    assert "--set-resources b:" in run.output


def test_dry_run_and_touch_start_no_cluster(toy_workflow):
    workdir = toy_workflow(
        """
            rule use:
                output: "out.txt"
                resources: context="toy"
                script: "scripts/use.py"
        """,
    )
    before = {p.pid for p in _cluster_processes(workdir)}
    dry = context_run(workdir, "-n").check()
    assert "use" in dry.output
    assert not (workdir / ".snakemake/context/cluster").exists()
    (workdir / "out.txt").write_text("old")
    context_run(workdir, "--touch").check()
    assert not (workdir / ".snakemake/context/cluster").exists()
    assert {p.pid for p in _cluster_processes(workdir)} <= before


def test_twenty_chained_jobs_report_promptly(toy_workflow):
    """Status checks every 60 s, yet 20 chained 0.1 s jobs finish quickly: a finished
    job wakes the status loop (the pytest timeout is the assertion)."""
    script = """
import time
from snakemake_executor_context import load_context

load_context(snakemake)
time.sleep(0.1)
with open(snakemake.output[0], "w") as f:
    f.write(snakemake.wildcards.i)
"""
    workdir = toy_workflow(
        """
            rule all:
                input: "chain/20.txt"

            rule first:
                output: "chain/0.txt"
                shell: "echo 0 > {output}"

            rule step:
                input: lambda wc: f"chain/{int(wc.i) - 1}.txt"
                output: "chain/{i}.txt"
                wildcard_constraints: i="[1-9][0-9]*"
                resources: context="toy"
                script: "scripts/use.py"
        """,
        {
            "scripts/use.py": script,
        },
    )
    run = context_run(
        workdir,
        "--seconds-between-status-checks",
        "60",
        "--context-tuning",
        "status_interval=60",
        timeout=180,
    ).check()
    assert (workdir / "chain/20.txt").read_text() == "20"
    assert "22 of 22 steps (100%) done" in run.output


EVICTION_LOADER = """
import os
from snakemake_executor_context import declare_size

class Model:
    def __init__(self, name):
        self.name = name
        self.closed = False
        self.weights = bytearray(40_000_000)

    def close(self):
        self.closed = True

def load(name):
    declare_size(40_000_000)
    return Model(name)
"""
EVICTION_SCRIPT = """
from snakemake_executor_context import load_context

model = load_context(snakemake)
assert not model.closed, "ran against an evicted object"
with open(snakemake.output[0], "w") as f:
    f.write(model.name)
"""


def test_eviction_of_least_recently_used(make_workflow):
    """A budget that fits one of two contexts: alternating jobs evict each other."""
    workdir = make_workflow(
        {
            "Snakefile": textwrap.dedent("""
            from snakemake_executor_context import declare_context

            declare_context(config, "a", "loader.py:load", name="a")
            declare_context(config, "b", "loader.py:load", name="b")
            ORDER = ["a", "b", "a", "a", "b"]

            rule all:
                input: f"steps/{len(ORDER) - 1}.txt"

            rule step:
                input: lambda wc: [] if wc.i == "0" else f"steps/{int(wc.i) - 1}.txt"
                output: "steps/{i}.txt"
                resources: context=lambda wc: ORDER[int(wc.i)]
                script: "scripts/use.py"
        """),
            "loader.py": EVICTION_LOADER,
            "scripts/use.py": EVICTION_SCRIPT,
        }
    )
    run = context_run(
        workdir,
        "--context-servers",
        "1",
        "--context-contexts-memory",
        "60MB",
    ).check()
    assert [(workdir / f"steps/{i}.txt").read_text() for i in range(5)] == list("abaab")
    (summary,) = run.summaries()
    (server,) = summary["servers"].values()
    # a (load), b (load, evict a), a (load, evict b), a (hit), b (load, evict a)
    assert server["loads"] == 4
    assert server["evictions"] == 3
    assert server["hits"] == 1
    assert server["memory_budget"] == 60_000_000
    assert [c["names"] for c in server["contexts"]] == [["b"]]


MESSY_SCRIPT = """
import io
import json
import os
import sys

from snakemake_executor_context import load_context

load_context(snakemake)
state = {
    "cwd": os.getcwd(),
    "env": os.environ.get("LEFT_BEHIND"),
    "path": "/left/behind" in sys.path,
    "argv": sys.argv[1:],
    "main_marker": getattr(sys.modules["__main__"], "LEFT_BEHIND", None),
    "stdout_is_default": type(sys.stdout).__name__,
    "omp": os.environ.get("OMP_NUM_THREADS"),
    "scriptdir_on_path": snakemake.scriptdir in sys.path,
}
with open(snakemake.output[0], "w") as f:
    json.dump(state, f)
print("printed by", snakemake.wildcards.i)
sys.stdout.flush()
os.system("echo from a subprocess")  # file-descriptor level output
# Now make a mess that must not outlive this job.
os.environ["LEFT_BEHIND"] = "yes"
sys.path.append("/left/behind")
sys.argv.append("--left-behind")
sys.modules["__main__"].LEFT_BEHIND = True
sys.modules["__main__"] = type(sys)("impostor")
sys.stdout = io.StringIO()
os.chdir("/")
"""


def test_what_a_job_changes_does_not_outlive_it(toy_workflow):
    workdir = toy_workflow(
        """
            rule all:
                input: "state/1.json"

            rule step:
                input: lambda wc: [] if wc.i == "0" else "state/0.json"
                output: "state/{i}.json"
                threads: lambda wc: 1 + int(wc.i)
                resources: context="toy"
                script: "scripts/messy.py"
        """,
        {
            "scripts/messy.py": MESSY_SCRIPT,
        },
    )
    context_run(workdir, "--context-servers", "1").check()
    import json

    first, second = (json.loads((workdir / f"state/{i}.json").read_text()) for i in (0, 1))
    assert first == {**second, "omp": "1"}  # identical but for the threads asked for
    assert second == {
        "cwd": str(workdir),
        "env": None,
        "path": False,
        "argv": [],
        "main_marker": None,
        "stdout_is_default": "ThreadRoutedStream",
        "omp": "2",
        "scriptdir_on_path": True,
    }
    logs = sorted((workdir / ".snakemake/context/logs/step").glob("*.log"))
    assert [p.read_text().split("\n")[:2] for p in logs] == [
        ["printed by 0", "from a subprocess"],
        ["printed by 1", "from a subprocess"],
    ]


def test_retries_rerun_a_failed_context_job(toy_workflow):
    script = """
import os

if not os.path.exists("first-attempt-was-here"):
    open("first-attempt-was-here", "w").close()
    raise RuntimeError("transient failure")
with open(snakemake.output[0], "w") as f:
    f.write("second attempt")
"""
    workdir = toy_workflow(
        """
            rule use:
                output: "out.txt"
                resources: context="toy"
                script: "scripts/use.py"
        """,
        {
            "scripts/use.py": script,
        },
    )
    run = context_run(workdir, "--retries", "1").check()
    assert (workdir / "out.txt").read_text() == "second attempt"
    assert "RuntimeError: transient failure" in run.output


def test_servers_never_pause_or_kill_for_memory(scheduler_file):
    """A loaded model must not make Dask pause (80%) or terminate (95%) its server."""
    from distributed import Client

    def thresholds(dask_worker):
        manager = dask_worker.memory_manager
        return (
            manager.memory_target_fraction,
            manager.memory_spill_fraction,
            manager.memory_pause_fraction,
        )

    def terminate(dask_worker):  # the nanny's
        return dask_worker.memory_manager.memory_terminate_fraction

    from snakemake_executor_context.cluster.credentials import Credentials

    security = Credentials.beside(scheduler_file).security()
    with Client(scheduler_file=str(scheduler_file), security=security, timeout=30) as client:
        assert set(client.run(thresholds).values()) == {(False, False, False)}
        assert set(client.run(terminate, nanny=True).values()) == {False}
