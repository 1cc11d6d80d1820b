"""The files a local cluster writes side by side, and the processes behind them.

The scheduler file ``X.json`` (Dask's), ``X.pid`` (what the cluster process runs, and
what identifies it), ``X.log`` (its log and its servers'), ``X.tls/`` (its TLS
credentials) and, for a persistent cluster, ``X.db`` (its catalog). All are private to
their owner: files 0600, created exclusively and renamed into place, directories the
plugin creates 0700. They may lie in a directory other users write to (a lab's
project directory, a sticky scratch directory): each is trusted only when it is this
user's and not writable by others, checked at each open (:mod:`..paths`). Dask writes
its own scheduler file in the private root; the cluster process copies it here.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .. import paths
from ..errors import UnsafePathError
from ..fleet.keys import safe_name
from ..strays.processes import kill_process_group, pid_alive
from .credentials import FIX, Credentials, private_dir, write_private
from .info import ClusterInfo

__all__ = ["ClusterFiles", "identity", "kill_group", "tail"]


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
    def credentials(self) -> Credentials:
        """The cluster's TLS credentials (``X.tls/``)."""
        return Credentials.beside(self.scheduler_file)

    def prepare(self, *, own_directory: bool) -> None:
        """Make the directory of the files: created 0700 when missing; one the plugin
        owns by name (``own_directory``) is also checked and tightened to 0700. Any
        of the files already there must be this user's (a symlink or another user's
        file is refused in one line: :class:`..errors.UnsafePathError`)."""
        directory = self.scheduler_file.parent
        if own_directory or not directory.exists():
            private_dir(directory)
        for path in (self.scheduler_file, self.pid_file, self.log_file):
            paths.refuse_planted(path, FIX)
        for folder in (self.credentials.directory, self.hold_dir):
            if os.path.lexists(folder):
                private_dir(folder)

    @property
    def dask_scheduler_file(self) -> Path:
        """Where Dask writes its scheduler file (with ``open(..., "w")``, which would
        follow a symlink planted at ``X.json``): in the private root, keyed by this
        scheduler file's path; :meth:`publish_scheduler_file` copies it beside."""
        import hashlib

        key = hashlib.sha256(str(self.scheduler_file).encode()).hexdigest()[:16]
        return paths.private_path("clusters") / f"{key}.json"

    def publish_scheduler_file(self) -> None:
        """Copy Dask's scheduler file to ``X.json`` (0600, created exclusively)."""
        data = paths.read_trusted(self.dask_scheduler_file)
        if data is None:
            raise FileNotFoundError(self.dask_scheduler_file)
        write_private(self.scheduler_file, data)

    @property
    def hold_dir(self) -> Path:
        """Where a preemption injector holds a server's restart back: one file per
        server name, holding the time until which it stays down."""
        return self.scheduler_file.with_suffix(".holds")

    def hold_file(self, name: str) -> Path:
        """Server ``name``'s hold file in :attr:`hold_dir`. The name comes from the
        scheduler (a worker names itself): reduced to a plain file name, so that one
        such as ``../x`` names a file in the hold directory, not above it."""
        return self.hold_dir / safe_name(name)

    def read_info(self) -> ClusterInfo | None:
        """The cluster process's record, or None if it is not (yet) written, or is not
        one. A pid file that is not this user's is refused
        (:class:`..errors.UnsafePathError`): anyone who can write beside the scheduler
        file could forge one that names any process of this user's."""
        try:
            data = paths.read_trusted(self.pid_file, FIX)
            return None if data is None else ClusterInfo.from_wire(json.loads(data))
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return None

    def write_info(self, info: ClusterInfo) -> None:
        """Write the cluster process's record (0600), with what identifies it."""
        known = identity(info.pid)
        record = replace(
            info, start_ticks=known.get("start_ticks"), cmdline=tuple(known.get("cmdline", ()))
        )
        write_private(self.pid_file, json.dumps(record.to_wire(), indent=1))

    def running_pid(self) -> int | None:
        """The pid of the cluster process the record names, if that very process still
        runs: its start time and command line match the record (a stale file whose
        pid was reused by another process names nothing)."""
        info = self.read_info()
        if info is None or not pid_alive(info.pid):
            return None
        now = identity(info.pid)
        if not now or (info.start_ticks, list(info.cmdline)) != (
            now["start_ticks"],
            now["cmdline"],
        ):
            return None
        return info.pid

    def shortfall(self, running: set[str]) -> str | None:
        """'1 of 2 planned servers running (down: cpu1)' when fewer servers run than
        the cluster process planned (lost, and not back yet); None otherwise."""
        info = self.read_info()
        planned = [server.name for server in info.servers] if info else []
        down = [name for name in planned if name not in running]
        if not down:
            return None
        return (
            f"{len(planned) - len(down)} of {len(planned)} planned servers running "
            f"(down: {', '.join(down)})"
        )

    def remove(self) -> None:
        """Remove the scheduler and pid files and the credentials (the log stays);
        only this user's own files (another user's are left where they are)."""
        for path in (self.scheduler_file, self.pid_file):
            paths.remove_own(path)
        self.credentials.remove()


def identity(pid: int) -> dict[str, Any]:
    """What tells process ``pid`` from a later one with the same pid: its start time
    (clock ticks since boot, from ``/proc/<pid>/stat``) and its command line; empty
    if it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            command = [part.decode(errors="replace") for part in cmdline.read().split(b"\0")]
    except (OSError, IndexError):
        return {}
    # After the ")" of the command name, field 3 (state) is index 0: starttime, the
    # 22nd field of stat(5), is index 19.
    return {"start_ticks": int(fields[19]), "cmdline": [part for part in command if part]}


def kill_group(pid: int) -> None:
    """SIGKILL a whole process group, and every process of the session it leads
    (plain jobs run in process groups of their own inside it); nothing if gone."""
    import psutil

    kill_process_group(pid)
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == pid:
                proc.kill()
        except (OSError, psutil.Error):
            pass


def tail(path: Path, lines: int = 30) -> str:
    """The last lines of a log, for an error message."""
    try:
        text = (paths.read_trusted(path) or b"(no log)").decode(errors="replace")
    except OSError:
        return "(no log)"
    except UnsafePathError:
        return "(the log is not yours: not shown)"
    return "\n".join(text.splitlines()[-lines:])
