"""Peer or source: where a server that lacks a context's template takes it from, by
measured rates.

A server about to load a context whose template (its files) is not in its node's
cache can fetch the template from a peer that holds it, then load from its cache, or
load from the context's source. The expected time of each:

- from the source: the measured time of this context's loads from its source (a
  converting load, else a load that found no cache and fetched nothing);
- from a peer: the wait until a holder is free (none, when one has a transfer to
  spare; else the soonest end of a busy holder's transfers, as the holder measures
  it), plus the template's bytes at the measured rate of peer transfers, plus the
  measured time of a load from the local cache.

A fast local source beats a busy peer. What is not measured counts as nothing, so
that a peer is taken while nothing says the source is faster (the source's load
never measured; or a peer's time so far unknown and its known parts shorter).
:func:`choose_origin` is pure: the server asks the fleet's hub for the rates and the
holders for their state, and carries out the answer (:mod:`..server.peers.receiver`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .loads import LoadKind

__all__ = ["Choice", "Holder", "Rates", "choose_origin"]


@dataclass(frozen=True)
class Rates:
    """What was measured of a context's loads (None: never measured)."""

    #: Seconds of a load from its source (conversion included).
    source_seconds: float | None = None
    #: Seconds of a load from a server's local cache.
    cache_seconds: float | None = None
    #: Bytes a second of peer transfers that ended ok.
    peer_rate: float | None = None

    def to_wire(self) -> dict[str, float | None]:
        """As a plain dict (the hub's answer to a server)."""
        return {
            "source_seconds": self.source_seconds,
            "cache_seconds": self.cache_seconds,
            "peer_rate": self.peer_rate,
        }

    @classmethod
    def from_wire(cls, wire: object) -> Rates:
        """Rates from :meth:`to_wire`; nothing measured where ``wire`` is not a mapping
        (a hub that could not say). A bad number raises ValueError or TypeError."""
        if not isinstance(wire, Mapping):
            return cls()

        def number(name: str) -> float | None:
            value = wire.get(name)
            return None if value is None else float(value)

        return cls(number("source_seconds"), number("cache_seconds"), number("peer_rate"))


@dataclass(frozen=True)
class Holder:
    """A server that holds the template: its transfers to spare and, when it has
    none, the seconds until its first one is expected to end (None: unknown)."""

    address: str
    spare: int
    wait: float | None = None


@dataclass(frozen=True)
class Choice:
    """Where to take the template from, and why (one line for the job's log)."""

    origin: LoadKind
    #: The holders to try now, most to spare first (empty: none free, wait or read
    #: the source).
    free: tuple[str, ...]
    #: Expected seconds of each way (None: not known).
    peer_seconds: float | None
    source_seconds: float | None
    why: str

    @property
    def wait(self) -> bool:
        """A peer, once a busy holder is free."""
        return self.origin is LoadKind.PEER and not self.free


def choose_origin(rates: Rates, template_bytes: int, holders: Sequence[Holder]) -> Choice:
    """Peer (:attr:`LoadKind.PEER`) or source (:attr:`LoadKind.SOURCE`) for a template of
    ``template_bytes`` that ``holders`` hold (see the module)."""
    source = rates.source_seconds
    if not holders:
        return Choice(LoadKind.SOURCE, (), None, source, "no server holds its template.")
    ordered = sorted(holders, key=lambda h: (-h.spare, h.address))
    free = tuple(h.address for h in ordered if h.spare > 0)
    waits = [h.wait for h in holders if h.wait is not None]
    wait = 0.0 if free else (min(waits) if waits else 0.0)
    transfer = template_bytes / rates.peer_rate if rates.peer_rate and template_bytes > 0 else 0.0
    peer = wait + transfer + (rates.cache_seconds or 0.0)
    if source is None or peer <= source:
        why = "the source's loads are not measured yet." if source is None else "a peer is faster."
        return Choice(LoadKind.PEER, free, peer, source, why)
    busy = f"its holders are busy for {wait:.1f} s more, " if wait > 0 else ""
    why = (
        f"{busy}a peer would take {peer:.1f} s and its source took {source:.1f} s: "
        "the source is faster."
    )
    return Choice(LoadKind.SOURCE, (), peer, source, why)
