"""GPU discovery through NVML (``nvidia-ml-py``), with a clean CPU fallback.

CUDA and NVML may number devices differently, so servers are pinned by GPU UUID in
``CUDA_VISIBLE_DEVICES`` and every record carries the UUID. Name normalisation and
matching are pure functions, tested against real NVML names.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "GpuInfo",
    "discover_gpus",
    "gpu_by_uuid",
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


def gpu_model_matches(requested: str, gpu_name: str) -> bool:
    """Does a rule's ``gpu_model`` match this GPU? (``h200`` matches "NVIDIA H200")."""
    return normalize_gpu_model(requested) in gpu_model_tokens(gpu_name)


def discover_gpus() -> list[GpuInfo]:
    """The GPUs of this machine that this process may use; [] without NVML or GPUs.

    A GPU in MIG mode is listed as its MIG devices (CUDA can use only those). A
    ``CUDA_VISIBLE_DEVICES`` of indices or UUIDs restricts the list as CUDA would.
    """
    return _visible(_all_devices(), os.environ.get("CUDA_VISIBLE_DEVICES"))


def gpu_by_uuid(uuid: str) -> GpuInfo | None:
    """The NVML record of one GPU or MIG device, by UUID (what a server pinned with
    ``CUDA_VISIBLE_DEVICES=<uuid>`` reads about itself); None if NVML lacks it."""
    for gpu in _all_devices():
        if gpu.uuid == uuid:
            return gpu
    return None


def _all_devices() -> list[GpuInfo]:
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver, no GPU: NVMLError_LibraryNotFound and friends
        return []
    try:
        found: list[GpuInfo] = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            found.extend(_read_device(pynvml, index))
        return found
    except Exception:
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _read_device(pynvml: object, index: int) -> list[GpuInfo]:
    nvml: Any = pynvml
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    try:
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        capability: str | None = f"{major}.{minor}"
    except Exception:
        capability = None
    migs = _mig_devices(nvml, handle, index, capability)
    if migs:
        return migs
    return [
        GpuInfo(
            index=index,
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            name=_text(nvml.nvmlDeviceGetName(handle)),
            memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
            compute_capability=capability,
        )
    ]


def _mig_devices(nvml: Any, handle: object, index: int, capability: str | None) -> list[GpuInfo]:
    """The MIG devices of a GPU in MIG mode; [] otherwise."""
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except Exception:  # not supported by this GPU or driver
        return []
    if current != getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
        return []
    parent = _text(nvml.nvmlDeviceGetUUID(handle))
    found = []
    for mig_index in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, mig_index)
        except Exception:  # an empty slot: NVMLError_NotFound
            continue
        found.append(
            GpuInfo(
                index=index,
                uuid=_text(nvml.nvmlDeviceGetUUID(mig)),
                name=_text(nvml.nvmlDeviceGetName(mig)),
                memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(mig).total),
                compute_capability=capability,
                is_mig=True,
                extra={"parent_uuid": parent, "mig_index": str(mig_index)},
            )
        )
    return found


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
