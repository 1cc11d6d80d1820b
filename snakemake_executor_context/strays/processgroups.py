"""The process groups of a server's plain jobs, recorded on local disk so that what
a dead server left running is killed: by its nanny when the process exits, and by
its successor when it starts; and the jobs it runs, which its nanny reports when it
dies (the job a crash is blamed on).

A plain job runs in a process group of its own, with a parent-death signal on its
shell (:func:`with_parent_death_signal`); the record catches the rest of its tree,
which the parent-death signal does not reach. A record is one file per
server, named by the nanny's pid and the server's name (a restarted server has the
same nanny and name), in the private root (:mod:`..paths`): the nanny kills what it
names, so a record is read only when it is this user's own file.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from pathlib import Path

from .. import paths
from ..defaults import SERVER_MARK_VARIABLE
from ..errors import UnsafePathError
from .processes import kill_process_group

__all__ = ["GroupRecord", "nanny_pid", "server_mark", "with_parent_death_signal"]

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


def server_mark(nanny_pid: int, name: str) -> str:
    """The mark a nanny puts in its server's environment (``PID:NAME``), inherited by
    everything the server starts: whose it is, and where its record lies."""
    return f"{nanny_pid}:{name}"


def nanny_pid() -> int:
    """The pid of this server's nanny's process: the one in the mark the nanny gave it
    (:func:`server_mark`; a server forked by multiprocessing's forkserver has the
    forkserver as its parent), else this process's parent."""
    pid, sep, _ = os.environ.get(SERVER_MARK_VARIABLE, "").partition(":")
    return int(pid) if sep and pid.isdigit() else os.getppid()


class GroupRecord:
    """The process groups one server's running plain jobs own."""

    def __init__(self, nanny_pid: int, name: str, root: Path | None = None) -> None:
        #: The root the record lies in (None: the private root, checked at each
        #: write; its base is fixed now, before a job changes the temporary directory).
        self._root = root
        self._base = paths.local_base()
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "server"
        self.path = (root or paths.root_path(self._base)) / "pgroups" / f"{nanny_pid}-{safe}"

    def _directory(self) -> None:
        """Create (0700) and check the records' directory and the root above it."""
        if self._root is None:
            paths.private_path("pgroups", base=self._base)
        else:
            paths.private_dir(self._root, tighten=False)
            paths.private_dir(self.path.parent)

    def _read(self, path: Path) -> str:
        try:
            return (paths.read_trusted(path) or b"").decode(errors="replace")
        except (OSError, UnsafePathError):
            return ""

    @classmethod
    def of_this_server(cls, name: str) -> GroupRecord:
        """The record of the server running in this process: its nanny's process is
        in the mark the nanny gave it (a forked server's parent is the forkserver),
        else its parent."""
        return cls(nanny_pid(), name)

    def groups(self) -> set[int]:
        """The process groups recorded."""
        return {int(line) for line in self._read(self.path).split() if line.isdigit()}

    def _write(self, groups: set[int]) -> None:
        # The nanny kills what this file names: nobody else may plant or edit it.
        self._directory()
        paths.write_private(self.path, "".join(f"{g}\n" for g in sorted(groups)))

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
            self._directory()
            paths.write_private(self._running_path, "".join(f"{k}\n" for k in sorted(keys)))

    def finished(self, key: str) -> None:
        """A job ended."""
        with _lock:
            keys = set(self.running()) - {key}
            paths.write_private(self._running_path, "".join(f"{k}\n" for k in sorted(keys)))

    def running(self) -> list[str]:
        """The jobs recorded as running."""
        return self._read(self._running_path).split()

    def kill_all(self, *, keep_running: bool = False) -> list[int]:
        """SIGKILL every recorded process group still alive; clear the record (the
        jobs' too unless ``keep_running``: the nanny reads them after the exit).
        Returns the groups that had processes."""
        killed = []
        with _lock:
            for pgid in sorted(self.groups()):
                if kill_process_group(pgid):
                    killed.append(pgid)
            for path in (self.path,) if keep_running else (self.path, self._running_path):
                with contextlib.suppress(OSError):
                    paths.remove_own(path)
        return killed
