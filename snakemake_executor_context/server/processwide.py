"""What a job may change for the whole server process, beyond what :mod:`.isolation`
sets per job: the umask, resource limits, multiprocessing's start method, the
recursion limit, the sockets' default timeout, the C library's time zone, the garbage
collector, the switch interval, warnings' filters and ``showwarning``, the root
logger's handlers and level (and ``logging.disable``), the exception hooks and the
niceness of the server's threads.

Under ``snakemake --cores`` each of these ends with the job's process; in a server
they would outlive the job and reach every later job, of every workflow, on that
server (a umask of 0 made a persistent cluster write the next run's outputs world-
writable). :class:`ProcessWide` is taken when a group of jobs starts and put back
when its last job ends; a hard limit a job lowered cannot be raised again, nor a
niceness it raised lowered again, by an unprivileged process, so
:meth:`ProcessWide.restore` says so and the server restarts. A signal handler is not
among them: ``signal.signal`` works only in a process's main thread, never in a
job's (:func:`main_thread_only` explains the error).

A job's forked children are fresh script processes, not servers:
:func:`prepare_server_process` makes each child forked from the server take
the default signal handlers a script's process has (the server's own handlers drain
it on SIGTERM and ignore Ctrl-C). Those signals are blocked in the forking thread
from just before the fork until the child has its new handlers: one that reaches the
child sooner (a ``Pool`` terminating a worker that has not run yet) waits for them,
and ends the child as it would a script's.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import multiprocessing
import os
import resource
import signal
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from ..paths.outputs import current_umask

__all__ = [
    "ProcessWide",
    "main_thread_only",
    "make_dirs",
    "open_own_file",
    "prepare_server_process",
    "server_umask",
]

#: Every resource limit this platform has (RLIMIT_NOFILE, RLIMIT_NPROC, ...).
_LIMITS = {
    name: getattr(resource, name)
    for name in dir(resource)
    if name.startswith("RLIMIT_") and isinstance(getattr(resource, name), int)
}

#: The umask the server started with: its own files are made with it, whatever a
#: running job set meanwhile (None: not a server; the process's umask now).
_server_umask: list[int] = []


@dataclass(frozen=True)
class ProcessWide:
    """The process-wide settings a job may change, as they were when taken."""

    umask: int
    limits: tuple[tuple[str, tuple[int, int]], ...]
    start_method: str | None
    recursion_limit: int
    socket_timeout: float | None
    #: Enabled, thresholds, debug flags.
    collector: tuple[bool, tuple[int, ...], int]
    switch_interval: float
    warning_filters: tuple[Any, ...]
    showwarning: Callable[..., Any]
    #: Handlers, level, ``logging.disable``'s level.
    root_logger: tuple[tuple[logging.Handler, ...], int, int]
    #: ``sys.excepthook``, ``threading.excepthook``, ``sys.unraisablehook``.
    hooks: tuple[Callable[..., Any], ...]
    #: The calling thread's: Linux keeps one niceness per thread.
    niceness: int

    @classmethod
    def now(cls) -> ProcessWide:
        """This process's settings now (read without changing any, but the umask for
        a moment where it changed since it was last seen: :func:`_umask_now`)."""
        root = logging.getLogger()
        return cls(
            umask=_umask_now(),
            limits=tuple((name, resource.getrlimit(number)) for name, number in _LIMITS.items()),
            start_method=multiprocessing.get_start_method(allow_none=True),
            recursion_limit=sys.getrecursionlimit(),
            socket_timeout=socket.getdefaulttimeout(),
            collector=(gc.isenabled(), gc.get_threshold(), gc.get_debug()),
            switch_interval=sys.getswitchinterval(),
            warning_filters=tuple(warnings.filters),
            showwarning=warnings.showwarning,
            root_logger=(tuple(root.handlers), root.level, root.manager.disable),
            hooks=(sys.excepthook, threading.excepthook, sys.unraisablehook),
            niceness=os.getpriority(os.PRIO_PROCESS, 0),
        )

    def for_a_job(self) -> None:
        """What a script's own interpreter starts with, where the server differs:
        multiprocessing's platform default (a server started by a forkserver
        inherits ``forkserver``, whose children re-run the script without its
        ``snakemake`` object)."""
        multiprocessing.set_start_method(None, force=True)

    def restore(self) -> list[str]:
        """Put the settings back; what could not be put back, one line each."""
        os.umask(self.umask)
        _umask_seen[:] = [self.umask]
        multiprocessing.set_start_method(self.start_method, force=True)
        sys.setrecursionlimit(self.recursion_limit)
        socket.setdefaulttimeout(self.socket_timeout)
        # TZ is back by now (isolation.process_state ends first): the zone follows it.
        # Always: a C library's localtime() may have loaded the job's zone unseen, and
        # glibc reads no file when TZ is the string it saw last (3 µs).
        time.tzset()
        enabled, thresholds, debug = self.collector
        (gc.enable if enabled else gc.disable)()
        gc.set_threshold(*thresholds)
        gc.set_debug(debug)
        sys.setswitchinterval(self.switch_interval)
        if tuple(warnings.filters) != self.warning_filters:
            warnings.resetwarnings()  # public, and it invalidates the cached decisions
            cast(list, warnings.filters)[:] = self.warning_filters  # typed a Sequence
        warnings.showwarning = self.showwarning
        self._restore_root_logger()
        sys.excepthook, threading.excepthook, sys.unraisablehook = self.hooks
        lost = _restore_niceness(self.niceness)
        for name, (soft, hard) in self.limits:
            if resource.getrlimit(_LIMITS[name]) == (soft, hard):
                continue
            try:
                resource.setrlimit(_LIMITS[name], (soft, hard))
            except (OSError, ValueError):
                now_soft, now_hard = resource.getrlimit(_LIMITS[name])
                lost.append(
                    f"{name} was lowered to {_limit(now_soft)}/{_limit(now_hard)} (soft/hard) "
                    f"from {_limit(soft)}/{_limit(hard)}, and a hard limit cannot be raised again"
                )
        return lost

    def _restore_root_logger(self) -> None:
        handlers, level, disabled = self.root_logger
        root = logging.getLogger()
        for handler in list(root.handlers):
            if handler not in handlers:
                root.removeHandler(handler)
                handler.close()
        for handler in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
        if root.level != level:
            root.setLevel(level)
        if root.manager.disable != disabled:
            logging.disable(disabled)


#: The umask last read or put back here.
_umask_seen: list[int] = []


def _umask_now() -> int:
    """The umask, set to the one last seen, which it almost always still is:
    ``os.umask`` returns the one it replaced, and when that is the same the umask
    never differed (reading ``/proc/self/status`` costs 20 µs). When it is not, the
    one read is put back at once (a thread creating a file in that moment gets the
    umask seen last); the first time, it is read from ``/proc``."""
    if not _umask_seen:
        _umask_seen.append(current_umask())
    seen = _umask_seen[0]
    umask = os.umask(seen)
    if umask != seen:
        os.umask(umask)
        _umask_seen[:] = [umask]
    return umask


def _restore_niceness(niceness: int) -> list[str]:
    """Every thread's niceness back to ``niceness``: a job's ``os.nice`` raises its
    thread's, which the next job on that thread (and the threads it starts) inherits.
    Every thread, at every job's end: a job may renice any one of them (``os.setpriority``
    with its id), and only ``/proc/self/task`` names them all, C libraries' threads
    too. No cheaper test is sound (the process's niceness is its main thread's, a
    process group's the least of its threads', blind to a raise); the walk is 20 µs."""
    raised = set()
    for thread in _threads():
        try:
            now = os.getpriority(os.PRIO_PROCESS, thread)
            if now != niceness:
                os.setpriority(os.PRIO_PROCESS, thread, niceness)
        except ProcessLookupError:  # the thread ended meanwhile
            continue
        except PermissionError:
            raised.add(now)
    if not raised:
        return []
    return [
        f"the niceness was raised to {max(raised)} from {niceness} (os.nice), and an "
        "unprivileged process cannot lower it again"
    ]


def _threads() -> list[int]:
    """This process's threads (0, the calling one, where /proc is missing)."""
    try:
        return [int(name) for name in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def main_thread_only(error: BaseException) -> str | None:
    """Why ``error`` came, and its fix, where a job's script called ``signal.signal``:
    a context job runs in a thread of its server, whose main thread keeps the
    server's handlers (None: another error)."""
    if not (isinstance(error, ValueError) and str(error).startswith("signal only works")):
        return None
    return (
        "A context job's script runs in a thread of its server, whose main thread keeps "
        "the server's signal handlers. Fix: run the rule without a context resource (in "
        "its own process, as the local executor does), or call signal.signal in a child "
        "process the script starts"
    )


def _limit(value: int) -> str:
    return "unlimited" if value == resource.RLIM_INFINITY else str(value)


def server_umask() -> int:
    """The umask the server's own files are made with (:func:`prepare_server_process`
    remembers it at the server's start)."""
    return _server_umask[0] if _server_umask else current_umask()


def make_dirs(path: str) -> None:
    """``os.makedirs`` with the modes the server's umask gives, whatever umask a job
    running beside set (``os.makedirs`` applies its mode to the last part only)."""
    parent = os.path.dirname(path.rstrip(os.sep))
    if not path or os.path.isdir(path):
        return
    if parent and parent != path:
        make_dirs(parent)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o777 & ~server_umask())


