"""GPU discovery through NVML (``nvidia-ml-py``), with a clean CPU fallback.

Runs in the cluster process (one server per GPU) and in each server (its own GPU).
CUDA and NVML may number devices differently, so servers are pinned by GPU UUID in
``CUDA_VISIBLE_DEVICES`` and every record carries the UUID.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ..fleet.gpus import GpuInfo

__all__ = ["discover_gpus", "gpu_by_uuid"]

logger = logging.getLogger(__name__)


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
    except Exception as error:  # no driver, no GPU: NVMLError_LibraryNotFound and friends
        logger.debug("no NVML: %r", error)
        return []
    try:
        found: list[GpuInfo] = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            found.extend(_read_device(pynvml, index))
        return found
    except Exception as error:
        logger.debug("NVML could not list the GPUs: %r", error)
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception as error:
            logger.debug("nvmlShutdown: %r", error)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _read_device(pynvml: object, index: int) -> list[GpuInfo]:
    nvml: Any = pynvml
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    try:
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        capability: str | None = f"{major}.{minor}"
    except Exception as error:
        logger.debug("no compute capability for GPU %d: %r", index, error)
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
    except Exception as error:  # not supported by this GPU or driver
        logger.debug("no MIG mode for GPU %d: %r", index, error)
        return []
    if current != getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
        return []
    parent = _text(nvml.nvmlDeviceGetUUID(handle))
    found = []
    for mig_index in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, mig_index)
        except Exception:
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


def own_gpu(configured: dict[str, Any] | None) -> dict[str, Any] | None:
    """A server's GPU record, read through NVML by the UUID it is pinned to.

    CUDA and NVML may number devices differently: only the UUID is trusted. Without
    a configured GPU, a single visible GPU is taken; a CPU server (no
    ``CUDA_VISIBLE_DEVICES`` GPU, no NVML) has none.
    """
    from dataclasses import asdict

    try:
        if configured and configured.get("uuid"):
            found = gpu_by_uuid(str(configured["uuid"]))
            return asdict(found) if found is not None else configured
        if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
            return None
        visible = discover_gpus()
        return asdict(visible[0]) if len(visible) == 1 else configured
    except Exception as error:
        logger.debug("reading this server's GPU through NVML: %r", error)
        return configured
