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
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
#: Tests that share one machine-wide service run in one test process, in turn (pytest-
#: xdist's loadgroup): those that use the single-node SLURM or Grid Engine (the
#: fixtures below start the daemons once; their tests count the queue's jobs), and the
#: files of the PostgreSQL database's tests.
SHARED_SERVICES = {
    "test_catalog_postgres.py": "postgres",
    "test_catalog_migrations.py": "postgres",
}
WORKFLOWS = TESTS / "workflows"
REPO = TESTS.parent


def bench_module(name: str):
    """A module of ``workflows/bench/`` (the paper's apparatus lives there, beside the
    benchmarks that call it), imported by file."""
    import importlib.util

    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "workflows/bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up while made
    spec.loader.exec_module(module)
    return module


BIN = Path(sys.executable).parent


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (pyproject.toml): one test process per core and one more, at most 5.
    The SLURM and Grid Engine groups spend minutes waiting on their queues in one
    process each; the extra one keeps the cores busy meanwhile. Two more were slower
    on 2 cores (tests 1,433 s against 1,068 s: the model tests, which go first, then
    load SmolLM2 four at a time) and made tests fail that wait on a server in time."""
    return min((os.cpu_count() or 1) + 1, 5)


def busy_loops() -> int:
    """How many CPU-bound busy loops a test "under load" starts beside what it tests:
    one per core when it runs alone; one among parallel test processes, which keep
    the cores loaded themselves (more would only slow the tests beside it)."""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        return 1
    return os.cpu_count() or 1


# First: xdist's own hook reads the xdist_group markers set here.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test joins the group of what it shares: a batch system it uses (SLURM,
    Grid Engine), the PostgreSQL database, or a module-scoped fixture of its file (a
    loaded model, a persistent cluster: made once, in one process, as without
    xdist). The batch systems' groups (minutes each, in one process) and the groups
    and tests that load the real model go first, so that the processes end together."""
    groups: dict[str, str | None] = {}
    for item in items:
        groups[item.nodeid] = _group(item)
        if groups[item.nodeid] is not None:
            item.add_marker(pytest.mark.xdist_group(groups[item.nodeid]))
    with_model = {groups[item.nodeid] for item in items if item.get_closest_marker("model")}

    def rank(item: pytest.Item) -> int:
        group = groups[item.nodeid]
        if group in ("slurm", "sge"):
            return 0
        return 1 if item.get_closest_marker("model") or group in with_model else 2

    items.sort(key=rank)  # stable: each file's tests keep their order


