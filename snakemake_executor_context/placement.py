"""Placement policy as pure functions: which servers can run a job, and why not.

No I/O here: the executor passes in what it knows of the fleet (server names and the
Dask resources each advertises) and gets decisions and messages back.

Servers advertise Dask resources (see :func:`server_resources`):

``gpu``                 GPUs of the server (a CPU server of the embedded cluster on a
                        machine without GPUs stands in for one)
``mem_mb``              the server's memory in MB
``gpu_model:<token>``   one per token of its GPU's normalised model name
``gpu_manufacturer:<x>`` the GPU's maker

A job asks for the same names (see :func:`job_resources`), so Dask itself keeps a job
off servers that cannot run it, also after a server restarts under a new address.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .gpus import GpuInfo, gpu_model_tokens, normalize_gpu_model

__all__ = [
    "Requirements",
    "ServerView",
    "explain_unrunnable",
    "job_resources",
    "requirements_from",
    "runnable_on",
    "server_resources",
]

GPU = "gpu"
MEM_MB = "mem_mb"
GPU_MODEL_PREFIX = "gpu_model:"
GPU_MANUFACTURER_PREFIX = "gpu_manufacturer:"


@dataclass(frozen=True)
class Requirements:
    """What a job needs from the one server that runs it."""

    gpu: int = 0
    gpu_model: str | None = None
    gpu_manufacturer: str | None = None
    mem_mb: int | None = None

    def describe(self) -> str:
        """'gpu=1, gpu_model=h200, mem_mb=1000' (only what is asked for)."""
        parts = []
        if self.gpu:
            parts.append(f"gpu={self.gpu}")
        if self.gpu_model:
            parts.append(f"gpu_model={self.gpu_model}")
        if self.gpu_manufacturer:
            parts.append(f"gpu_manufacturer={self.gpu_manufacturer}")
        if self.mem_mb:
            parts.append(f"mem_mb={self.mem_mb}")
        return ", ".join(parts) or "nothing"


@dataclass(frozen=True)
class ServerView:
    """One server as the executor sees it."""

    name: str
    address: str
    resources: Mapping[str, float]

    def describe(self) -> str:
        """'server-0 (gpu=1, h200, mem_mb=12000)'."""
        res = self.resources
        models = sorted(
            key[len(GPU_MODEL_PREFIX) :] for key in res if key.startswith(GPU_MODEL_PREFIX)
        )
        model = max(models, key=len) if models else None
        parts = [f"gpu={res.get(GPU, 0):g}"]
        if model:
            parts.append(model)
        if MEM_MB in res:
            parts.append(f"mem_mb={res[MEM_MB]:g}")
        return f"{self.name} ({', '.join(parts)})"


def requirements_from(resources: Mapping[str, object]) -> Requirements:
    """Read a job's requirements from its Snakemake resources (unevaluated ones skipped)."""

    def integer(name: str) -> int | None:
        value = resources.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        return int(value)

    def text(name: str) -> str | None:
        value = resources.get(name)
        if not isinstance(value, str) or not value or value == "<TBD>":
            return None
        return value

    return Requirements(
        gpu=integer("gpu") or 0,
        gpu_model=text("gpu_model"),
        gpu_manufacturer=text("gpu_manufacturer"),
        mem_mb=integer("mem_mb"),
    )


def job_resources(req: Requirements) -> dict[str, float]:
    """The Dask resource restrictions of a job."""
    out: dict[str, float] = {}
    if req.gpu:
        out[GPU] = req.gpu
    if req.gpu_model:
        out[GPU_MODEL_PREFIX + normalize_gpu_model(req.gpu_model)] = 1
    if req.gpu_manufacturer:
        out[GPU_MANUFACTURER_PREFIX + req.gpu_manufacturer.lower()] = 1
    if req.mem_mb:
        out[MEM_MB] = req.mem_mb
    return out


def server_resources(
    memory_bytes: int, gpus: Sequence[GpuInfo] = (), *, stand_in_gpus: int = 0
) -> dict[str, float]:
    """The Dask resources a server advertises.

    ``stand_in_gpus`` lets a CPU server satisfy ``gpu=1`` (the embedded cluster on a
    machine without GPUs).
    """
    res: dict[str, float] = {MEM_MB: memory_bytes // 1_000_000}
    res[GPU] = len(gpus) if gpus else stand_in_gpus
    for gpu in gpus:
        for token in gpu_model_tokens(gpu.name):
            res[GPU_MODEL_PREFIX + token] = res.get(GPU_MODEL_PREFIX + token, 0) + 1
        key = GPU_MANUFACTURER_PREFIX + gpu.manufacturer.lower()
        res[key] = res.get(key, 0) + 1
    return res


def runnable_on(req: Requirements, servers: Sequence[ServerView]) -> list[ServerView]:
    """The servers whose advertised resources cover the job's requirements."""
    wanted = job_resources(req)
    return [
        server
        for server in servers
        if all(server.resources.get(name, 0) >= amount for name, amount in wanted.items())
    ]


def explain_unrunnable(
    rule: str, req: Requirements, servers: Sequence[ServerView], *, waited: float
) -> str:
    """Why no server can run a job, naming rule, resource, servers seen and the fix."""
    wanted = job_resources(req)
    seen = "; ".join(server.describe() for server in servers) or "no servers at all"
    reasons = []
    if req.gpu and not any(s.resources.get(GPU, 0) >= req.gpu for s in servers):
        best = max((s.resources.get(GPU, 0) for s in servers), default=0)
        reasons.append(f"gpu={req.gpu} but the servers have at most {best:g}")
    if req.gpu_model:
        key = GPU_MODEL_PREFIX + normalize_gpu_model(req.gpu_model)
        if not any(key in s.resources for s in servers):
            reasons.append(f"gpu_model={req.gpu_model!r} but no server has that GPU model")
    if req.gpu_manufacturer:
        key = GPU_MANUFACTURER_PREFIX + req.gpu_manufacturer.lower()
        if not any(key in s.resources for s in servers):
            reasons.append(f"gpu_manufacturer={req.gpu_manufacturer!r} but no server has one")
    if req.mem_mb and not any(s.resources.get(MEM_MB, 0) >= req.mem_mb for s in servers):
        best = max((s.resources.get(MEM_MB, 0) for s in servers), default=0)
        reasons.append(f"mem_mb={req.mem_mb} but the largest server has {best:g} MB")
    if not reasons:
        reasons.append(f"no single server offers all of {wanted}")
    waited_text = f" after waiting {waited:.0f} s" if waited >= 1 else ""
    return (
        f"No context server can run rule '{rule}'{waited_text}: {'; '.join(reasons)}. "
        f"Servers seen: {seen}. Fix: change the rule's resources (--set-resources "
        f"{rule}:...), or start servers that have them."
    )
