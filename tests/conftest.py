"""Shared fixtures: copies of the test workflows, and the real snakemake command line."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
#: Tests that share one machine-wide service run in one test process, in turn (pytest-
#: xdist's loadgroup): the single-node SLURM and Grid Engine (their fixtures start and
#: stop the daemons, their tests count the queue's jobs) and the PostgreSQL database.
SHARED_SERVICES = {
    "test_slurm.py": "slurm",
    "test_sge.py": "sge",
    "test_catalog_postgres.py": "postgres",
    "test_catalog_migrations.py": "postgres",
}
WORKFLOWS = TESTS / "workflows"
REPO = TESTS.parent
BIN = Path(sys.executable).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test of a shared service's files joins that service's group."""
    for item in items:
        group = SHARED_SERVICES.get(item.path.name)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def default_sigint() -> None:
    """In a child, before exec: SIGINT does what it does in a terminal (a background
    job of a non-interactive shell, such as CI's, starts with SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@dataclass
class Run:
    """The outcome of one snakemake command line."""

    returncode: int
    output: str
    workdir: Path

    def check(self) -> Run:
        assert self.returncode == 0, f"snakemake failed ({self.returncode}):\n{self.output}"
        return self

    def summaries(self) -> list[dict]:
        """The executor's run summaries, oldest first."""
        runs = sorted((self.workdir / ".snakemake" / "context" / "runs").glob("*.json"))
        return [json.loads(path.read_text()) for path in runs]


def snakemake(workdir: Path, *args: str, timeout: float = 300, env: dict | None = None) -> Run:
    """Run the real snakemake CLI in ``workdir`` (output captured, a clean environment)."""
    environment = dict(os.environ)
    environment.update({"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"})
    environment.update(env or {})
    process = subprocess.Popen(
        [str(BIN / "snakemake"), *args],
        cwd=workdir,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        raise AssertionError(f"snakemake timed out after {timeout} s:\n{output}") from None
    return Run(process.returncode, output, workdir)


def context_run(workdir: Path, *args: str, **kwargs) -> Run:
    """snakemake --executor context with a small embedded cluster."""
    return snakemake(workdir, "--executor", "context", "--jobs", "4", *args, **kwargs)


@pytest.fixture
def workflow(tmp_path: Path):
    """Copy a workflow from tests/workflows into a fresh directory."""

    def copy(name: str, dest: str | None = None) -> Path:
        target = tmp_path / (dest or name)
        shutil.copytree(WORKFLOWS / name, target)
        return target

    return copy


@contextlib.contextmanager
def persistent_cluster(cluster_dir: Path, *up_args: str) -> Iterator[Path]:
    """`snakemake-context up` in ``cluster_dir`` with ``up_args``; down afterwards."""
    cluster_dir.mkdir(parents=True, exist_ok=True)
    path = cluster_dir / "scheduler.json"
    started = subprocess.run(
        [str(BIN / "snakemake-context"), "up", "--scheduler-file", str(path), *up_args],
        cwd=cluster_dir,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        yield path
    finally:
        subprocess.run(
            [str(BIN / "snakemake-context"), "down", "--scheduler-file", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )


@pytest.fixture
def scheduler_file(tmp_path: Path) -> Iterator[Path]:
    """A persistent cluster started with `snakemake-context up`, stopped afterwards."""
    with persistent_cluster(tmp_path / "elsewhere", "--servers", "2") as path:
        yield path


@pytest.fixture
def make_workflow(tmp_path: Path):
    """Write a small workflow from file contents: {"Snakefile": "...", ...}."""
    counter = iter(range(1000))

    def make(files: dict[str, str], name: str | None = None) -> Path:
        target = tmp_path / (name or f"wf{next(counter)}")
        for relative, content in files.items():
            path = target / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
        return target

    return make


#: A loader file and a script most small test workflows share.
TOY_LOADER = """
import os

def load(value=1):
    return {"value": value, "pid": os.getpid()}
"""
TOY_SCRIPT = """
from snakemake_executor_context import load_context

obj = load_context(snakemake)
with open(snakemake.output[0], "w") as f:
    f.write(str(obj["value"]))
"""
HEADER = """
from snakemake_executor_context import declare_context

declare_context(config, "toy", "loader.py:load", value=5)
"""


@contextlib.contextmanager
def plain_dask_cluster(directory: Path, *worker_args: str) -> Iterator[Path]:
    """`dask scheduler` and one `dask worker` (not started by this plugin)."""
    scheduler = directory / "plain-dask.json"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "distributed.cli.dask_scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--scheduler-file",
                str(scheduler),
                "--no-dashboard",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    ]
    try:
        for _ in range(300):
            if scheduler.exists():
                break
            time.sleep(0.1)
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "distributed.cli.dask_worker",
                    "--scheduler-file",
                    str(scheduler),
                    "--nthreads",
                    "1",
                    "--no-dashboard",
                    *worker_args,
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        from distributed import Client

        with Client(scheduler_file=str(scheduler), timeout=30) as client:
            client.wait_for_workers(1, timeout=60)
        yield scheduler
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)


ATTACKER = "ctxattacker"
REQUIRE_SECOND_USER = "SNAKEMAKE_CONTEXT_REQUIRE_SECOND_USER"


def need_second_user() -> int:
    """The second user's uid (created when missing); skips, or fails where CI
    requires it, without root."""
    reason = None
    if os.geteuid() != 0:
        reason = "the second-user tests need root (to create a user and hand it files)"
    elif shutil.which("useradd") is None:
        reason = "useradd is missing"
    if reason:
        if os.environ.get(REQUIRE_SECOND_USER) == "1":
            pytest.fail(f"{REQUIRE_SECOND_USER}=1 but {reason}")
        pytest.skip(reason)
    if subprocess.run(["id", ATTACKER], capture_output=True).returncode != 0:
        made = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", ATTACKER],
            capture_output=True,
            text=True,
        )
        # 9: the name is taken (the other test process made it in the meantime).
        assert made.returncode in (0, 9), made.stderr
    return pwd.getpwnam(ATTACKER).pw_uid
