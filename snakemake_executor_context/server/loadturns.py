"""Turns to load a context from its shared source (pilots; nothing elsewhere).

Many pilots starting together would all read the same weights from the shared
filesystem at once; a Dask semaphore on the scheduler, one per context, lets at most
``loads_per_source`` servers load it at a time. A load from the node-local cache
reads nothing shared and takes no turn; a context whose source is staged takes its
turn for the copy from the source only. The server hands its :class:`LoadTurns` to
its context cache, which takes a turn around each load.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["LoadTurn", "LoadTurns"]

logger = logging.getLogger(__name__)


class LoadTurn:
    """One server's turn to load one context (ended once, by :meth:`release`)."""

    def __init__(self, semaphore: Any = None) -> None:
        self._semaphore = semaphore

    def release(self) -> None:
        """End the turn (once)."""
        semaphore, self._semaphore = self._semaphore, None
        if semaphore is not None:
            try:
                semaphore.release()
            except Exception as error:  # the lease expired meanwhile: nothing held
                logger.debug("releasing a turn to load: %r", error)


class LoadTurns:
    """At most ``limit`` loads of one context from its source at once (0: no limit)."""

    def __init__(self, limit: int = 0) -> None:
        self.limit = max(0, int(limit))

    def around_load(self, declaration: Any, record: Any, *, cached: bool) -> LoadTurn:
        """The turn held around a load of ``declaration``. A context that stages its
        source (:mod:`..modelcache.staging`) holds none here: the staging takes one around its
        copy from the source alone (``record.source_turn``), and the imports and the
        building that follow hold none."""
        if declaration.stage:
            identity = declaration.identity
            record.source_turn = lambda: self.take(identity, cached=False).release
            return LoadTurn()
        return self.take(declaration.identity, cached=cached)

    def take(self, identity: str, *, cached: bool) -> LoadTurn:
        """Wait for a turn to load ``identity`` (none needed from the local cache,
        without a limit, or outside a Dask worker)."""
        if cached or self.limit <= 0:
            return LoadTurn()
        from distributed import Semaphore, get_worker

        try:
            get_worker()
        except ValueError:  # not in a Dask worker: nothing to coordinate with
            return LoadTurn()
        semaphore = Semaphore(max_leases=self.limit, name=f"snakemake-context-load-{identity[:16]}")
        semaphore.acquire()
        return LoadTurn(semaphore)
