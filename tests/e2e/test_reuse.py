"""Contexts load once per server and serve every job that names them."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import psutil
import pytest

from tests.conftest import context_run, snakemake

pytestmark = pytest.mark.slow


def _outputs(workdir: Path, n: int) -> dict[int, tuple[int, int]]:
    values = {}
    for i in range(n):
        pid, value = (workdir / f"out/{i}.txt").read_text().split()
        values[i] = (int(pid), int(value))
    return values


def test_twenty_jobs_two_servers_two_loads(workflow):
    workdir = workflow("reuse")
    # Jobs (0.5 s) longer than a load (0.3 s): with jobs queued, placement loads the
    # context on the second server too rather than have them wait for the first.
    run = context_run(
        workdir, "--context-servers", "2", "--config", "sleep=0.5", env={"TOY_LOAD_SECONDS": "0.3"}
    ).check()

    outputs = _outputs(workdir, 20)
    per_server = Counter(pid for pid, _ in outputs.values())
    assert len(per_server) == 2, per_server
    assert min(per_server.values()) >= 5, per_server
    assert all(value == 21 + i for i, (_, value) in outputs.items())

    (summary,) = run.summaries()
    servers = summary["servers"].values()
    assert sorted(inv["server"]["pid"] for inv in servers) == sorted(per_server)
    # Counted by the servers: one load each, although two names are used.
    assert sum(inv["loads"] for inv in servers) == 2
    assert all(inv["loads"] == 1 for inv in servers)
    assert sum(inv["hits"] for inv in servers) >= 18
    jobs = summary["jobs"]
    assert len(jobs) == 20 and all(job["ok"] for job in jobs)
    assert sum(job["items"] for job in jobs) == 60
    assert sum(1 for job in jobs if job["loaded"]) == 2
    assert "with 2 context load(s)" in run.output
    assert run.output.count("stand in for gpu=1") == 1  # said once, as there is no GPU
    # The embedded cluster is gone with the run (its servers, forks of its process
    # with its command line, as soon as the kernel has ended them: they are killed).
    left = [
        p for p in psutil.process_iter(["cmdline"])
        if summary["run_id"] in " ".join(p.info["cmdline"] or [])
    ]  # fmt: skip
    _, alive = psutil.wait_procs(left, timeout=5)
    assert not alive, alive


def test_same_values_under_local_executor(workflow):
    workdir = workflow("reuse")
    snakemake(
        workdir,
        "--executor",
        "local",
        "--cores",
        "2",
        "--config",
        "count=6",
        "sleep=0",
        env={"TOY_LOAD_SECONDS": "0"},
    ).check()
    outputs = _outputs(workdir, 6)
    assert all(value == 21 + i for i, (_, value) in outputs.items())
    # Each job loaded the context in its own process: six processes.
    assert len({pid for pid, _ in outputs.values()}) == 6
