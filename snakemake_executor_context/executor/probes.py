"""The servers' cache probes, asked in the background.

A probe runs every declared context's cache probe on every server, which imports the
loader's module there: seconds for a loader that imports torch. Asked in line, it held
up the run's start (2.5 s of a 10 s start, measured) and the status loop whenever a
server joined or a conversion filled a cache. Here one probe runs at a time on its own
thread; asked again meanwhile, it runs once more when it ends; each answer goes to
``done`` as a stimulus of the dispatch machine."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from ..dispatch.vocabulary import CachesProbed

__all__ = ["CacheProbes"]

logger = logging.getLogger(__name__)

Found = Mapping[str, tuple[str, ...]]


class CacheProbes:
    """Runs ``probe`` on a thread when asked (:meth:`ask`) and hands ``done`` its answer
    (a :class:`~.vocabulary.CachesProbed`)."""

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
