"""The devices a process owns: what a context server hands its loaders.

A server that owns k GPUs (``--context-gpus-per-server k``, ``up --gpus-per-server
k``, ``--context-pilots gpus=k``) sees them as ``cuda:0`` .. ``cuda:k-1`` (its
``CUDA_VISIBLE_DEVICES`` lists their UUIDs); a CPU server that stands in for k GPUs
owns k ``cpu`` devices. The server writes the list to
:data:`~..defaults.DEVICES_VARIABLE` when it starts; a loader reads it with
:func:`server_devices` (one process, layers split with ``device_map="auto"``), and a
gang puts one rank on each (:mod:`.driver`).

Standard library only (torch is asked, lazily, only by a process that is not a server
and has no ``CUDA_VISIBLE_DEVICES``).
"""

from __future__ import annotations

import os

from ..defaults import DEVICES_VARIABLE

__all__ = ["device_list", "server_devices"]


def device_list(gpus: int, stand_ins: int = 0) -> list[str]:
    """``gpus`` CUDA devices in order, else ``stand_ins`` CPU ones (at least one)."""
    if gpus > 0:
        return [f"cuda:{index}" for index in range(gpus)]
    return ["cpu"] * max(1, stand_ins)


def server_devices() -> list[str]:
    """The devices this process owns, in order: ``["cuda:0", "cuda:1"]`` on a server of
    two GPUs, ``["cpu", "cpu", "cpu"]`` on a CPU server standing in for three.

    Outside a server (a job's own process under another executor): the GPUs its
    ``CUDA_VISIBLE_DEVICES`` lists, else those torch sees, else one ``cpu``.
    """
    named = os.environ.get(DEVICES_VARIABLE, "").strip()
    if named:
        return [part.strip() for part in named.split(",") if part.strip()]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        entries = [part for part in visible.split(",") if part.strip() and part.strip() != "-1"]
        return device_list(len(entries))
    try:
        import torch

        return device_list(torch.cuda.device_count() if torch.cuda.is_available() else 0)
    except ImportError:
        return device_list(0)
