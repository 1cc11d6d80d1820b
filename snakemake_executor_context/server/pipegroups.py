"""A failing pipe group ends: a fix to Snakemake's shell registry, applied in the job
processes a server forks (:mod:`.zygote`) before Snakemake runs.

Snakemake's local executor (``executors/local.py``, ``run_group_job``, 9.27) runs the
jobs of a pipe group at once, each in a thread, and when one fails it kills the others
with ``shell.kill(jobid)`` and raises; ``shell.kill`` kills only a command already
registered. A member whose thread had not started its command yet (the reader of a
pipe, still formatting its command while the writer failed) starts it afterwards: it
opens the FIFO whose writer is gone, blocks forever, and the executor's shutdown waits
for its thread, so the job's Snakemake never exits (one run in 10-20 of Snakemake's
``test_pipes_fail`` here, with plain ``snakemake --cores 2`` as well). The fix: a job
killed before its command registered has that command killed as it registers.
"""

from __future__ import annotations

import threading
from typing import Any

from ..snakemake_internals import shell_registry

__all__ = ["end_failed_pipe_groups"]


class _Registry(dict[Any, Any]):
    """Snakemake's running shell commands by job id, killing a command that registers
    after its job was killed."""

    def __init__(self, running: dict[Any, Any], killed: set[Any]) -> None:
        super().__init__(running)
        self.killed = killed

    def __setitem__(self, jobid: Any, process: Any) -> None:
        super().__setitem__(jobid, process)
        if jobid in self.killed:
            process.kill()


def end_failed_pipe_groups() -> None:
    """Make ``snakemake.shell.shell.kill(jobid)`` also kill a command of that job
    started later (in this process, for the rest of its life)."""
    shell = shell_registry()
    killed: set[Any] = set()
    lock: threading.Lock = shell._lock
    with lock:
        registry = _Registry(shell._processes, killed)
        shell._processes = registry

    def kill(cls: Any, jobid: Any) -> None:
        with lock:
            killed.add(jobid)
            process = registry.pop(jobid, None)
        if process is not None:
            process.kill()

    shell.kill = classmethod(kill)
