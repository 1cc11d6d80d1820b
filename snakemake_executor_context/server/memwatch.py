"""The memory watchdog: samples a server's RSS, with its child processes, and says
when it is above the cap (:mod:`.policy` decides what that means for the jobs)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

__all__ = ["SAMPLE_SECONDS", "MemoryWatchdog", "process_tree_rss"]

logger = logging.getLogger(__name__)

#: Seconds between two samples of the memory watchdog.
SAMPLE_SECONDS = 0.5


def process_tree_rss(pid: int | None = None) -> int:
    """Resident bytes of a process and all its descendants."""
    import psutil

    root = psutil.Process(pid)
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total


class MemoryWatchdog:
    """Samples the server's RSS (children included) every :data:`SAMPLE_SECONDS`;
    above ``cap`` it calls ``exceeded(rss)``."""

    def __init__(
        self,
        cap: int,
        exceeded: Callable[[int], None],
        measure: Callable[[], int] = process_tree_rss,
    ) -> None:
        self.cap = cap
        self._exceeded = exceeded
        self._measure = measure
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name="snakemake-context-memory-watchdog", daemon=True
        )
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            try:
                rss = self._measure()
            except Exception as error:
                logger.debug("memory sample failed: %r", error)
                continue
            if rss > self.cap:
                self._exceeded(rss)

    def stop(self) -> None:
        """Stop sampling."""
        self._stop.set()
