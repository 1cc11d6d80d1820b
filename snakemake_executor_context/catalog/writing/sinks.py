"""Where events go, off the thread that makes them: a bounded queue drained by a
thread of its own (:class:`QueuedSink`), which both the catalog's writer
(:mod:`.writer`) and the relay to a cluster's writer (:class:`DaskRelay`) are.

:meth:`QueuedSink.submit` never blocks: when the queue is full the event is dropped,
and counted. A failure warns once through the ``warn`` callback; the sink keeps
draining and never fails or stalls the process it runs in. What was not handled by
the end is counted in :attr:`QueuedSink.dropped`, which the run reports.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from collections.abc import Callable

from ...fleet.events import Event, RunHeartbeat

__all__ = ["BATCH_SIZE", "QUEUE_SIZE", "DaskRelay", "EventSink", "QueuedSink", "first_line"]

logger = logging.getLogger(__name__)

#: Events a writer holds before it drops new ones.
QUEUE_SIZE = 20_000
#: Events written in one transaction at most (small: a transaction holds SQLite's
#: write lock, which readers checkpointing the WAL also want).
BATCH_SIZE = 200
#: Seconds between two heartbeats of the run a writer records.
HEARTBEAT_SECONDS = 5.0


class EventSink:
    """Where events go: a writer, or a relay to the writer on the scheduler."""

    def submit(self, event: Event) -> bool:
        """Queue one event; False if it was dropped. Never blocks."""
        raise NotImplementedError

    def close(self, timeout: float = 5.0, patience: float = 60.0) -> None:
        """Write (or send) what is queued, and stop: give up after ``timeout`` seconds
        without progress, or ``patience`` seconds in all."""
        raise NotImplementedError


class QueuedSink(EventSink):
    """A daemon thread draining a bounded queue in batches; warns once on failure."""

    thread_name = "snakemake-context-sink"

    def __init__(
        self,
        *,
        warn: Callable[[str], None],
        queue_size: int = QUEUE_SIZE,
        tick: float = 0.5,
        heartbeat_run: str | None = None,
    ) -> None:
        self.heartbeat_run = heartbeat_run
        self._last_heartbeat = time.monotonic()
        self._queue: queue.Queue[Event | None] = queue.Queue(maxsize=queue_size)
        self._warn = warn
        self._warned: set[str] = set()
        self._tick = tick
        self._stop = threading.Event()
        self._idle = threading.Condition()
        self._pending = 0
        self.dropped = 0
        self.written = 0
        self.failures = 0
        self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def warn_once(self, topic: str, message: str) -> None:
        """Warn through the callback, once per topic."""
        if topic in self._warned:
            return
        self._warned.add(topic)
        try:
            self._warn(message)
        except Exception as error:
            logger.debug("the warning callback failed (%r): %s", error, message)

    def submit(self, event: Event) -> bool:
        """Queue one event; False if it was dropped (the queue is full). Never blocks."""
        with self._idle:
            self._pending += 1
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()
            self.dropped += 1
            self.warn_once(
                "full",
                f"The context catalog cannot keep up: its queue of {self._queue.maxsize} "
                "events is full, so some events are not recorded. The workflow is not "
                "affected.",
            )
            return False
        return True

    def unwritten(self) -> int:
        """Events queued or kept back for a retry."""
        return self._pending

    def flush(self, timeout: float) -> bool:
        """Wait until every queued event is handled (written, or sent); False on
        timeout."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self.unwritten() > 0:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._idle.wait(min(left, 0.1))
        return True

    def drain(self, timeout: float = 5.0, patience: float = 60.0) -> bool:
        """Wait until what is queued is handled, while the writer makes progress (for
        at most ``patience`` seconds), giving up when it made none for ``timeout``
        seconds; False if it gave up."""
        deadline = time.monotonic() + max(timeout, patience)
        while self._thread.is_alive():
            with self._idle:
                before = self.unwritten()
            if self.flush(min(timeout, max(0.0, deadline - time.monotonic()))):
                return True
            with self._idle:
                stalled = self.unwritten() >= before
            if stalled or time.monotonic() >= deadline:
                return False
        return self.unwritten() == 0

    def close(self, timeout: float = 5.0, patience: float = 60.0) -> None:
        """Handle what is queued (:meth:`drain`), then stop the thread; what is left is
        counted in :attr:`dropped`."""
        if self._thread.is_alive():
            self.drain(timeout, patience)
            self._stop.set()
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                pass
            self._thread.join(max(0.1, min(timeout, 2.0)))
        self.finish()
        with self._idle:
            # Still queued when the thread gave up: not recorded, and counted.
            self.dropped += self._pending

    def abandon(self) -> list[Event]:
        """Stop without handling what is queued, and return it (for another sink)."""
        self._stop.set()
        taken = self._queued(sys.maxsize)
        with self._idle:
            self._pending -= len(taken)
            self._idle.notify_all()
        self._queue.put(None)  # wakes the thread, which ends
        return taken

    def _loop(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=self._tick)
            except queue.Empty:
                first = None
            batch = [first] if first is not None else []
            batch += self._queued(BATCH_SIZE - len(batch))
            taken = len(batch)
            now = time.monotonic()
            if self.heartbeat_run and now - self._last_heartbeat >= HEARTBEAT_SECONDS:
                batch.append(RunHeartbeat(run_id=self.heartbeat_run))
                self._last_heartbeat = now
            try:
                self.handle(batch)
            except Exception as error:  # handle() reports its own; this is a bug guard
                self.warn_once("bug", f"The context catalog's writer failed: {error!r}")
            finally:
                with self._idle:
                    self._pending -= taken
                    self._idle.notify_all()
            if self._stop.is_set() and self._queue.empty():
                return

    def _queued(self, limit: int) -> list[Event]:
        """Up to ``limit`` events queued now (not waiting for more)."""
        taken: list[Event] = []
        while len(taken) < limit:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                taken.append(item)
        return taken

    def handle(self, batch: list[Event]) -> None:
        """Write or send one batch (may be empty: a tick)."""
        raise NotImplementedError

    def finish(self) -> None:
        """Called once the thread has stopped (or given up)."""


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else ""


