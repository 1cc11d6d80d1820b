"""GPU discovery through NVML (``nvidia-ml-py``), with a clean CPU fallback.

CUDA and NVML may number devices differently, so servers are pinned by GPU UUID in
``CUDA_VISIBLE_DEVICES`` and every record carries the UUID. Name normalisation and
matching are pure functions, tested against real NVML names.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

__all__ = [
    "GpuInfo",
    "discover_gpus",
    "gpu_model_matches",
    "gpu_model_tokens",
    "normalize_gpu_model",
]

_VENDOR_PREFIXES = ("nvidia ", "amd ", "intel ")


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
    def model(self) -> str:
        """The normalised model name (``"NVIDIA H200"`` -> ``"h200"``)."""
        return normalize_gpu_model(self.name)


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


def gpu_model_matches(requested: str, gpu_name: str) -> bool:
    """Does a rule's ``gpu_model`` match this GPU? (``h200`` matches "NVIDIA H200")."""
    return normalize_gpu_model(requested) in gpu_model_tokens(gpu_name)


def discover_gpus() -> list[GpuInfo]:
    """The GPUs of this machine that this process may use; [] without NVML or GPUs.

    A ``CUDA_VISIBLE_DEVICES`` of indices or UUIDs restricts the list as CUDA would.
    """
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver, no GPU: NVMLError_LibraryNotFound and friends
        return []
    try:
        gpus = [_read_device(pynvml, index) for index in range(pynvml.nvmlDeviceGetCount())]
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return _visible(gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))


def _read_device(pynvml: object, index: int) -> GpuInfo:
    nvml = pynvml
    handle = nvml.nvmlDeviceGetHandleByIndex(index)  # type: ignore[attr-defined]
    name = nvml.nvmlDeviceGetName(handle)  # type: ignore[attr-defined]
    if isinstance(name, bytes):
        name = name.decode()
    uuid = nvml.nvmlDeviceGetUUID(handle)  # type: ignore[attr-defined]
    if isinstance(uuid, bytes):
        uuid = uuid.decode()
    memory = nvml.nvmlDeviceGetMemoryInfo(handle).total  # type: ignore[attr-defined]
    try:
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)  # type: ignore[attr-defined]
        capability: str | None = f"{major}.{minor}"
    except Exception:
        capability = None
    return GpuInfo(
        index=index, uuid=uuid, name=name, memory_bytes=int(memory), compute_capability=capability
    )


def _visible(gpus: list[GpuInfo], visible: str | None) -> list[GpuInfo]:
    if visible is None:
        return gpus
    chosen: list[GpuInfo] = []
    for item in (part.strip() for part in visible.split(",")):
        if not item:
            continue
        if item.isdigit():
            chosen.extend(gpu for gpu in gpus if gpu.index == int(item))
        else:
            chosen.extend(gpu for gpu in gpus if gpu.uuid.startswith(item))
    return chosen