def open_own_file(path: str) -> int:
    """Create or truncate a file the server itself writes (a job's log), its parents
    too, with the modes the server's umask gives; returns its descriptor."""
    make_dirs(os.path.dirname(path))
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    return os.open(path, flags, 0o666 & ~server_umask())


#: The signals a server handles or ignores otherwise than a fresh interpreter does,
#: with the handler each gets back in a forked child.
_SCRIPT_HANDLERS: dict[signal.Signals, Callable[[int, Any], Any] | signal.Handlers] = {
    signal.SIGINT: signal.default_int_handler,
    signal.SIGTERM: signal.SIG_DFL,
    signal.SIGHUP: signal.SIG_DFL,
    signal.SIGUSR1: signal.SIG_DFL,
    signal.SIGUSR2: signal.SIG_DFL,
}
#: The forking thread's signal mask from before the fork (per thread: threads of two
#: jobs may fork at once).
_forking = threading.local()


def prepare_server_process() -> None:
    """Remember the server's umask, and give every child forked from this process the
    signal handlers of a fresh interpreter (called once, in the server's main thread)."""
    _server_umask[:] = [current_umask()]
    os.register_at_fork(
        before=_block_signals, after_in_parent=_unblock_signals, after_in_child=_fresh_signals
    )


def _block_signals() -> None:
    # Until the child has a script's handlers. Without this, a SIGTERM that reaches
    # the child before then is dropped (Python clears the signals tripped before its
    # fork handlers run) or runs the server's handler, which drains a copy of the
    # server: either way the child lives on, and a Pool's terminate() waits for it
    # forever (a worker that had not run yet when its pool ended hung a job of
    # test_script_processes until its runtime limit, in CI and under load here).
    _forking.mask = signal.pthread_sigmask(signal.SIG_BLOCK, _SCRIPT_HANDLERS)


def _unblock_signals() -> None:
    mask = getattr(_forking, "mask", None)
    if mask is not None:
        del _forking.mask
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _fresh_signals() -> None:
    # The forking thread is the child's main thread, the only one that may set these;
    # each is set even if another cannot be.
    for number, handler in _SCRIPT_HANDLERS.items():
        with contextlib.suppress(ValueError, OSError):
            signal.signal(number, handler)
    # A signal that came meanwhile is delivered now, to the handler just set.
    _unblock_signals()
