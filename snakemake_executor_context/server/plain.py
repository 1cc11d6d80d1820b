"""A plain job on a server: Snakemake's own job command, forked from the server's
zygote (:mod:`.zygote`) or, for a command it cannot run the same way, a subprocess."""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any

from ..fleet.outcome import Outcome, ServerIdentity
from ..jobspec import JobResult, PlainJobSpec
from ..strays.jobsweep import end_plain_leftovers, plain_environment, tell_job
from ..strays.processes import OWN, kill_process_group
from ..strays.processgroups import GroupRecord, with_parent_death_signal
from .processwide import make_dirs, open_own_file, server_umask
from .running import RunningJob
from .zygote import Zygote, parse_command

__all__ = ["run_plain_job", "warm_zygote"]

_zygote = Zygote()


def run_plain_job(
    spec: PlainJobSpec,
    server: ServerIdentity,
    running: RunningJob,
    groups: GroupRecord | None = None,
) -> JobResult:
    """Run the job's command with its log as stdout and stderr, in a process group of
    its own recorded in ``groups`` (killed if the server dies); end what it left
    running (:mod:`..strays.jobsweep`); report its outcome."""
    started = time.time()
    log_path = os.path.join(spec.workdir, spec.log_path)
    make_dirs(os.path.dirname(log_path))
    parsed = parse_command(spec.command)
    env = plain_environment(spec.key, {**os.environ, **(parsed[0] if parsed else {})})
    if parsed and _zygote.usable(env):
        # Forked by the server's zygote, in a process group of its own (see zygote.py).
        process: Any = _zygote.start(parsed[1], spec.workdir, env, log_path)
    else:
        with open(open_own_file(log_path), "wb") as log, OWN.starting():
            process = subprocess.Popen(
                with_parent_death_signal(spec.command),
                cwd=spec.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                # A group of its own (killed whole if the server dies), in the cluster's
                # session (which a kill of the embedded cluster still reaches).
                process_group=0,
                umask=server_umask(),
            )
            # The server's own while it runs: no sweep takes its exit status.
            OWN.add(process.pid, f"plain:{spec.key}")
    if groups is not None and process.pid:
        groups.add(process.pid)
    try:
        returncode = _wait(process, running)
    finally:
        # What the job left in its group dies with it, as a batch system's job end
        # kills its processes: a failing pipe group left its reader blocked on the
        # FIFO forever (an orphan per run of Snakemake's test_pipes_fail).
        if process.pid:
            kill_process_group(process.pid)
        if groups is not None and process.pid:
            groups.remove(process.pid)
        OWN.release(f"plain:{spec.key}")
        # And what it detached (setsid, double forks) still carries its mark.
        ended = end_plain_leftovers(spec.key).lines("The job", server.describe())
    outcome = Outcome(spec.key, server, ok=returncode == 0, started=started, finished=time.time())
    result = JobResult(outcome, log_path=log_path)
    if running.cancel_requested:
        result.end(f"{spec.title}: cancelled on {server.describe()}.", ok=False, cancelled=True)
    elif returncode != 0:
        result.message = (
            f"{spec.title}: the job's snakemake process exited with status "
            f"{returncode} on {server.describe()}; its log is {log_path}."
        )
    tell_job(result, ended)
    return result


def warm_zygote() -> None:
    """Start this server's zygote now, so that its first plain job finds it ready."""
    _zygote.warm()


def _wait(process: Any, running: RunningJob) -> int:
    if not process.pid:  # the zygote died before it forked the job
        return -1
    running.process = process
    if running.cancel_requested:
        running.kill_process()
    return int(process.wait())
