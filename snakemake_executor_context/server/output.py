"""Where a server's output goes: each job's to its own log, never to another's.

``sys.stdout`` and ``sys.stderr`` of a server are :class:`ThreadRoutedStream` s for
good: a write goes to the log of the job whose thread (or a thread that thread
started, at any depth) writes it, and anything else (the server's own threads, and
threads a finished job left running) to the server's streams, which are the
cluster log. File descriptors 1 and 2 point at the running job's log while no
leaked thread lives; while one does they stay on the cluster log, since an fd
cannot tell threads apart (the job's own fd-level output then goes there too,
and its log says so).

At a job's end, :func:`job_output` reports the threads the job left running and
the file descriptors it left open (:class:`Leaks`). Threads a context's loader
starts belong to the context (:func:`context_loading`), not to the job.
"""

from __future__ import annotations

import io
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TextIO

from .. import paths

__all__ = [
    "JobOutput",
    "Leaks",
    "ThreadRoutedStream",
    "context_loading",
    "current_job_output",
    "install",
    "job_output",
    "open_fds",
]

_OWNER = "_snakemake_context_job"
#: How long after a job's end a file it seems to have left open is looked at again.
LEAK_RECHECK_SECONDS = 0.05
_LOADING = "_snakemake_context_loading"
_lock = threading.Lock()
_installed: dict[str, ThreadRoutedStream] = {}
#: Jobs that left threads running, whose threads may still be alive.
_leakers: list[JobOutput] = []
#: Files opened while a context loaded: the context's, not a job's leak.
_context_fds: dict[int, str] = {}
#: Directories whose files the server itself reads or writes meanwhile (templates it
#: sends to peers or receives), with how many users each: never a job's leak.
_server_dirs: dict[str, int] = {}
#: Jobs running now, the one whose log fds 1 and 2 point at, and the server's own
#: fds 1 and 2 (duplicates, to point them back).
_active: list[JobOutput] = []
_fd_holder: JobOutput | None = None
_server_fds: list[int] = []


@dataclass(eq=False)
class JobOutput:
    """The streams of one running job, and whether it still runs."""

    title: str
    stdout: TextIO
    stderr: TextIO
    active: bool = True
    #: Whether another job ran beside it at some time (slots).
    overlapped: bool = False


@dataclass
class Leaks:
    """What a job left behind in the server process."""

    threads: list[str] = field(default_factory=list)
    fds: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.threads or self.fds)

    def describe(self, title: str, where: str) -> str:
        """One line: what was left, and what happens to it."""
        parts = []
        if self.threads:
            parts.append(
                f"{len(self.threads)} thread(s) still running ({', '.join(self.threads[:5])}; "
                "their output goes to the cluster log, not to another job's log)"
            )
        if self.fds:
            parts.append(
                f"{len(self.fds)} file descriptor(s) still open ({', '.join(self.fds[:5])})"
            )
        return (
            f"{title} left {' and '.join(parts)} in {where}. Fix: join the threads and "
            "close the files before the script ends (a `with` block)."
        )


def _owner() -> JobOutput | None:
    owner = getattr(threading.current_thread(), _OWNER, None)
    return owner if isinstance(owner, JobOutput) else None


_original_start = threading.Thread.start


def _start(self: threading.Thread) -> None:
    """Thread.start, remembering which job's thread started the new one (not while
    it loads a context: such threads belong to the context, like its modules)."""
    owner = _owner()
    if owner is not None and not getattr(threading.current_thread(), _LOADING, False):
        setattr(self, _OWNER, owner)
    _original_start(self)


@contextmanager
def context_loading() -> Iterator[None]:
    """Threads started inside belong to the context being loaded, not to the job:
    they are neither the job's leaks nor does their output go to its log."""
    thread = threading.current_thread()
    previous = getattr(thread, _LOADING, False)
    setattr(thread, _LOADING, True)
    before = open_fds()
    try:
        yield
    finally:
        setattr(thread, _LOADING, previous)
        with _lock:
            _context_fds.update(
                (fd, target) for fd, target in open_fds().items() if before.get(fd) != target
            )


