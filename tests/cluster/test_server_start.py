"""How a local cluster starts its servers: forked by multiprocessing's forkserver,
itself a fork of the cluster's process once that imported Dask and the server's
modules, or spawned where the forkserver's socket would not fit; many servers with
no zygote each and timeouts that grow with their count."""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil
import pytest

from snakemake_executor_context.cluster.plan import (
    connect_timeout,
    start_method,
    start_wait,
    warm_zygotes,
)
from tests.conftest import context_run, persistent_cluster

# Run in a server's own process: the pid and command line of the process that started
# it, and of that one's parent.
PARENT_SCRIPT = """
import os
from snakemake_executor_context import load_context

load_context(snakemake)
parent = os.getppid()
with open(f"/proc/{parent}/stat") as f:
    grandparent = int(f.read().rpartition(")")[2].split()[1])
lines = []
for pid in (parent, grandparent):
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        lines.append(f"{pid} " + f.read().replace(b"\\0", b" ").decode())
with open(snakemake.output[0], "w") as f:
    f.write("\\n".join(lines))
"""


def test_a_short_socket_directory_forks_and_a_long_one_spawns() -> None:
    assert start_method("/tmp/pymp-k2j4h5g6") == "forkserver"
    # 107 bytes is the longest Unix socket path; the listener's name takes 18.
    assert start_method("/" + "d" * 88) == "forkserver"
    assert start_method("/" + "d" * 89) == "spawn"


def test_many_servers_wait_longer_and_start_no_zygote_each() -> None:
    # 128 servers on 2 cores: their zygotes held both cores, and Dask's 30 s connects
    # and the 120 s wait of `up` ran out.
    assert not warm_zygotes(128, 2) and not warm_zygotes(9, 2)
    assert warm_zygotes(8, 2) and warm_zygotes(2, 2) and warm_zygotes(128, 32)
    assert connect_timeout(2) == connect_timeout(60) == 30.0  # Dask's own
    # A connection's first attempt (a fifth) outlasts the start's queue of handshakes.
    assert connect_timeout(128) / 5 >= 0.1 * 128
    # The wait grows past the embedded run's 60 s and `up`'s 120 s.
    assert start_wait(128, 60.0) > 120.0 and start_wait(512, 120.0) >= 256
    # A few servers: the setting as given (`up --timeout`, the embedded run's 60 s).
    assert start_wait(2, 120.0) == 120.0 and start_wait(None, 60.0) == 62.0
    assert start_wait(2, 3600.0) == 3600.0


def test_more_servers_than_four_a_core_start_without_zygotes(tmp_path: Path) -> None:
    servers = 4 * (os.cpu_count() or 1) + 1
    if servers > 33:
        pytest.skip(f"{servers} servers: too many for a quick test")
    with persistent_cluster(tmp_path / "c", "--servers", str(servers)) as path:
        info = json.loads(path.with_suffix(".pid").read_text())
        pid = info["pid"]
        assert len(info["servers"]) == servers
        tree = psutil.Process(pid).children(recursive=True)
        zygotes = [p for p in tree if "server.zygote" in " ".join(p.cmdline())]
        assert not zygotes, [p.pid for p in zygotes]


def _parents(workflow, tmp_path: Path, env: dict[str, str]) -> set[tuple[str, str]]:
    """The process each server was started by, and that one's parent (pid, command)."""
    workdir = workflow("reuse", f"wf-{len(env)}")
    (workdir / "scripts/use.py").write_text(PARENT_SCRIPT)
    run = context_run(
        workdir, "--context-servers", "2", "--config", "count=4", "sleep=0.5", env=env
    )
    run.check()
    return {tuple((workdir / f"out/{i}.txt").read_text().split("\n")) for i in range(4)}


@pytest.mark.slow
def test_servers_are_forked_from_one_forkserver_unless_its_socket_path_is_too_long(
    workflow, tmp_path: Path
) -> None:
    # One forkserver for both servers, itself a fork of the cluster's process (same
    # command line, its child), which had imported what a server needs: no interpreter
    # of its own importing Dask again.
    pairs = _parents(workflow, tmp_path, {"TOY_LOAD_SECONDS": "0"})
    assert len({parent for parent, _ in pairs}) == 1, pairs
    ((forkserver, cluster),) = {pair for pair in pairs}
    assert "cluster.serve serve" in cluster, cluster
    assert forkserver.partition(" ")[2] == cluster.partition(" ")[2], (forkserver, cluster)
    # A temporary directory too deep for a Unix socket's path: the servers are spawned
    # by the cluster's own process, and the run is the same.
    deep = tmp_path / ("t" * 60) / ("u" * 60)
    deep.mkdir(parents=True)
    pairs = _parents(workflow, tmp_path, {"TOY_LOAD_SECONDS": "0", "TMPDIR": str(deep)})
    assert pairs and all("cluster.serve serve" in parent for parent, _ in pairs), pairs
    assert all("cluster.serve" not in grandparent for _, grandparent in pairs), pairs
