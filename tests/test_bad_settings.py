"""Every bad setting is one clear line at start: it names the setting, the value and
what is allowed, with no traceback from the plugin and no wait: the run exits within
2 s more than `snakemake -n` on the same trivial Snakefile takes on this machine."""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import time
from pathlib import Path

import pytest

from snakemake_executor_context.cluster.credentials import Credentials
from snakemake_executor_context.cluster.process import LocalClusterProcess

from .conftest import BIN, snakemake

pytestmark = pytest.mark.slow

TRIVIAL = 'rule all:\n    output: "a.txt"\n    shell: "touch {output}"\n'
#: What the issue allows on top of `snakemake -n`.
MARGIN = 2.0


@pytest.fixture(scope="module")
def trivial(tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("trivial")
    (workdir / "Snakefile").write_text(TRIVIAL)
    return workdir


@pytest.fixture(scope="module")
def dry_run_seconds(trivial) -> float:
    """How long `snakemake -n` takes here (the median of three)."""
    times = []
    for _ in range(3):
        started = time.monotonic()
        snakemake(trivial, "-n").check()
        times.append(time.monotonic() - started)
    return statistics.median(times)


@pytest.fixture(scope="module")
def credentials(tmp_path_factory) -> Path:
    """Credentials of some cluster (not the one the address names)."""
    return Credentials.generate(tmp_path_factory.mktemp("creds") / "x.tls").directory


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _bad_run(workdir: Path, dry: float, *args: str) -> str:
    started = time.monotonic()
    run = snakemake(workdir, "--executor", "context", "--jobs", "1", *args, timeout=120)
    took = time.monotonic() - started
    assert run.returncode != 0, run.output
    assert "Traceback (most recent call last)" not in run.output, run.output
    assert not (workdir / "a.txt").exists()
    assert took <= dry + MARGIN, f"{took:.1f} s against {dry:.1f} s for -n:\n{run.output}"
    return run.output


def _line(output: str, *parts: str) -> str:
    """The one line that holds every part."""
    lines = [
        line
        for line in output.splitlines()
        if all(part in line for part in parts) and not line.startswith("  Command:")
    ]
    assert len(lines) == 1, (parts, output)
    return lines[0]


@pytest.mark.parametrize(
    ("args", "parts"),
    [
        (
            ["--context-memory-budget", "abc"],
            ["--context-memory-budget 'abc' is not allowed", "(0, 1]", "6GB"],
        ),
        (
            ["--context-memory-budget", "1.5"],
            ["--context-memory-budget '1.5' is not allowed", "(0, 1]"],
        ),
        (["--context-servers", "0"], ["--context-servers 0 is not allowed", "at least 1"]),
        (["--context-servers", "-1"], ["--context-servers -1 is not allowed", "at least 1"]),
        (
            ["--context-scheduler-address", "localhost"],
            ["--context-scheduler-address 'localhost' is not a scheduler address", "tls://"],
        ),
        (
            ["--context-scheduler-address", "tls://127.0.0.1:notaport"],
            ["--context-scheduler-address 'tls://127.0.0.1:notaport'", "allowed: tls://"],
        ),
        (
            ["--context-scheduler-address", "http://127.0.0.1:8786"],
            ["'http://127.0.0.1:8786' is not a scheduler address", "allowed: tls://"],
        ),
        (
            ["--context-scheduler-address", "tcp://127.0.0.1:8786"],
            ["is a plaintext scheduler", "--context-allow-plaintext"],
        ),
        (
            ["--context-scheduler-address", "tls://127.0.0.1:8786"],
            ["needs its cluster's credentials", "--context-credentials"],
        ),
        (
            ["--context-connect-timeout", "0"],
            ["--context-connect-timeout 0", "above 0"],
        ),
    ],
)
def test_bad_setting_is_one_line(trivial, dry_run_seconds, args, parts):
    output = _bad_run(trivial, dry_run_seconds, *args)
    _line(output, *parts)


@pytest.mark.parametrize("scheme", ["tls", "tcp"])
def test_refused_connection_is_one_line_at_once(trivial, dry_run_seconds, credentials, scheme):
    port = _free_port()
    extra = (
        ["--context-credentials", str(credentials)]
        if scheme == "tls"
        else ["--context-allow-plaintext"]
    )
    output = _bad_run(
        trivial,
        dry_run_seconds,
        "--context-scheduler-address",
        f"{scheme}://127.0.0.1:{port}",
        *extra,
    )
    _line(output, "nothing listens at", f"127.0.0.1:{port} (connection refused)")


def test_unreachable_scheduler_is_one_line_at_once(trivial, dry_run_seconds, credentials):
    """A documentation address (RFC 5737): depending on the network, the connection
    hangs, is refused by a router, or is accepted by a proxy that never answers;
    or is taken by a proxy that answers TLS with its own certificate (as in the sandbox
    where this was written); each ends in one line within the probe's 1.5 s."""
    output = _bad_run(
        trivial,
        dry_run_seconds,
        "--context-scheduler-address",
        "tls://203.0.113.9:8786",
        "--context-credentials",
        str(credentials),
    )
    line = _line(output, "--context-scheduler-address", "203.0.113.9:8786")
    assert any(
        words in line
        for words in (
            "cannot reach",
            "did not answer",
            "nothing listens",
            "does not speak TLS",
            "do not match the server",
        )
    ), line


def test_truncated_scheduler_file_is_one_line(trivial, dry_run_seconds, tmp_path):
    scheduler_file = tmp_path / "cut.json"
    scheduler_file.write_text('{"type": "Scheduler", "address": "tls://127.0.')
    output = _bad_run(trivial, dry_run_seconds, "--context-scheduler-file", str(scheduler_file))
    _line(output, f"--context-scheduler-file {scheduler_file} is not a Dask scheduler file")


def test_scheduler_file_of_a_stopped_cluster_is_one_line(trivial, dry_run_seconds, tmp_path):
    """A cluster killed outright leaves its scheduler file and credentials behind."""
    local = LocalClusterProcess.start(
        tmp_path / "gone" / "scheduler.json", servers=1, memory_budget="0.8", timeout=90
    )
    os.killpg(local.pid, signal.SIGKILL)
    assert local.process is not None
    local.process.wait(timeout=10)
    scheduler_file = local.files.scheduler_file
    assert scheduler_file.exists() and local.files.credentials.key_file.exists()
    output = _bad_run(trivial, dry_run_seconds, "--context-scheduler-file", str(scheduler_file))
    _line(output, "nothing listens at", f"The cluster that wrote {scheduler_file} has stopped")


def test_credentials_that_do_not_match_are_one_line(
    trivial, dry_run_seconds, scheduler_file, credentials
):
    address = json.loads(scheduler_file.read_text())["address"]
    output = _bad_run(
        trivial,
        dry_run_seconds,
        "--context-scheduler-address",
        address,
        "--context-credentials",
        str(credentials),
    )
    _line(output, f"the credentials in {credentials} do not match the server at {address}")


@pytest.mark.parametrize(
    ("args", "parts"),
    [
        (["--servers", "0"], ["--servers 0 is not allowed", "at least 1"]),
        (["--servers", "-1"], ["--servers -1 is not allowed", "at least 1"]),
        (["--memory-budget", "abc"], ["--memory-budget 'abc' is not allowed", "6GB"]),
    ],
)
def test_up_with_a_bad_setting_is_one_line(tmp_path, args, parts):
    scheduler_file = tmp_path / "scheduler.json"
    done = subprocess.run(
        [str(BIN / "snakemake-context"), "up", "--scheduler-file", str(scheduler_file), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    _line(done.stderr, "snakemake-context: ", *parts)
    assert not scheduler_file.exists()
