"""How a server reaches its peers: the other servers' addresses from the scheduler,
calls to their handlers (:mod:`.holder`) over the worker's own connection pool,
which speaks the cluster's mutual TLS, and the fleet hub's measured rates of a
context's loads and transfers. Called from a job's thread; the calls run on the
worker's event loop.

A peer that dies is known at once by a watch: a call it answers only when a session
ends, whose connection closes when its process dies (:meth:`DaskPeers.watch`). Calls
given the watch end as soon as it breaks, as :class:`~.survey.PeerGone`: a call to
a dead peer would otherwise try to connect again and again, for Dask's connect
timeout (30 s)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from ...defaults import PEER_RATES_HANDLER
from ...fleet.peerchoice import Rates
from .survey import PeerGone

__all__ = ["DaskPeers"]

logger = logging.getLogger(__name__)


@dataclass
class DaskPeers:
    """The peers of the Dask worker ``worker``; ``timeout``: seconds one call may take."""

    worker: Any
    timeout: float = 60.0

    def addresses(self) -> list[str]:
        """Every server the scheduler knows but this one."""
        from distributed.utils import sync

        identity = sync(self.worker.loop, self.worker.scheduler.identity)
        return sorted(a for a in identity.get("workers", {}) if a != self.worker.address)

    def rates(self, identity: str, model: str) -> Rates:
        """The hub's measured rates of the context's loads and transfers
        (:meth:`~...fleet.measure.Measurements.rates`); empty when it cannot say."""
        from distributed.utils import sync

        async def ask() -> Any:
            call = getattr(self.worker.scheduler, PEER_RATES_HANDLER)
            return await asyncio.wait_for(call(identity=identity, model=model), self.timeout)

        try:
            reply = sync(self.worker.loop, ask)
        except Exception as error:  # a scheduler without the hub: nothing measured
            logger.debug("rates of %s: %r", identity, error)
            return Rates()
        return Rates.from_wire(reply)

    def call_all(
        self, addresses: list[str], op: str, *, unless: Any = None, **kwargs: Any
    ) -> dict[str, Any]:
        """``op`` on each address at once: its reply, or the exception it raised
        (:class:`~.survey.PeerGone` for each when the watch ``unless`` breaks first)."""
        replies = self._gather(op, [(address, kwargs) for address in addresses], unless)
        return dict(zip(addresses, replies, strict=True))

    def call_each(
        self, address: str, op: str, calls: list[dict[str, Any]], *, unless: Any = None
    ) -> list[Any]:
        """``op`` on ``address`` once per keyword set, all at once (the connection
        pool opens a connection for each): each reply, or the exception it raised."""
        return self._gather(op, [(address, kwargs) for kwargs in calls], unless)

    def watch(self, address: str, op: str, **kwargs: Any) -> Any:
        """Start ``op`` on ``address`` (a call it answers when what it watches ends),
        on a connection of its own: the watch, an asyncio task of the worker's loop."""
        from distributed.utils import sync

        async def start() -> Any:
            return asyncio.ensure_future(getattr(self.worker.rpc(address), op)(**kwargs))

        return sync(self.worker.loop, start)

    def unwatch(self, watch: Any) -> None:
        """Cancel a watch that still runs (its connection is closed)."""
        if watch is not None:
            self.worker.loop.add_callback(_drop, watch)

    def _gather(
        self, op: str, calls: list[tuple[str, dict[str, Any]]], unless: Any = None
    ) -> list[Any]:
        """Every (address, keywords) call of ``op`` at once, on the worker's loop; all
        :class:`~.survey.PeerGone` as soon as the watch ``unless`` breaks."""
        from distributed.utils import sync

        async def one(address: str, kwargs: dict[str, Any]) -> Any:
            return await asyncio.wait_for(
                getattr(self.worker.rpc(address), op)(**kwargs), self.timeout
            )

        async def every() -> list[Any]:
            replies = asyncio.gather(*(one(*call) for call in calls), return_exceptions=True)
            if unless is not None:
                await asyncio.wait({replies, unless}, return_when=asyncio.FIRST_COMPLETED)
                if not replies.done() and _broken(unless):
                    replies.cancel()
                    return [PeerGone("its connection closed")] * len(calls)
            return await replies

        return list(sync(self.worker.loop, every))


def _drop(watch: Any) -> None:
    """On the loop: cancel a watch, or take its outcome (nothing is left unretrieved)."""
    if not watch.done():
        watch.cancel()
    elif not watch.cancelled():
        watch.exception()


def _broken(watch: Any) -> bool:
    """Whether a watch ended with its connection closed (not answered, not cancelled)."""
    return watch.done() and not watch.cancelled() and isinstance(watch.exception(), OSError)