def _group(item: pytest.Item) -> str | None:
    fixtures = getattr(item, "fixturenames", ())
    for service in ("slurm", "sge"):
        if service in fixtures:
            return service
    callspec = getattr(item, "callspec", None)
    if "batch" in fixtures and callspec is not None:  # a scenario on either system
        return str(callspec.params["batch"])
    if item.path.name in SHARED_SERVICES:
        return SHARED_SERVICES[item.path.name]
    info = getattr(item, "_fixtureinfo", None)
    definitions = info.name2fixturedefs.values() if info is not None else ()
    if any(d.scope == "module" for defs in definitions for d in defs):
        return f"module-{item.path.stem}"
    return None


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
    """Run the real snakemake CLI in ``workdir`` (output captured, a clean environment,
    SIGINT as in a terminal: the local executor's scripts inherit it)."""
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
        preexec_fn=default_sigint,
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
def persistent_cluster(
    cluster_dir: Path, *up_args: str, preexec_fn: Callable[[], None] | None = None
) -> Iterator[Path]:
    """`snakemake-context up` in ``cluster_dir`` with ``up_args`` (``preexec_fn`` run in
    its process before exec); down afterwards."""
    cluster_dir.mkdir(parents=True, exist_ok=True)
    path = cluster_dir / "scheduler.json"
    started = subprocess.run(
        [str(BIN / "snakemake-context"), "up", "--scheduler-file", str(path), *up_args],
        cwd=cluster_dir,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=preexec_fn,
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


@contextlib.contextmanager
def shared_cluster(*up_args: str, preexec_fn: Callable[[], None] | None = None) -> Iterator[Path]:
    """:func:`persistent_cluster` in a new directory others may read (0755, as a
    scratch directory may be: the cluster's own files must protect themselves, and a
    second user can reach what it may), removed afterwards."""
    shared = Path(tempfile.mkdtemp(prefix="ctx-shared-"))
    os.chmod(shared, 0o755)
    try:
        with persistent_cluster(shared, *up_args, preexec_fn=preexec_fn) as path:
            yield path
    finally:
        shutil.rmtree(shared, ignore_errors=True)


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


def toy_files(rules: str, files: dict[str, str] | None = None) -> dict[str, str]:
    """The files of a small workflow on the toy context: a Snakefile that declares it
    (HEADER) before ``rules`` (dedented), its loader (TOY_LOADER) and the script most
    rules run (``scripts/use.py``, TOY_SCRIPT); ``files`` adds others or replaces these."""
    return {
        "Snakefile": HEADER + textwrap.dedent(rules),
        "loader.py": TOY_LOADER,
        "scripts/use.py": TOY_SCRIPT,
        **(files or {}),
    }


@pytest.fixture
def toy_workflow(make_workflow):
    """Write a toy workflow (``toy_files``) into a fresh directory; returns the directory."""

    def make(rules: str, files: dict[str, str] | None = None, name: str | None = None) -> Path:
        return make_workflow(toy_files(rules, files), name=name)

    return make


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


def fake_commands(directory: Path, script: str, names: Iterable[str]) -> Path:
    """``directory`` holding an executable shell ``script`` under each of ``names``
    (fake batch-system commands), to put first on PATH."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = directory / name
        path.write_text("#!/bin/sh\n" + textwrap.dedent(script))
        path.chmod(0o755)
    return directory


@pytest.fixture
def batch_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every batch system's client commands first on PATH, each a fake that exits 0
    and says nothing: a pool's job is checked and its script made, nothing submitted."""
    from snakemake_executor_context.pilots.batch.registry import BACKENDS

    names = {name for system in BACKENDS.values() for name in system.commands()}
    directory = fake_commands(tmp_path / "batch-bin", "exit 0\n", sorted(names))
    monkeypatch.setenv("PATH", f"{directory}{os.pathsep}{os.environ.get('PATH', '')}")
    return directory


def _queued(command: list[str]) -> list[str]:
    """The lines a queue listing prints (none when the command fails)."""
    listed = subprocess.run(command, capture_output=True, text=True)
    return listed.stdout.split() if listed.returncode == 0 else []


@pytest.fixture(scope="session")
def slurm() -> Iterator[None]:
    """A running single-node SLURM (``tests/slurm/slurm-up.sh``), shared by the tests
    of this process that use it, stopped at the end unless it already ran."""
    from tests.batchpools import batch_system

    yield from batch_system(
        "slurm",
        TESTS / "slurm",
        "/run/slurmctld.pid",
        "slurmctld",
        "SNAKEMAKE_CONTEXT_REQUIRE_SLURM",
        lambda: _queued(["squeue", "-h", "-n", "snakemake-context", "-o", "%i"]),
    )


@pytest.fixture(scope="session")
def sge() -> Iterator[None]:
    """A running single-node Grid Engine (``tests/sge/sge-up.sh``), shared by the
    tests of this process that use it, stopped at the end unless it already ran."""
    from tests.batchpools import batch_system

    yield from batch_system(
        "sge",
        TESTS / "sge",
        "/var/spool/gridengine/qmaster/qmaster.pid",
        "sge_qmaster",
        "SNAKEMAKE_CONTEXT_REQUIRE_SGE",
        lambda: _queued(["qstat", "-u", "*"]),
    )


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
