"""The status loop's helpers in Snakemake's process: waking the loop from any thread
(:class:`Waker`) with the fleet's events as stimuli (:class:`FleetInbox`), the
periodic fleet check (:class:`FleetPoll`), the servers' cache probes asked in the
background (:class:`CacheProbes`), and a Ctrl-C Snakemake's main thread swallowed,
raised again (:class:`CtrlC`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..defaults import DEMAND_KEY, POOL_FAILURE_KEY
from ..dispatch.machine import FLEET_CHECK_SECONDS, Dispatch
from ..dispatch.vocabulary import (
    CachesProbed,
    FleetEvent,
    PoolFailed,
    ServersPolled,
    Stimulus,
    Tick,
)
from ..fleet import events as ev
from ..fleet.poolsizing import WITHDRAWN

if TYPE_CHECKING:
    from ..cluster.connection import ClusterConnection

__all__ = ["WAKING_EVENTS", "CacheProbes", "FleetInbox", "FleetPoll", "Waker"]


logger = logging.getLogger(__name__)

Found = Mapping[str, tuple[str, ...]]

#: Fleet events after which placement may find a free slot or a warm server.
WAKING_EVENTS = (ev.JobFinished, ev.ServerJoined, ev.ServerLeft, ev.ContextEvicted)


class Waker:
    """A wake-up flag that an asyncio loop can wait on and any thread can set.

    Waking the status loop from any thread (Dask callbacks run on a client thread,
    Snakemake hands out jobs on its own): the loop sleeps until woken or until its
    interval ends; the fleet's events arrive as stimuli (:class:`FleetInbox`).
    """

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
    (What this run records goes to the hub on another topic, and never comes back.)"""

    def __init__(
        self,
        seen: Iterable[Callable[[list[ev.Event]], Any]],
        put: Callable[[FleetEvent], None],
        wake: Callable[[], None],
    ) -> None:
        self.seen, self.put, self.wake = list(seen), put, wake

    def __call__(self, event: tuple[float, Any]) -> None:
        """One message of the fleet's topic (``(time, encoded events)``)."""
        try:
            decoded = list(ev.decode(event[1]))
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


class FleetPoll:
    """Puts the fleet check's stimuli into the executor's inbox when one is due.

    The executor's periodic fleet check, every :data:`~..dispatch.machine.FLEET_CHECK_SECONDS`:
    the cluster's workers as a stimulus (Dask's list is the membership when no scheduler
    plugin sends events), what the run still asks of a pool of pilots, a submission the
    pool could not make (since the run attached to it: the run ends on it), and the clock.

    The demand carries a sequence number that grows with each check: a pool reads a
    demand whose number stopped growing as withdrawn (a Snakemake killed before its
    shutdown), and the shutdown withdraws it at once (:meth:`FleetPoll.withdraw`).
    """

    def __init__(
        self,
        connection: ClusterConnection,
        dispatch: Dispatch,
        put: Callable[[Stimulus], None],
        debug: Callable[[str], None],
    ) -> None:
        self._connection, self._dispatch, self._put, self._debug = connection, dispatch, put, debug
        self._last = 0.0
        self._sequence = 0
        #: A pool's failed submission from then on ends the run (an attached pool's
        #: failures before the run began are not its own).
        self._failures_since = 0.0 if connection.embedded else time.time()

    def __call__(self, now: float) -> None:
        """Check the fleet if the last check is at least the interval old."""
        if now - self._last < FLEET_CHECK_SECONDS:
            return
        self._last = now
        try:
            self._put(ServersPolled(self._connection.workers(), now))
            # Tell the cluster's pool of pilots, if any, what the run still asks of it.
            self._sequence += 1
            demand = replace(self._dispatch.pool_demand(), sequence=self._sequence)
            self._connection.client.set_metadata(DEMAND_KEY, demand.to_wire())
            if self._dispatch.pool is not None:
                self._pool_failure(now)
        except Exception as error:
            self._debug(f"Cannot list the cluster's workers: {error}")
        self._put(Tick(now))

    def _pool_failure(self, now: float) -> None:
        """The pool's failed submission (:mod:`..pilots.pool` publishes it), once."""
        failure = self._connection.client.get_metadata(POOL_FAILURE_KEY, default=None)
        if isinstance(failure, Mapping) and float(failure.get("at", 0)) >= self._failures_since:
            self._failures_since = float("inf")
            self._put(PoolFailed(str(failure.get("line", "")), now))

    def withdraw(self) -> None:
        """The run ends: it asks nothing more of a pool of pilots (an attached pool would
        otherwise keep, and replace, pilots for the run's last published demand)."""
        if self._dispatch.scheduler_lost is not None:
            return
        try:
            self._connection.client.set_metadata(DEMAND_KEY, dict(WITHDRAWN))
        except Exception as error:  # the scheduler closed first: nothing to withdraw from
            self._debug(f"Cannot withdraw the run's demand: {error}")


class CacheProbes:
    """Runs ``probe`` on a thread when asked (:meth:`ask`) and hands ``done`` its answer
    (a :class:`~..dispatch.vocabulary.CachesProbed`).

    The servers' cache probes, asked in the background.

    A probe runs every declared context's cache probe on every server, which imports the
    loader's module there: seconds for a loader that imports torch. Asked in line, it held
    up the run's start (2.5 s of a 10 s start, measured) and the status loop whenever a
    server joined or a conversion filled a cache. Here one probe runs at a time on its own
    thread; asked again meanwhile, it runs once more when it ends; each answer goes to
    ``done`` as a stimulus of the dispatch machine.
    """

    def __init__(self, probe: Callable[[], Found], done: Callable[[CachesProbed], None]) -> None:
        self._probe, self._done = probe, done
        self._lock = threading.Lock()
        self._running = False
        self._again = False

    def ask(self) -> None:
        """Probe now, or once more after the probe under way."""
        with self._lock:
            if self._running:
                self._again = True
                return
            self._running = True
        threading.Thread(target=self._run, name="context-cache-probes", daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                self._done(CachesProbed(dict(self._probe()), time.time()))
            except Exception as error:  # the cluster closing under it: nothing to say
                logger.debug("cache probes: %r", error)
            with self._lock:
                if not self._again:
                    self._running = False
                    return
                self._again = False
