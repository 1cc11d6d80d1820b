"""A server's events on their way to the scheduler: queued as they happen and sent
together, as one ``log_event`` message a tick.

Two moments do not wait for the tick: a job's end (its ``JobFinished`` then leaves
before its result, on the worker's one ordered stream to the scheduler, so that the
executor hears the server's word first and never records the end twice) and the
server's leaving (its ``ServerDraining`` must be known at once). A job's start rides
with the next message: a crash soon after is blamed from the server's own record on
disk, not from this event.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from distributed.protocol import dumps

from ..fleet import events as ev

__all__ = ["TICK_SECONDS", "Outbox"]

logger = logging.getLogger(__name__)

#: Seconds an event may wait for others to share its message.
TICK_SECONDS = 0.05


class Outbox:
    """The events of one worker's server not sent yet (none without a worker)."""

    def __init__(self, worker: Any) -> None:
        self._worker = worker
        self._lock = threading.Lock()
        self._queued: list[ev.Event] = []

    def put(self, events: Iterable[ev.Event], *, now: bool = False) -> None:
        """Queue events; ``now``: send them, and all queued before, at once."""
        if self._worker is None:
            return
        with self._lock:
            first = not self._queued
            self._queued.extend(events)
        if now:
            self.flush()
        elif first:
            try:
                self._worker.loop.add_callback(self._flush_later)
            except Exception as error:  # the worker's loop is closing: send now
                logger.debug("no tick for the events: %r", error)
                self.flush()

    def _flush_later(self) -> None:
        self._worker.loop.call_later(TICK_SECONDS, self.flush)

    def flush(self) -> None:
        """Send what is queued as one message. Best-effort: a job's outcome travels
        with its result, never only here; an event that cannot be sent is logged and
        the others go."""
        with self._lock:
            events, self._queued = self._queued, []
        if not events:
            return
        payload = ev.encode(events)
        try:
            dumps(payload)  # one that cannot be sent would close the connection
        except Exception as error:
            logger.debug("could not send an event of %d: %r", len(events), error)
            payload = [item for item in payload if _sendable(item)]
            if not payload:
                return
        try:
            self._worker.log_event(ev.TOPIC, payload)
        except Exception as error:
            logger.debug("could not send %d event(s): %r", len(payload), error)


def _sendable(item: dict[str, Any]) -> bool:
    try:
        dumps(item)
    except Exception:
        return False
    return True