class ThreadRoutedStream(io.TextIOBase):
    """A text stream that writes to the running job of the writing thread, else to
    the server's own stream."""

    def __init__(self, name: str, server: TextIO) -> None:
        super().__init__()
        self.name = name
        self.server = server

    def _target(self) -> TextIO:
        owner = _owner()
        if owner is not None and owner.active:
            return owner.stdout if self.name == "stdout" else owner.stderr
        return self.server

    def write(self, text: str) -> int:
        """Write to the writing thread's job log (or the server's stream)."""
        target = self._target()
        try:
            return target.write(text)
        except (OSError, ValueError):
            if target is self.server:
                raise
            return self.server.write(text)  # the job's stream closed under a late writer

    def flush(self) -> None:
        """Flush the writing thread's stream."""
        try:
            self._target().flush()
        except (OSError, ValueError):
            pass

    def fileno(self) -> int:
        """The file descriptor of the writing thread's stream."""
        return self._target().fileno()

    def isatty(self) -> bool:
        """Whether the writing thread's stream is a terminal."""
        try:
            return self._target().isatty()
        except (OSError, ValueError):
            return False

    def writable(self) -> bool:
        """Always: this is an output stream."""
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        """The target stream's encoding."""
        return getattr(self._target(), "encoding", None) or "utf-8"

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        """The target stream's error handler."""
        return getattr(self._target(), "errors", None)

    @property
    def buffer(self) -> Any:
        """The target stream's binary buffer."""
        return self._target().buffer


def install() -> None:
    """Route sys.stdout/sys.stderr by thread, for the life of the process (once)."""
    with _lock:
        if _installed:
            return
        threading.Thread.start = _start  # type: ignore[method-assign]
        # The server's own fds 1 and 2, to point them back after a job (kept open for
        # the life of the process, so never a job's leak).
        _server_fds.extend((os.dup(1), os.dup(2)))
        for name, fd in zip(("stdout", "stderr"), _server_fds, strict=True):
            original = getattr(sys, name)
            original.flush()
            # The server's own output goes to its own fds, not to 1 and 2, which point
            # at a running job's log: Dask's log records too (its handlers hold the
            # original streams), from whatever thread, while any job runs.
            server = io.TextIOWrapper(
                io.FileIO(fd, "wb", closefd=False),
                encoding=getattr(original, "encoding", None) or "utf-8",
                errors="backslashreplace",
                write_through=True,
            )
            _retarget_handlers(original, server)
            stream = ThreadRoutedStream(name, server)
            _installed[name] = stream
            setattr(sys, name, stream)


def _retarget_handlers(old: TextIO, new: TextIO) -> None:
    """Point every logging handler that writes to ``old`` at ``new``."""
    import logging

    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):
            if isinstance(handler, logging.StreamHandler) and handler.stream is old:
                handler.setStream(new)


#: Each descriptor open when last read: what it is open on (device, inode), and
#: where ``/proc/self/fd`` said it points.
_known_fds: dict[int, tuple[tuple[int, int], str]] = {}


def open_fds() -> dict[int, str]:
    """This process's open file descriptors and what they point at.

    Read twice per job, so the common case is cheap: when as many descriptors are open
    as when last read (the size of ``/proc/self/fd``, Linux 6.2+) and each of those
    is still open on the same file (``fstat``), they are exactly the same, and their
    targets are those read then (a closed descriptor reopened on another file differs
    in its inode). Otherwise the directory is listed, and only the descriptors open
    on another file than before are read again (``readlink`` is most of the cost)."""
    global _known_fds
    known = _known_fds
    if known and _open_count() == len(known) and _same_files(known):
        return {fd: target for fd, (_, target) in known.items()}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return {}
    found, read = {}, {}
    for name in names:
        fd = int(name)
        file = _file_of(fd)
        if file is not None and (seen := known.get(fd)) is not None and seen[0] == file:
            read[fd] = seen
            found[fd] = seen[1]
            continue
        try:
            found[fd] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if file is not None and _file_of(fd) == file:  # not reopened meanwhile
            read[fd] = (file, found[fd])
    _known_fds = read
    return found


def _open_count() -> int:
    """How many descriptors are open (0 where the kernel does not say)."""
    try:
        return os.stat("/proc/self/fd").st_size
    except OSError:
        return 0


def _file_of(fd: int) -> tuple[int, int] | None:
    try:
        info = os.fstat(fd)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _same_files(known: dict[int, tuple[tuple[int, int], str]]) -> bool:
    return all(_file_of(fd) == file for fd, (file, _) in known.items())


def server_directory(path: str | os.PathLike[str], *, using: bool) -> None:
    """Files under ``path`` are the server's while ``using`` (a template served to a
    peer, or received): count them in (True) or out (False), never as a job's leak."""
    key = os.path.realpath(path) + os.sep
    with _lock:
        users = _server_dirs.get(key, 0) + (1 if using else -1)
        if users > 0:
            _server_dirs[key] = users
        else:
            _server_dirs.pop(key, None)


