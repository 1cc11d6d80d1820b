"""GPU records and model names, as pure functions (tested against real NVML names).

Discovery through NVML is :mod:`..server.nvml`; what a rule's ``gpu_model`` may say
is one of :func:`gpu_model_tokens` of the GPU's name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["STAND_IN_SOURCE", "GpuInfo", "gpu_model_tokens", "normalize_gpu_model", "stands_in"]

_VENDOR_PREFIXES = ("nvidia ", "amd ", "intel ")
#: The ``extra["source"]`` of a GPU a pilot advertises by its type where NVML sees none
#: (a test node's fake GRES): the batch system granted it, but CUDA cannot use it.
STAND_IN_SOURCE = "pilot gpu_type (NVML saw no GPU)"


@dataclass(frozen=True)
class GpuInfo:
    """One GPU (or MIG device) as NVML reports it."""

    index: int
    uuid: str
    name: str
    memory_bytes: int
    compute_capability: str | None = None
    is_mig: bool = False
    manufacturer: str = "nvidia"
    extra: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def server_name(self) -> str:
        """The name of the server pinned to it: ``gpu0``, or ``gpu0-mig1``."""
        if self.is_mig:
            return f"gpu{self.index}-mig{self.extra.get('mig_index', 0)}"
        return f"gpu{self.index}"


def normalize_gpu_model(name: str) -> str:
    """Lower case, vendor prefix stripped, spaces collapsed to '-'.

    >>> normalize_gpu_model("NVIDIA A100-SXM4-80GB")
    'a100-sxm4-80gb'
    """
    text = " ".join(name.lower().split())
    for prefix in _VENDOR_PREFIXES:
        if text.startswith(prefix):
            text = text[len(prefix) :]
            break
    return text.replace(" ", "-")


def gpu_model_tokens(name: str) -> set[str]:
    """The normalised name and its parts: what a rule's ``gpu_model`` may say."""
    normalized = normalize_gpu_model(name)
    tokens = {normalized}
    tokens.update(token for token in re.split(r"[-_ /()]+", normalized) if token)
    return tokens


def stands_in(record: dict[str, object] | None) -> bool:
    """Whether a GPU record (a GpuInfo as a dict) is a stand-in, not a CUDA device."""
    extra = (record or {}).get("extra")
    return isinstance(extra, dict) and extra.get("source") == STAND_IN_SOURCE
