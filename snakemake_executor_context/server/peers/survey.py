"""Which holder a receiver fetches a template from (:mod:`.receiver`), or whether it
reads the source instead: every other server is asked at once whether it holds the
template, how many transfers it would serve and, when it serves all it may, when its
first ends; the fleet hub tells the measured rates of the context's loads and of
peer transfers; the pure choice (:func:`...fleet.peerchoice.choose_origin`) says peer
or source. While every holder is busy and a peer is still the faster way, the
holders are asked again every half second, up to the receiver's wait.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ...contexts import ContextDeclaration
from ...defaults import PEER_WAIT_SECONDS
from ...fleet.loads import LoadKind
from ...fleet.peerchoice import Holder, Rates, choose_origin
from .wire import TEMPLATE_OP, MalformedReply, TemplateOffer

__all__ = ["HolderPick", "PeerGone", "Peers", "wire"]

logger = logging.getLogger(__name__)


class PeerGone(OSError):
    """The reply of a call to a peer whose watch broke (:meth:`Peers.watch`): it died,
    or its connection to this server closed."""


class Peers(Protocol):
    """How a receiver reaches the other servers (:class:`.reach.DaskPeers`)."""

    def addresses(self) -> list[str]:
        """The other servers' addresses."""
        ...

    def call_all(
        self, addresses: list[str], op: str, *, unless: Any = None, **kwargs: Any
    ) -> dict[str, Any]:
        """``op`` on every server at once: its reply, or the exception it raised
        (:class:`PeerGone` for each, at once, when the watch ``unless`` breaks first)."""
        ...

    def call_each(
        self, address: str, op: str, calls: list[dict[str, Any]], *, unless: Any = None
    ) -> list[Any]:
        """``op`` on one server once per keyword set, all at once: each reply, or the
        exception it raised, in order (as :meth:`call_all` for ``unless``)."""
        ...

    def watch(self, address: str, op: str, **kwargs: Any) -> Any:
        """Start ``op`` on ``address``, a call the peer answers only when what it
        watches ends: the watch, for ``unless`` (it breaks when the peer's connection
        closes: the peer died)."""
        ...

    def unwatch(self, watch: Any) -> None:
        """Stop a watch :meth:`watch` started."""
        ...

    def rates(self, identity: str, model: str) -> Rates:
        """The fleet's measured rates of the context's loads and transfers (None
        where not known)."""
        ...


@dataclass
class HolderPick:
    """Picks holders for the server at ``address``; ``say`` writes a line to the
    running job's log."""

    address: str
    peers: Peers
    say: Callable[[str], None] = print
    #: Seconds to wait for a busy holder before reading the source instead.
    wait: float = PEER_WAIT_SECONDS
    #: The server's GPU model, whose measured loads count first.
    model: str = ""

    def free(self, declaration: ContextDeclaration, deadline: float) -> list[str]:
        """The holders with a transfer to spare, least busy first; while every holder
        is busy, asked again every half second until ``deadline`` (``time.monotonic``;
        a receiver that finishes becomes a holder too). Empty: nobody holds it, the
        source is expected sooner (:func:`...fleet.peerchoice.choose_origin`), or all
        stayed busy."""
        said = False
        rates: Rates | None = None
        while True:
            held, nbytes = self._holders(declaration)
            if not held:
                return []
            if rates is None:
                rates = self._rates(declaration)
            choice = choose_origin(rates, nbytes, held)
            if choice.origin is LoadKind.SOURCE:
                self.say(f"Context '{declaration.name}': {choice.why} Loading it from its source.")
                return []
            if choice.free:
                return list(choice.free)
            if time.monotonic() >= deadline:
                self.say(
                    f"Context '{declaration.name}': its {len(held)} holder(s) stayed busy "
                    f"for {self.wait:.0f} s. Loading it from its source."
                )
                return []
            if not said:
                self.say(f"Context '{declaration.name}': waiting for a peer to send it.")
                said = True
            time.sleep(0.5)

    def _holders(self, declaration: ContextDeclaration) -> tuple[list[Holder], int]:
        """The servers holding the template, most to spare first, and its bytes."""
        addresses = [a for a in self.peers.addresses() if a != self.address]
        if not addresses:
            return [], 0
        replies = self.peers.call_all(
            addresses,
            TEMPLATE_OP,
            identity=declaration.identity,
            declaration=wire(declaration),
        )
        held = {}
        for address, reply in replies.items():
            try:
                offer = TemplateOffer.from_wire(reply)
            except MalformedReply as error:  # a failed call (an exception), or not an offer
                logger.debug("%s: no offer of %s: %s", address, declaration.name, error)
                continue
            if offer.held:
                held[address] = offer
        holders = [Holder(a, offer.spare, offer.wait) for a, offer in held.items()]
        nbytes = max((offer.nbytes for offer in held.values()), default=0)
        return sorted(holders, key=lambda h: (-h.spare, h.address)), nbytes

    def _rates(self, declaration: ContextDeclaration) -> Rates:
        """The fleet's measured rates of this context (none known: all None)."""
        try:
            return self.peers.rates(declaration.identity, self.model)
        except Exception as error:  # nothing measured is the default: take a peer
            logger.debug("rates of %s: %r", declaration.name, error)
            return Rates()


def wire(declaration: ContextDeclaration) -> dict[str, Any]:
    """What a holder is told of the declaration (it recomputes the identity)."""
    return {"name": declaration.name, **declaration.to_config()}