def _leaked_fds(before: dict[int, str], after: dict[int, str]) -> list[str]:
    # Sockets, pipes and event fds open and close all the time in the server's own
    # threads (Dask's connections): only files count, not the plugin's own locks.
    locks = paths.held_locks()
    return [
        f"{fd} -> {target}"
        for fd, target in sorted(after.items())
        if before.get(fd) != target
        and _context_fds.get(fd) != target
        and locks.get(fd) != target
        and target.startswith("/")
        and not target.startswith("/proc/")
        and not any(target.startswith(d) for d in tuple(_server_dirs))
    ]


def _lasting_leaks(before: dict[int, str]) -> list[str]:
    """The files a job left open: new since ``before`` and still open a moment later.
    The server's own threads open files for an instant too (a TLS context reads the
    system's CA bundle while the job ends, seen in CI); a job's leak stays."""
    found = _leaked_fds(before, open_fds())
    if found:
        time.sleep(LEAK_RECHECK_SECONDS)
        again = set(_leaked_fds(before, open_fds()))
        found = [leak for leak in found if leak in again]
    return found


@contextmanager
def job_output(title: str, fd: int) -> Iterator[Leaks]:
    """Send the calling thread's (and its descendants') output to the log ``fd``;
    fds 1 and 2 too while it is the only job and no leaked thread lives. Fills the
    yielded :class:`Leaks` at the end."""
    install()
    leaks = Leaks()
    fds_before = open_fds()
    stdout = io.TextIOWrapper(open(os.dup(fd), "wb", buffering=0), write_through=True)
    stderr = io.TextIOWrapper(open(os.dup(fd), "wb", buffering=0), write_through=True)
    job = JobOutput(title, stdout, stderr)
    thread = threading.current_thread()
    for stream in _installed.values():
        stream.server.flush()
    with _lock:
        _leakers[:] = [j for j in _leakers if any(getattr(t, _OWNER, None) is j for t in _live())]
        _take_fds(job, fd, lingering=bool(_leakers))
    sys.stdout, sys.stderr = _installed["stdout"], _installed["stderr"]
    setattr(thread, _OWNER, job)
    try:
        yield leaks
    finally:
        for own in (stdout, stderr):
            try:
                own.flush()
            except (OSError, ValueError):
                pass
        leaked = [t for t in _live() if t is not thread and getattr(t, _OWNER, None) is job]
        leaks.threads = [f"{t.name}" for t in leaked]
        job.active = False
        with _lock:
            if leaked:
                _leakers.append(job)
            _give_back_fds(job)
        try:
            delattr(thread, _OWNER)
        except AttributeError:
            pass
        # The routers stay: whatever the job put in their place goes.
        sys.stdout, sys.stderr = _installed["stdout"], _installed["stderr"]
        stdout.close()
        stderr.close()
        # Files another job opened meanwhile cannot be told from this one's.
        leaks.fds = [] if job.overlapped else _lasting_leaks(fds_before)


def _take_fds(job: JobOutput, fd: int, *, lingering: bool) -> None:
    """Point fds 1 and 2 at the job's log if it runs alone; with another job beside
    it, at the server's (the cluster log), and say so in both logs. Under ``_lock``."""
    global _fd_holder
    for other in _active:
        other.overlapped = True
    job.overlapped = bool(_active)
    if lingering:
        job.stderr.write(
            "[snakemake-context] a thread an earlier job left running still lives: this "
            "job's file-descriptor output (subprocesses, C libraries) goes to the cluster "
            "log, not here.\n"
        )
    elif _active:
        job.stderr.write(
            f"[snakemake-context] {len(_active)} other job(s) run beside this one on this "
            "server (slots): file-descriptor output (subprocesses, C libraries) goes to "
            "the cluster log, not here; print() and logging still come here.\n"
        )
        holder = _fd_holder
        if holder is not None:
            _restore_server_fds()
            _note(holder, f"{job.title} started beside this job")
    else:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        _fd_holder = job
    _active.append(job)


def _give_back_fds(job: JobOutput) -> None:
    if job in _active:
        _active.remove(job)
    if _fd_holder is job:
        _restore_server_fds()


def _restore_server_fds() -> None:
    global _fd_holder
    os.dup2(_server_fds[0], 1)
    os.dup2(_server_fds[1], 2)
    _fd_holder = None


def _note(job: JobOutput, why: str) -> None:
    try:
        job.stderr.write(
            f"[snakemake-context] {why} (slots): from here on this job's file-descriptor "
            "output goes to the cluster log, not here.\n"
        )
    except (OSError, ValueError):
        pass


def current_job_output() -> JobOutput | None:
    """The running job whose thread (or a thread it started) calls this, if any."""
    owner = _owner()
    return owner if owner is not None and owner.active else None


def _live() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.is_alive()]