class DaskRelay(QueuedSink):
    """Sends events to the scheduler (``Client.log_event`` on :data:`...fleet.events.
    RECORD_TOPIC`, which only the hub takes), in batches, from its own thread: for an
    executor attached to a cluster whose scheduler plugin writes the catalog."""

    thread_name = "snakemake-context-relay"

    def __init__(
        self, client: object, *, warn: Callable[[str], None], heartbeat_run: str | None = None
    ) -> None:
        super().__init__(warn=warn, tick=0.2, heartbeat_run=heartbeat_run)
        self.client = client
        #: Once abandoned: what the thread took and did not send.
        self.abandoned: list[Event] | None = None
        self.start()

    def abandon(self) -> list[Event]:
        """Stop sending (the scheduler is gone): what is queued, and what the thread
        took meanwhile, for another sink."""
        self.abandoned = []
        taken = super().abandon()
        self._thread.join(1.0)
        return [*self.abandoned, *taken]

    def handle(self, batch: list[Event]) -> None:
        """Send one batch as one message; on failure warn once and drop it."""
        if self.abandoned is not None:  # the scheduler is gone: kept for another sink
            self.abandoned.extend(batch)
            return
        if not batch:
            return
        from ...fleet.events import RECORD_TOPIC, encode

        try:
            self.client.log_event(RECORD_TOPIC, encode(batch))  # type: ignore[attr-defined]
        except Exception as error:
            self.dropped += len(batch)
            self.warn_once(
                "relay",
                "Events for the cluster's context catalog cannot be sent to its scheduler "
                f"({type(error).__name__}: {first_line(error)}); they are not recorded. "
                "The workflow is not affected.",
            )
            return
        self.written += len(batch)
