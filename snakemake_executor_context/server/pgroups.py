"""The process groups of a server's plain jobs, recorded on local disk so that what
a dead server left running is killed: by its nanny when the process exits, and by
its successor when it starts; and the jobs it runs, which its nanny reports when it
dies (the job a crash is blamed on).

A plain job runs in a process group of its own, with a parent-death signal on its
shell (:func:`with_parent_death_signal`); the record catches the rest of its tree,
which the parent-death signal does not reach. A record is one file per
server, named by the nanny's pid and the server's name (a restarted server has the
same nanny and name).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path

from ..errors import ContextExecutorError
from ..privacy import private_dir

__all__ = ["GroupRecord", "with_parent_death_signal"]

_lock = threading.Lock()


#: Sets the parent-death signal, then becomes ``sh -c COMMAND``. A launcher, not a
#: ``preexec_fn``: code between fork and exec in a threaded server (a Dask worker)
#: may deadlock on a lock another thread held at the fork.
_LAUNCHER = (
    "import ctypes, os, sys\n"
    "try:\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, KILL\n"
    "except (OSError, AttributeError):\n"
    "    pass\n"
    "os.execv('/bin/sh', ['/bin/sh', '-c', sys.argv[1]])\n"
)


def with_parent_death_signal(command: str) -> list[str]:
    """The argv that runs ``command`` with the shell, killed (SIGKILL) when the server
    thread that started it dies (Linux; elsewhere the shell alone)."""
    return [sys.executable, "-c", _LAUNCHER, command]


_FIX = "remove it (another user may have planted it); it must be yours and mode 0700."


class GroupRecord:
    """The process groups one server's running plain jobs own."""

    def __init__(self, nanny_pid: int, name: str, root: Path | None = None) -> None:
        base = root or Path(tempfile.gettempdir()) / f"snakemake-context-{os.getuid()}"
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "server"
        self.path = base / "pgroups" / f"{nanny_pid}-{safe}"

    @classmethod
    def of_this_server(cls, name: str) -> GroupRecord:
        """The record of the server running in this process (its parent: the nanny)."""
        return cls(os.getppid(), name)

    def groups(self) -> set[int]:
        """The process groups recorded."""
        try:
            text = self.path.read_text()
        except OSError:
            return set()
        return {int(line) for line in text.split() if line.isdigit()}

    def _write(self, groups: set[int]) -> None:
        # The nanny kills what this file names: nobody else may plant or edit it.
        private_dir(self.path.parent.parent, ContextExecutorError, _FIX)
        private_dir(self.path.parent, ContextExecutorError, _FIX)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text("".join(f"{g}\n" for g in sorted(groups)))
        os.replace(tmp, self.path)

    def add(self, pgid: int) -> None:
        """Record a job's process group (before the job can run long)."""
        with _lock:
            self._write(self.groups() | {pgid})

    def remove(self, pgid: int) -> None:
        """Forget a finished job's process group."""
        with _lock:
            self._write(self.groups() - {pgid})

    @property
    def _running_path(self) -> Path:
        return self.path.with_suffix(".running")

    def started(self, key: str) -> None:
        """A job starts: written before its code runs, so that a crash is blamed on
        the job that ran (events may die unsent with the process)."""
        with _lock:
            keys = set(self.running()) | {key}
            private_dir(self.path.parent.parent, ContextExecutorError, _FIX)
            private_dir(self.path.parent, ContextExecutorError, _FIX)
            self._running_path.write_text("".join(f"{k}\n" for k in sorted(keys)))

    def finished(self, key: str) -> None:
        """A job ended."""
        with _lock:
            keys = set(self.running()) - {key}
            self._running_path.write_text("".join(f"{k}\n" for k in sorted(keys)))

    def running(self) -> list[str]:
        """The jobs recorded as running."""
        try:
            return self._running_path.read_text().split()
        except OSError:
            return []

    def kill_all(self, *, keep_running: bool = False) -> list[int]:
        """SIGKILL every recorded process group still alive; clear the record (the
        jobs' too unless ``keep_running``: the nanny reads them after the exit).
        Returns the groups that had processes."""
        killed = []
        with _lock:
            for pgid in sorted(self.groups()):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
                    killed.append(pgid)
            for path in (self.path,) if keep_running else (self.path, self._running_path):
                with contextlib.suppress(OSError):
                    path.unlink()
        return killed
