"""A cluster across the bed's nodes: ``snakemake-context up --servers 0`` on the host,
listening on the bed's bridge, and ``snakemake-context join`` on each node; the
workflows and ``$HOME`` in the bed's shared directory, as on a cluster."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import BIN
from tests.nodes.bed import Bed, Node

COMMAND = str(BIN / "snakemake-context")


@dataclass
class Joined:
    """The cluster: its scheduler file, and each node's join process."""

    bed: Bed
    scheduler_file: Path
    joins: dict[int, subprocess.Popen[str]] = field(default_factory=dict)
    #: What each node's join printed (read on, so that its pipe never fills).
    said: dict[int, list[str]] = field(default_factory=dict)
    #: Runs a test started in the background: killed at the end if still running.
    runs: list[subprocess.Popen[str]] = field(default_factory=list)

    def join(self, node: Node, *args: str, timeout: float = 90, **env: str) -> str:
        """Join ``node`` (``args``: join's flags; ``env``: variables it gets); its first
        line, once it has joined."""
        process = node.popen(
            [COMMAND, "join", "--scheduler-file", str(self.scheduler_file), *args],
            env=self.bed.environment(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.joins[node.index] = process
        assert process.stdout is not None
        deadline = time.monotonic() + timeout
        lines = []
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                break
            lines.append(line)
            if " joined " in line:
                self.said[node.index] = lines
                threading.Thread(target=lines.extend, args=(process.stdout,), daemon=True).start()
                return line
        raise AssertionError(f"{node.hostname} did not join:\n{''.join(lines)}")

    def status(self) -> dict:
        """``snakemake-context status --json``, read on the host."""
        done = subprocess.run(
            [COMMAND, "status", "--scheduler-file", str(self.scheduler_file), "--json"],
            env=self.bed.environment(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)

    def server_names(self) -> set[str]:
        """The names of the servers the scheduler has now."""
        return {s["server"]["name"] for s in self.status()["servers"].values()}

    def wait_for(self, names: set[str], timeout: float = 90) -> None:
        """Until the scheduler has exactly the servers ``names``."""
        deadline = time.monotonic() + timeout
        while (found := self.server_names()) != names:
            assert time.monotonic() < deadline, f"servers {found}, not {names}"
            time.sleep(0.5)

    def leave(self, node: Node, timeout: float = 60) -> str:
        """SIGTERM ``node``'s join (it drains); what it printed."""
        process = self.joins.pop(node.index)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=timeout)
        time.sleep(0.2)  # its last lines
        return "".join(self.said[node.index])


@contextlib.contextmanager
def joined_cluster(bed: Bed, *up_args: str) -> Iterator[Joined]:
    """``up --servers 0 --interface <bridge>`` on the host; down (and every join
    ended) afterwards."""
    scheduler_file = bed.shared / "cluster" / "scheduler.json"
    started = subprocess.run(
        [COMMAND, "up", "--scheduler-file", str(scheduler_file), "--servers", "0",
         "--interface", bed.bridge, *up_args],
        env=bed.environment(),
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr
    cluster = Joined(bed, scheduler_file)
    try:
        yield cluster
    finally:
        for run in cluster.runs:
            if run.poll() is None:
                run.kill()
                run.communicate()
        for process in cluster.joins.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in cluster.joins.values():
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        subprocess.run(
            [COMMAND, "down", "--scheduler-file", str(scheduler_file)],
            env=bed.environment(),
            capture_output=True,
            timeout=60,
        )
