"""A job a server is running now: the handle its cancellation goes through."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..errors import JobCancelled
from ..strays.processes import stop_tree

__all__ = ["RunningJob"]


@dataclass
class RunningJob:
    """A job a server is running now; the handle cancellation goes through."""

    key: str
    thread_id: int
    cancel_requested: bool = False
    #: True while the job runs code a cancellation may interrupt (loader, script).
    interruptible: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: threading.Event = field(default_factory=threading.Event)
    #: The subprocess of a plain job.
    process: Any = None
    #: The job's context (None: a plain job) and when it started (wall clock).
    identity: str | None = None
    started: float = 0.0
    #: Why a limit stopped the job (its runtime, the server's memory cap), if one did.
    limit: str | None = None
    #: Whether the server's record of running jobs names it (a crash is blamed on the
    #: jobs it names); a group's member is not named, its group is.
    recorded: bool = True
    #: A group's members running now: cancelling the group cancels them.
    members: list[RunningJob] = field(default_factory=list)

    def adopt(self, member: RunningJob) -> bool:
        """Take a group's member in (False: the group is being cancelled: it must
        not start)."""
        with self.lock:
            if self.cancel_requested:
                return False
            self.members = [m for m in self.members if not m.done.is_set()] + [member]
            return True

    def request_cancel(self) -> None:
        """Stop the job: kill a plain job's process tree, or raise JobCancelled in
        an in-process job's thread at its next Python instruction."""
        import ctypes

        with self.lock:
            if self.cancel_requested:
                return
            self.cancel_requested = True
            members = list(self.members)
            if self.process is not None:
                self.kill_process()
            elif self.interruptible:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(self.thread_id), ctypes.py_object(JobCancelled)
                )
        for member in members:
            member.limit = member.limit or self.limit
            member.request_cancel()

    def kill_process(self, grace: float = 3.0) -> None:
        """SIGTERM the plain job's process tree, SIGKILL what is left after ``grace``."""
        stop_tree(self.process.pid, grace)

    @contextmanager
    def interruptible_phase(self) -> Iterator[None]:
        """Code inside may be interrupted by a cancellation. A cancellation asked for
        inside the phase ends it with JobCancelled, raised inside or at its end, never
        later (see :meth:`leave_phase`)."""
        with self.lock:
            if self.cancel_requested:
                raise JobCancelled()
            self.interruptible = True
        try:
            yield
        finally:
            self.leave_phase()
        if self.cancel_requested:
            raise JobCancelled()

    def leave_phase(self) -> None:
        """End the interruptible phase and take back a cancellation exception not yet
        raised: afterwards none can land in the server's own code. Idempotent; the
        server calls it again before its bookkeeping, since an exception that lands
        in the phase's own exit (contextlib's frames) skips the ``finally``."""
        while True:
            try:
                with self.lock:
                    if self.interruptible and self.cancel_requested:
                        _take_back_async_exception(self.thread_id)
                    self.interruptible = False
                return
            except JobCancelled:
                continue  # delivered at the boundary: the cancellation is on record


def _take_back_async_exception(thread_id: int) -> None:
    import ctypes

    # NULL clears an exception set by PyThreadState_SetAsyncExc and not yet raised.
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), None)
