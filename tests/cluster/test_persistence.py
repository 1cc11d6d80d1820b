"""A persistent cluster (`snakemake-context up`) keeps contexts warm across runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import psutil
import pytest

from tests.conftest import BIN, context_run, persistent_cluster, plain_dask_cluster

pytestmark = pytest.mark.slow


def _status(scheduler_file) -> dict:
    out = subprocess.run(
        [
            str(BIN / "snakemake-context"),
            "status",
            "--scheduler-file",
            str(scheduler_file),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout)["servers"]


def _published_demand(scheduler_file) -> object:
    from snakemake_executor_context.cluster.connection import ClusterConnection
    from snakemake_executor_context.defaults import DEMAND_KEY

    target = ClusterConnection.attach(address=None, scheduler_file=scheduler_file, timeout=20)
    try:
        return target.client.get_metadata(DEMAND_KEY, default=None)
    finally:
        target.client.close()


def test_second_run_loads_nothing(workflow, scheduler_file):
    workdir = workflow("reuse")
    attach = ["--context-scheduler-file", str(scheduler_file), "--config", "count=8"]

    first = context_run(workdir, *attach).check()
    assert len(list((workdir / "out").glob("*.txt"))) == 8
    # Nothing was written where the cluster was started but the cluster's own files
    # (its catalog among them: the cluster, not the run, writes it).
    names = {p.name for p in scheduler_file.parent.iterdir()}
    assert {"scheduler.json", "scheduler.log", "scheduler.pid", "scheduler.db"} <= names
    assert names <= {
        "scheduler.tls",
        "scheduler.json",
        "scheduler.log",
        "scheduler.pid",
        "scheduler.db",
        "scheduler.db-wal",
        "scheduler.db-shm",
        "scheduler.db.writer",  # the cluster's writer lease on its catalog
    }
    assert not (workdir / ".snakemake" / "context" / "catalog.db").exists()
    loads_after_first = sum(inv["loads"] for inv in _status(scheduler_file).values())
    # The run withdrew what it asked of a pool of pilots: a pool attached to this cluster
    # would otherwise hold, and replace, pilots for the run's last demand.
    assert _published_demand(scheduler_file) == {}
    assert 1 <= loads_after_first <= 2

    second = context_run(workdir, *attach, "--forcerun", "use").check()
    assert "8 of 9 steps" in second.output or "9 of 9 steps" in second.output
    servers = _status(scheduler_file)
    assert sum(inv["loads"] for inv in servers.values()) == loads_after_first
    (summary,) = [s for s in second.summaries() if s["run_id"] != first.summaries()[0]["run_id"]]
    assert summary["jobs"] and all(not job["loaded"] for job in summary["jobs"])
    assert all(job["reused"] for job in summary["jobs"])


def test_down_stops_every_process(tmp_path):
    path = tmp_path / "c" / "scheduler.json"
    up = subprocess.run(
        [str(BIN / "snakemake-context"), "up", "--scheduler-file", str(path), "--servers", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert up.returncode == 0, up.stderr
    pid = json.loads(path.with_suffix(".pid").read_text())["pid"]
    import psutil

    tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    assert len(tree) >= 2
    down = subprocess.run(
        [str(BIN / "snakemake-context"), "down", "--scheduler-file", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert down.returncode == 0, down.stderr
    _, alive = psutil.wait_procs(tree, timeout=10)
    assert not alive
    assert not path.exists() and path.with_suffix(".log").exists()


def test_a_refused_up_leaves_its_directory_as_it_was(tmp_path):
    """A refusal found once the catalog is made (here a planted log file, refused where
    the cluster's files are prepared) takes the catalog it made with it."""
    directory = tmp_path / "c"
    directory.mkdir()
    (directory / "s.log").symlink_to(tmp_path / "theirs.log")
    up = subprocess.run(
        [str(BIN / "snakemake-context"), "up", "--scheduler-file", str(directory / "s.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert up.returncode == 1 and up.stderr.count("\n") == 1, up.stderr
    assert [p.name for p in directory.iterdir()] == ["s.log"]


def test_down_removes_the_writers_lease_of_a_cluster_that_did_not_end_itself(tmp_path):
    """`down` of a cluster killed before its hub let go of the catalog (as `down` kills
    one that does not end in time) removes the lease it left."""
    with persistent_cluster(tmp_path / "c", "--servers", "1") as path:
        lease = path.with_suffix(".db.writer")
        assert lease.exists()
        cluster = psutil.Process(json.loads(path.with_suffix(".pid").read_text())["pid"])
        os.kill(cluster.pid, signal.SIGKILL)
        cluster.wait(10)
        down = subprocess.run(
            [str(BIN / "snakemake-context"), "down", "--scheduler-file", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert down.returncode == 0, down.stderr
        assert not lease.exists()
        assert path.with_suffix(".db").exists()


def test_any_dask_cluster_with_resources_works(workflow, tmp_path):
    """Servers need not be started by this plugin: a plain `dask worker` that
    advertises gpu and mem_mb becomes a context server on first use."""
    workdir = workflow("reuse")
    with plain_dask_cluster(tmp_path, "--resources", "gpu=1,mem_mb=4000") as scheduler:
        run = context_run(
            workdir,
            "--context-scheduler-file",
            str(scheduler),
            "--context-allow-plaintext",
            "--config",
            "count=4",
            env={"TOY_LOAD_SECONDS": "0"},
        ).check()
    # A plaintext scheduler is accepted only when asked, and said once.
    assert run.output.count("Attaching to the plaintext scheduler") == 1, run.output
    (summary,) = run.summaries()
    (server,) = summary["servers"].values()
    assert server["loads"] == 1 and server["jobs"] == 4
