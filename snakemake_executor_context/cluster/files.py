"""The files a local cluster writes side by side, and the processes behind them.

The scheduler file ``X.json`` (Dask's), ``X.pid`` (what the cluster process runs),
``X.log`` (its log and its servers') and, for a persistent cluster, ``X.db`` (its
catalog).
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ClusterFiles", "alive", "kill_group", "tail"]


@dataclass(frozen=True)
class ClusterFiles:
    """The scheduler file of a local cluster and its siblings."""

    scheduler_file: Path

    @property
    def pid_file(self) -> Path:
        """What the cluster process writes once its servers are up."""
        return self.scheduler_file.with_suffix(".pid")

    @property
    def log_file(self) -> Path:
        """The log of the cluster process and its servers."""
        return self.scheduler_file.with_suffix(".log")

    @property
    def catalog_file(self) -> Path:
        """The default catalog of a persistent cluster (``X.db``)."""
        return self.scheduler_file.with_suffix(".db")

    @property
    def hold_dir(self) -> Path:
        """Where a preemption injector holds a server's restart back: one file per
        server name, holding the time until which it stays down."""
        return self.scheduler_file.with_suffix(".holds")

    def read_info(self) -> dict[str, Any] | None:
        """The cluster process's record, or None if it is not (yet) written."""
        try:
            return dict(json.loads(self.pid_file.read_text()))
        except (OSError, ValueError):
            return None

    def shortfall(self, running: set[str]) -> str | None:
        """'1 of 2 planned servers running (down: cpu1)' when fewer servers run than
        the cluster process planned (lost, and not back yet); None otherwise."""
        planned = [str(s["name"]) for s in (self.read_info() or {}).get("servers", [])]
        down = [name for name in planned if name not in running]
        if not down:
            return None
        return (
            f"{len(planned) - len(down)} of {len(planned)} planned servers running "
            f"(down: {', '.join(down)})"
        )

    def remove(self) -> None:
        """Remove the scheduler and pid files (the log stays)."""
        for path in (self.scheduler_file, self.pid_file):
            try:
                path.unlink()
            except FileNotFoundError:
                pass


def alive(pid: int) -> bool:
    """Whether a process runs (a zombie does not count)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def kill_group(pid: int) -> None:
    """SIGKILL a whole process group, and every process of the session it leads
    (plain jobs run in process groups of their own inside it); nothing if gone."""
    import psutil

    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == pid:
                proc.kill()
        except (OSError, psutil.Error):
            pass


def tail(path: Path, lines: int = 30) -> str:
    """The last lines of a log, for an error message."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
