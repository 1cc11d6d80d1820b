"""How a local cluster starts its servers: forked by multiprocessing's forkserver,
which imported Dask and the server's modules once, or spawned where the forkserver's
socket would not fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from snakemake_executor_context.cluster.plan import start_method

from .conftest import context_run

# Run in a server's own process: the command line of the process that started it.
PARENT_SCRIPT = """
import os
from snakemake_executor_context import load_context

load_context(snakemake)
with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
    parent = f.read().replace(b"\\0", b" ").decode()
with open(snakemake.output[0], "w") as f:
    f.write(parent)
"""


def test_a_short_socket_directory_forks_and_a_long_one_spawns() -> None:
    assert start_method("/tmp/pymp-k2j4h5g6") == "forkserver"
    # 107 bytes is the longest Unix socket path; the listener's name takes 18.
    assert start_method("/" + "d" * 88) == "forkserver"
    assert start_method("/" + "d" * 89) == "spawn"


def _parents(workflow, tmp_path: Path, env: dict[str, str]) -> set[str]:
    workdir = workflow("reuse", f"wf-{len(env)}")
    (workdir / "scripts/use.py").write_text(PARENT_SCRIPT)
    run = context_run(
        workdir, "--context-servers", "2", "--config", "count=4", "sleep=0.5", env=env
    )
    run.check()
    return {(workdir / f"out/{i}.txt").read_text() for i in range(4)}


@pytest.mark.slow
def test_servers_are_forked_from_one_forkserver_unless_its_socket_path_is_too_long(
    workflow, tmp_path: Path
) -> None:
    parents = _parents(workflow, tmp_path, {"TOY_LOAD_SECONDS": "0"})
    assert parents and all("multiprocessing.forkserver" in p for p in parents), parents
    # It imported the servers' own modules once for all of them (Dask's list, which
    # names numpy and the like, is not the one it started with).
    assert all("'snakemake_executor_context.server.plugin'" in p for p in parents), parents
    assert not any("'numpy'" in p for p in parents), parents
    # A temporary directory too deep for a Unix socket's path: the servers are spawned
    # by the cluster's own process, and the run is the same.
    deep = tmp_path / ("t" * 60) / ("u" * 60)
    deep.mkdir(parents=True)
    parents = _parents(workflow, tmp_path, {"TOY_LOAD_SECONDS": "0", "TMPDIR": str(deep)})
    assert parents and all("cluster.serve serve" in p for p in parents), parents
