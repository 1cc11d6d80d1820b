"""Process work, written once: whether a pid lives, and stopping a process tree.

Every part of the project that ends processes goes through here: a server stopping a
plain job's tree, the zygote killing the jobs it forked, the executor stopping local
jobs, the cluster process killing what is left below it, the catalog's lease and the
cluster's pid file asking whether their process still runs. Standard library at
import time; ``psutil`` when a tree is walked.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

__all__ = ["pid_alive", "process_tree", "stop_processes", "stop_tree"]


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not count; another user's does)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def process_tree(pid: int) -> list[Any]:
    """Process ``pid`` and all its descendants (``psutil.Process``, descendants
    first); empty when it is gone."""
    import psutil

    try:
        root = psutil.Process(pid)
        return [*root.children(recursive=True), root]
    except psutil.Error:
        return []


def stop_processes(processes: Iterable[Any], grace: float, *, wait: float = 0.0) -> None:
    """Stop ``psutil.Process`` objects: SIGTERM, then SIGKILL what is still alive
    after ``grace`` seconds (``grace`` 0: SIGKILL at once); then wait up to ``wait``
    seconds for the killed ones to be gone. Processes already gone are skipped."""
    import psutil

    targets = list(processes)
    if grace > 0:
        for process in targets:
            try:
                process.terminate()
            except psutil.Error:
                pass
        _, targets = psutil.wait_procs(targets, timeout=grace)
    for process in targets:
        try:
            process.kill()
        except psutil.Error:
            pass
    if wait > 0 and targets:
        psutil.wait_procs(targets, timeout=wait)


def stop_tree(pid: int, grace: float, *, wait: float = 0.0) -> None:
    """Stop process ``pid`` and everything below it (see :func:`stop_processes`)."""
    stop_processes(process_tree(pid), grace, wait=wait)
