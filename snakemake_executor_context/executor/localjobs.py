"""Plain jobs in Snakemake's own process: which rules run there, and the watchdog
that leaves none of their processes behind.

On the embedded cluster the servers share the machine with Snakemake, so a plain job
(no context, no GPU, not in a group) gains nothing from a server: the executor marks
its rule local at start and Snakemake's own local executor runs it (in threads of
Snakemake's process that start its commands, as under any remote executor), with
local's logs, benchmarks, retries and software deployment.

Snakemake's local executor leaves its jobs' processes running when only its own PID
gets SIGINT or SIGTERM, or when it dies. Here every process in Snakemake's session
below it (the embedded cluster has a session of its own) is stopped: on Ctrl-C by
:meth:`LocalJobs.stop`, on SIGTERM by a thread that sees Snakemake's graceful
shutdown begin, and on Snakemake's death by a watchdog process that snapshots those
processes four times a second and stops them when its pipe from Snakemake closes
without a goodbye, with what Snakemake started since the last snapshot (its orphans:
adopted by the same reaper as the watchdog, in Snakemake's session, younger than it).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from ..jobspec import remove_outputs
from ..snakemake_internals import (
    graceful_shutdown_requested,
    is_local_rule,
    is_run,
    pipe_grouped_rules,
    rule_group,
    rule_has_pipe_or_service_output,
    rule_resource,
    running_jobs,
    shadow_depth,
    workflow_rules,
)
from ..strays.processes import stop_processes
from .jobbuild import output_specs

__all__ = ["LocalJobs", "NoLocalJobs", "local_plain_rules", "run_locally"]

#: Seconds between two snapshots of the watchdog, and between two looks for SIGTERM.
WATCH_SECONDS = 0.25
#: What Snakemake tells the watchdog at a normal end.
BYE = b"bye\n"
#: What the watchdog says after its first snapshot, and how long Snakemake waits for it.
READY = b"ready\n"
READY_SECONDS = 30.0
#: Seconds a stopped process gets between SIGTERM and SIGKILL.
GRACE_SECONDS = 2.0


def run_locally(setting: str | None, embedded: bool) -> bool:
    """Whether plain jobs run in Snakemake's process (``--context-plain-jobs``;
    default: yes on the embedded cluster, no on an attached one)."""
    if setting is None:
        return embedded
    return setting == "local"


def _asks_for(rule: Any, name: str) -> bool:
    """The rule sets resource ``name`` to a non-zero constant or to a function."""
    resource = rule_resource(rule, name)
    return resource is not None and bool(resource.evaluable or resource.value)


def local_plain_rules(workflow: Any) -> list[str]:
    """Rules whose jobs can run locally: no context, no GPU, no ``runtime`` limit, no
    group (a ``group:``, ``--groups``, or the pipe groups found in the DAG), not local
    already, and neither ``shadow:`` nor ``run:``. Under a remote executor Snakemake runs
    local jobs in threads of its own process, where a shadow job's chdir would move them
    all and a ``run:`` block's Python cannot be stopped (Ctrl-C would wait for it); and
    its local execution does not enforce ``runtime``, which servers do."""
    grouped = pipe_grouped_rules(workflow)
    names = []
    for rule in workflow_rules(workflow):
        if (
            is_local_rule(workflow, rule)
            or rule_group(rule) is not None
            or shadow_depth(rule)
            or is_run(rule)
            or rule.name in grouped
            or _asks_for(rule, "context")
            or _asks_for(rule, "gpu")
            or _asks_for(rule, "runtime")
            or rule_has_pipe_or_service_output(rule)
        ):
            continue
        names.append(rule.name)
    return names


def _below(root: int, skip: set[int]) -> list[Any]:
    """Processes below ``root`` in its session (not the embedded cluster, which has a
    session of its own, nor ``skip``)."""
    import psutil

    try:
        session = os.getsid(root)
        found = psutil.Process(root).children(recursive=True)
    except (psutil.Error, OSError):
        return []
    below = []
    for process in found:
        try:
            if process.pid not in skip and os.getsid(process.pid) == session:
                below.append(process)
        except OSError:
            continue
    return below


def _stop(processes: list[Any]) -> None:
    """SIGTERM, then SIGKILL for those alive after the grace period. Never reaped
    here: in Snakemake's process they are its local jobs' children, whose exit status
    Snakemake reads (a reaped one would read as 0, the killed job as a success)."""
    stop_processes(processes, GRACE_SECONDS, reap=False)


class NoLocalJobs:
    """No plain job runs locally: nothing to stop."""

    def stop(self) -> None:
        """Nothing to stop."""

    def close(self) -> None:
        """Nothing to close."""


class LocalJobs:
    """The local plain jobs of one run: the watchdog, and stopping their processes."""

    def __init__(self, workflow: Any) -> None:
        self.workflow = workflow
        self._done = threading.Event()
        self.watchdog = subprocess.Popen(
            [sys.executable, "-m", __name__, str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        # No job starts before the watchdog's first snapshot: on a loaded node its
        # start takes seconds, and a Snakemake killed before it would leave its jobs.
        assert self.watchdog.stdout is not None
        if select.select([self.watchdog.stdout], [], [], READY_SECONDS)[0]:
            self.watchdog.stdout.readline()
        self._sigterm = threading.Thread(
            target=self._watch_sigterm, name="context-sigterm", daemon=True
        )
        self._sigterm.start()

    def stop(self) -> None:
        """Ctrl-C: stop every process the local jobs started, remove their outputs
        (Snakemake's scheduler, interrupted, no longer does)."""
        self._stop_processes()
        for job in running_jobs(self.workflow):
            if job.is_local and not job.is_group():
                remove_outputs(output_specs(job))

    def _stop_processes(self) -> None:
        _stop(_below(os.getpid(), {self.watchdog.pid}))

    def _watch_sigterm(self) -> None:
        # Snakemake's SIGTERM handler (set after the executor starts) only flags a
        # graceful shutdown, which would wait for the local jobs to finish.
        while not self._done.wait(WATCH_SECONDS):
            if graceful_shutdown_requested(self.workflow):
                self._stop_processes()  # their jobs fail: Snakemake removes the outputs
                return

    def close(self) -> None:
        """The run is over (its jobs ended or were stopped): the watchdog exits, and
        leaves alone what a job started on purpose to outlive it."""
        self._done.set()
        # A stop begun on SIGTERM ends first: the jobs it stopped end the run, and
        # Snakemake's exit would otherwise cut it short (a daemon thread) after the
        # watchdog had its goodbye, leaving the processes not yet signalled.
        self._sigterm.join(timeout=GRACE_SECONDS + 5)
        if self.watchdog.stdin is not None:
            with contextlib.suppress(OSError):
                self.watchdog.stdin.write(BYE)
            with contextlib.suppress(OSError):
                self.watchdog.stdin.close()
        try:
            self.watchdog.wait(timeout=GRACE_SECONDS + 5)
        except subprocess.TimeoutExpired:
            self.watchdog.kill()
        if self.watchdog.stdout is not None:
            self.watchdog.stdout.close()


def _watchdog() -> None:
    """Snapshot the processes below Snakemake; stop them once its pipe closes without
    a goodbye (Snakemake died)."""
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, signal.SIG_IGN)  # a terminal's Ctrl-C reaches us too
    import psutil

    parent, me = int(sys.argv[1]), os.getpid()
    try:
        session, born = os.getsid(parent), psutil.Process(parent).create_time()
    except (OSError, psutil.Error):
        return  # Snakemake is gone already: it started no job
    seen: dict[int, Any] = {}
    said_ready = False
    while os.getppid() == parent:
        current = _below(parent, {me})
        seen = {pid: p for pid, p in seen.items() if _running(p)}
        seen.update((p.pid, p) for p in current)
        if not said_ready:
            said_ready = True
            with contextlib.suppress(OSError):
                os.write(sys.stdout.fileno(), READY)
        readable, _, _ = select.select([sys.stdin.buffer], [], [], WATCH_SECONDS)
        if readable:
            data = os.read(sys.stdin.fileno(), 4096)
            if BYE.strip() in data:
                return
            if not data:
                break
    seen.update((p.pid, p) for p in _orphans(parent, session, born, me))
    _stop([p for p in seen.values() if _running(p)])


def _orphans(parent: int, session: int, born: float, me: int) -> list[Any]:
    """What a dead Snakemake started since the last snapshot (on a loaded node a
    snapshot can take longer than a job's start): its children, adopted now by the
    same reaper as this watchdog, in its session and younger than it, and everything
    below them."""
    import psutil

    deadline = time.monotonic() + 2.0
    while os.getppid() == parent and time.monotonic() < deadline:
        time.sleep(0.01)  # the kernel reparents the children after closing the pipe
    reaper = os.getppid()
    if reaper == parent:
        return []
    found = []
    for process in psutil.process_iter(["ppid", "create_time"]):
        with contextlib.suppress(OSError, psutil.Error):
            if (
                process.pid != me
                and process.info["ppid"] == reaper
                and process.info["create_time"] >= born
                and os.getsid(process.pid) == session
            ):
                found += [process, *process.children(recursive=True)]
    return found


def _running(process: Any) -> bool:
    import psutil

    try:
        return bool(process.is_running())  # compares start times: a reused PID is not it
    except psutil.Error:
        return False


if __name__ == "__main__":
    _watchdog()
