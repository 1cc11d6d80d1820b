"""What a pool's pilots can run: each kind of pilot offers what it was asked for until
a pilot of that kind registers, then what that pilot advertises (a node may lack the
GPUs the job script asked for: NVML finds none, and no GPU type names them). A job
that no kind can run, once pilots have registered, fails instead of waiting for the
batch queue forever. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .poolsizing import kind_resources
from .resources import GPU, Requirements, covers, describe_offer

__all__ = ["PilotKinds"]


@dataclass
class PilotKinds:
    """The kinds of pilot of a pool, and what each offers as far as is known."""

    #: Each kind's label (its GPU type, or 'pilot' for a pool of one untyped kind).
    labels: list[str]
    offers: list[dict[str, float]]
    #: Per kind, the pilot whose registration replaced the requested offer.
    seen: list[str | None] = field(default_factory=list)
    #: Per kind, the pilots that form one server (its nodes): a registered pilot
    #: offers its GPUs that many times over, once its gang has assembled.
    nodes: list[int] = field(default_factory=list)

    @classmethod
    def from_summaries(cls, kinds: Sequence[Mapping[str, Any]]) -> PilotKinds:
        """The kinds a cluster's pool reports (gpu_type, gpus, memory_bytes)."""
        labels = [str(k.get("gpu_type") or "pilot") for k in kinds]
        offers = [
            kind_resources(k.get("gpu_type"), int(k.get("gpus", 0)), int(k.get("memory_bytes", 0)))
            for k in kinds
        ]
        nodes = [max(1, int(k.get("nodes", 1) or 1)) for k in kinds]
        return cls(labels, offers, [None] * len(labels), nodes)

    def kind_of(self, name: str) -> int | None:
        """The kind of the pilot called ``name`` ('pilot-<type>-<n>'); None if it is
        not a pilot of this pool."""
        if not name.startswith("pilot-"):
            return None
        if len(self.labels) == 1:
            return 0
        label = name[len("pilot-") :].rpartition("-")[0]
        return self.labels.index(label) if label in self.labels else None

    def joined(self, name: str, resources: Mapping[str, float]) -> None:
        """A server registered: if it is a pilot, its kind offers what it advertises."""
        index = self.kind_of(name)
        if index is not None:
            offer = dict(resources)
            nodes = self.nodes[index] if index < len(self.nodes) else 1
            if nodes > 1:
                offer[GPU] = offer.get(GPU, 0) * nodes
            self.offers[index] = offer
            self.seen[index] = name

    @property
    def registered(self) -> bool:
        """Whether a pilot of any kind has registered."""
        return any(self.seen)

    def refusal(self, label: str, req: Requirements, wanted: Mapping[str, float]) -> str | None:
        """Why no kind of pilot can run a job needing ``wanted`` (None: some kind can,
        or no pilot has registered yet)."""
        if not self.registered or any(covers(offer, wanted) for offer in self.offers):
            return None
        kinds = "; ".join(
            f"{seen} registered offering {describe_offer(offer)}"
            if seen
            else f"kind {kind} (none registered yet) would offer {describe_offer(offer)}"
            for kind, seen, offer in zip(self.labels, self.seen, self.offers, strict=True)
        )
        return (
            f"{label[:1].upper()}{label[1:]} asks for {req.describe()}, which no pilot of the "
            f"pool can run: {kinds}. Fix: --context-pilots gpu_type (the GPU type the batch "
            "system grants, advertised where NVML sees no GPU), gpus or memory, or the "
            "rule's resources."
        )
