"""What a holder answers a receiver: :class:`TemplateOffer` (whether it holds a
template and would serve it) and :class:`Chunk` (a piece of one of its files), each
written by the holder with ``to_wire`` and read by the receiver with ``from_wire``.

A reply that is not what ``from_wire`` expects raises :class:`MalformedReply`: the
receiver takes it as that holder's failure and tries another, or the source. The
holder's other two answers carry nothing: ``done`` answers ``{}``, ``watch``
answers once its session has ended.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CHUNK_OP",
    "DONE_OP",
    "TEMPLATE_OP",
    "WATCH_OP",
    "Chunk",
    "MalformedReply",
    "TemplateOffer",
]

#: The handlers a holder adds to its server (:meth:`.holder.TemplateHolder.install`).
TEMPLATE_OP = "snakemake_context_template"
CHUNK_OP = "snakemake_context_chunk"
DONE_OP = "snakemake_context_template_done"
WATCH_OP = "snakemake_context_template_watch"


class MalformedReply(ValueError):
    """A holder's reply that is not the record it should be."""


@dataclass(frozen=True)
class TemplateOffer:
    """Whether a server holds a template, and what it would do for a receiver."""

    held: bool
    #: Why it does not hold it (not in its cache, or its entry is unusable).
    why: str = ""
    #: More transfers it would serve now (0 or less: all its turns are taken).
    spare: int = 0
    #: The template's bytes (its manifest's total).
    nbytes: int = 0
    #: Seconds until its first transfer ends, when it has none to spare.
    wait: float | None = None
    #: Asked to begin: the session's token and the manifest (JSON) it serves, or
    #: why it refused (all its turns taken meanwhile).
    token: str = ""
    manifest: str = ""
    refused: str = ""

    def to_wire(self) -> dict[str, Any]:
        """As a plain dict (msgpack-able)."""
        return {
            "held": self.held,
            "why": self.why,
            "spare": self.spare,
            "bytes": self.nbytes,
            "wait": self.wait,
            "token": self.token,
            "manifest": self.manifest,
            "refused": self.refused,
        }

    @classmethod
    def from_wire(cls, wire: object) -> TemplateOffer:
        """An offer from :meth:`to_wire` (:class:`MalformedReply` if it is not one)."""
        if not isinstance(wire, Mapping):
            raise MalformedReply(f"an offer is a mapping, not {type(wire).__name__}")
        try:
            wait = wire.get("wait")
            return cls(
                held=bool(wire["held"]),
                why=str(wire.get("why") or ""),
                spare=int(wire.get("spare") or 0),
                nbytes=int(wire.get("bytes") or 0),
                wait=None if wait is None else float(wait),
                token=str(wire.get("token") or ""),
                manifest=str(wire.get("manifest") or ""),
                refused=str(wire.get("refused") or ""),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise MalformedReply(f"an offer with a bad field: {error!r}") from None


@dataclass(frozen=True)
class Chunk:
    """Up to a chunk's bytes of one file of a template, or why there are none."""

    data: bytes = b""
    error: str = ""

    def to_wire(self) -> dict[str, Any]:
        """As the handler's reply: the bytes go as one frame, not through msgpack."""
        if self.error:
            return {"error": self.error}
        from distributed.protocol import to_serialize

        return {"data": to_serialize(self.data)}

    @classmethod
    def from_wire(cls, wire: object) -> Chunk:
        """A chunk from :meth:`to_wire` as it arrives (:class:`MalformedReply` if it is
        neither bytes nor an error)."""
        if isinstance(wire, Mapping):
            if wire.get("error"):
                return cls(error=str(wire["error"]))
            data = wire.get("data")
            if isinstance(data, bytes):
                return cls(data=data)
        raise MalformedReply("a chunk reply with neither data nor an error")
