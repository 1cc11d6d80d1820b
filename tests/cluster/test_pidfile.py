"""A pid file names its process by pid, start time and command line: a stale one whose
pid now belongs to an unrelated process makes `down` signal nothing and `up` start."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from snakemake_executor_context.cluster.infofiles import ClusterFiles, identity
from tests.conftest import BIN

pytestmark = pytest.mark.slow


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "snakemake-context"), *args], capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def unrelated():
    """A process of the same user, in a process group of its own (what a stale pid
    file's `down` used to SIGTERM and then SIGKILL the group of)."""
    process = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        yield process
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize("record", ["old format", "pid reused"])
def test_stale_pid_file_down_signals_nothing_and_up_starts(tmp_path, unrelated, record):
    scheduler_file = tmp_path / "ctx" / "scheduler.json"
    files = ClusterFiles(scheduler_file)
    scheduler_file.parent.mkdir()
    scheduler_file.write_text(json.dumps({"address": "tls://127.0.0.1:1"}))
    info: dict = {"pid": unrelated.pid, "address": "tls://127.0.0.1:1", "servers": []}
    if record == "pid reused":  # what the cluster that had this pid recorded
        info |= {
            **identity(unrelated.pid),
            "start_ticks": identity(unrelated.pid)["start_ticks"] - 1,
        }
        info["cmdline"] = [
            "python",
            "-m",
            "snakemake_executor_context.cluster.serve",
            "serve",
        ]
    files.pid_file.write_text(json.dumps(info))

    down = _cli("down", "--scheduler-file", str(scheduler_file))
    assert down.returncode == 0, down.stderr
    assert "No context cluster runs" in down.stdout and "signalled nothing" in down.stdout
    time.sleep(0.3)
    assert unrelated.poll() is None  # alive, its group untouched
    assert psutil.Process(unrelated.pid).status() != psutil.STATUS_ZOMBIE

    files.pid_file.write_text(json.dumps(info))  # stale again, for `up`
    up = _cli("up", "--scheduler-file", str(scheduler_file), "--servers", "1", "--catalog", "none")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "Context cluster up at tls://" in up.stdout
        started = files.read_info()
        assert started is not None and started.pid != unrelated.pid
        assert started.start_ticks == identity(started.pid)["start_ticks"]
    finally:
        down = _cli("down", "--scheduler-file", str(scheduler_file))
    assert "Context cluster stopped" in down.stdout, down.stdout + down.stderr
    assert unrelated.poll() is None
    assert not Path(files.credentials.directory).exists()
