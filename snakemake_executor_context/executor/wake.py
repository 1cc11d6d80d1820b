"""Waking the status loop from any thread (Dask callbacks run on a client thread,
Snakemake hands out jobs on its own): the loop sleeps until woken or until its
interval ends; the fleet's events arrive as stimuli (:class:`FleetInbox`)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..dispatch.vocabulary import FleetEvent
from ..fleet import events as ev

__all__ = ["WAKING_EVENTS", "FleetInbox", "Waker"]

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


class FleetInbox:
    """Where Dask delivers the fleet's events (on the client's thread): each batch is
    decoded, handed to ``seen`` (the catalog's relay, the load tally), queued for
    dispatch with ``put``, and wakes the loop (``wake``) when a slot may be free.
    What this run sent itself (marked ``sender`` by its relay: two events a job) comes
    back from the scheduler too, and is dropped here, undecoded."""

    def __init__(
        self,
        seen: Iterable[Callable[[list[ev.Event]], Any]],
        put: Callable[[FleetEvent], None],
        wake: Callable[[], None],
        sender: str,
    ) -> None:
        self.seen, self.put, self.wake, self.sender = list(seen), put, wake, sender

    def __call__(self, event: tuple[float, Any]) -> None:
        """One message of the fleet's topic (``(time, encoded events)``)."""
        message = event[1]
        if isinstance(message, list):
            message = [item for item in message if ev.sender_of(item) != self.sender]
        try:
            decoded = list(ev.decode(message))
        except Exception as error:
            logging.getLogger(__name__).debug("undecodable fleet event: %r", error)
            return
        for see in self.seen:
            see(decoded)
        now = time.time()
        for item in decoded:
            self.put(FleetEvent(item, now))
        if any(isinstance(item, WAKING_EVENTS) for item in decoded):
            self.wake()
