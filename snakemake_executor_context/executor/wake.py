"""Waking the status loop from any thread (Dask callbacks run on a client thread,
Snakemake hands out jobs on its own): the loop sleeps until woken or until its
interval ends."""

from __future__ import annotations

import asyncio
import threading

from ..fleet import events as ev

__all__ = ["WAKING_EVENTS", "Waker"]

#: Fleet events after which placement may find a free slot or a warm server.
WAKING_EVENTS = (ev.JobFinished, ev.ServerJoined, ev.ServerLeft, ev.ContextEvicted)


class Waker:
    """A wake-up flag that an asyncio loop can wait on and any thread can set."""

    def __init__(self) -> None:
        self._flag = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None

    def set(self) -> None:
        """Wake the loop (now, or at its next wait)."""
        self._flag.set()
        loop, event = self._loop, self._event
        if loop is not None and event is not None:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the loop has ended
                pass

    async def wait(self, timeout: float) -> None:
        """Sleep until woken or ``timeout`` seconds pass."""
        if self._event is None:
            self._loop = asyncio.get_running_loop()
            self._event = asyncio.Event()
        if not self._flag.is_set():
            try:
                await asyncio.wait_for(self._event.wait(), timeout)
            except TimeoutError:
                pass
        self._flag.clear()
        self._event.clear()
