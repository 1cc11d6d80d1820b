"""The kinds of context load, one vocabulary for placement, the pool, the catalog and
the ledger.

A load brings a context's weights into a server's memory from one of four places:

- ``conversion``: the loader converted the weights first (a GGUF dequantised into a
  local cache), which costs far more than a later load from that cache;
- ``cache``: from the server's local cache (its loader's cache probe found them);
- ``source``: from where the loader's arguments point (a shared filesystem, a hub);
- ``peer``: the context's template (its files) fetched from another server that holds
  it, into the local cache, which the rest of the load then reads
  (:mod:`..server.peers.receiver`).

The catalog records, per placement, whether the cache probe found the weights
(``placements.from_cache``), how many conversions the load did and how long it took
after the last one (``placements.conversions``, ``placements.reload_seconds``, from
:class:`~.events.ContextReady`): :func:`load_parts` turns those into seconds by kind.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["LoadKind", "load_parts"]


class LoadKind(StrEnum):
    """Where a load took a context's weights from (stored and printed as is)."""

    CONVERSION = "conversion"
    CACHE = "cache"
    SOURCE = "source"
    PEER = "peer"


def load_parts(
    seconds: float,
    *,
    from_cache: bool | None,
    conversions: int | None = 0,
    reload_seconds: float | None = None,
    peer_seconds: float | None = None,
) -> list[tuple[LoadKind, float]]:
    """A load of ``seconds`` split by kind, in the order they happened.

    A load that converted is a conversion up to the last conversion's end, then a load
    from the cache it wrote (``reload_seconds``; without it, all of it is conversion).
    A load that fetched its template from peers is a peer load for ``peer_seconds``,
    then a load from the cache the transfer filled. Otherwise a load is from the cache
    (the probe found the weights) or from the source (no probe, or the probe found
    nothing)."""
    seconds = max(0.0, seconds)
    if peer_seconds is not None and not conversions:
        fetched = min(seconds, max(0.0, peer_seconds))
        rest = seconds - fetched
        return [(LoadKind.PEER, fetched)] + ([(LoadKind.CACHE, rest)] if rest > 0 else [])
    if conversions:
        reload = min(seconds, max(0.0, reload_seconds or 0.0))
        parts = [(LoadKind.CONVERSION, seconds - reload)]
        return parts + ([(LoadKind.CACHE, reload)] if reload > 0 else [])
    return [(LoadKind.CACHE if from_cache else LoadKind.SOURCE, seconds)]
