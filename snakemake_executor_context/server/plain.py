"""A plain job on a server: Snakemake's own job command, as a subprocess."""

from __future__ import annotations

import os
import subprocess
import time

from ..jobspec import JobResult, PlainJobSpec, ServerIdentity
from .pgroups import GroupRecord, with_parent_death_signal
from .running import RunningJob

__all__ = ["run_plain_job"]


def run_plain_job(
    spec: PlainJobSpec,
    server: ServerIdentity,
    running: RunningJob,
    groups: GroupRecord | None = None,
) -> JobResult:
    """Run the job's command with its log as stdout and stderr, in a process group of
    its own recorded in ``groups`` (killed if the server dies); report its outcome."""
    started = time.time()
    log_path = os.path.join(spec.workdir, spec.log_path)
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            with_parent_death_signal(spec.command),
            cwd=spec.workdir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            # A group of its own (killed whole if the server dies), in the cluster's
            # session (which a kill of the embedded cluster still reaches).
            process_group=0,
        )
        if groups is not None:
            groups.add(process.pid)
        running.process = process
        if running.cancel_requested:
            running.kill_process()
        returncode = process.wait()
        if groups is not None:
            groups.remove(process.pid)
    result = JobResult(
        key=spec.key,
        ok=returncode == 0,
        server=server,
        started=started,
        finished=time.time(),
        log_path=log_path,
    )
    if running.cancel_requested:
        result.ok, result.cancelled = False, True
        result.message = f"{spec.title}: cancelled on {server.describe()}."
    elif returncode != 0:
        result.message = (
            f"{spec.title}: the job's snakemake process exited with status "
            f"{returncode} on {server.describe()}; its log is {log_path}."
        )
    return result
