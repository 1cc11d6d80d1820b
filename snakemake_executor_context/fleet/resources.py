"""What a job needs from the one server that runs it, what a server offers, and the
one check between them.

Servers advertise Dask resources (see :func:`server_resources`):

``gpu``                  GPUs of the server (a CPU server of the embedded cluster on a
                         machine without GPUs stands in for one)
``mem_mb``               the server's memory in MB
``gpu_model:<token>``    one per token of its GPU's normalised model name
``gpu_manufacturer:<x>`` the GPU's maker

A job asks for the same names (see :func:`job_resources`), so Dask itself keeps a job
off servers that cannot run it, also after a server restarts under a new address.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from .gpus import GpuInfo, gpu_model_tokens, normalize_gpu_model

__all__ = [
    "GPU",
    "GPU_MANUFACTURER_PREFIX",
    "GPU_MODEL_PREFIX",
    "MEM_MB",
    "Advertised",
    "Requirements",
    "covers",
    "describe_offer",
    "explain_unrunnable",
    "job_resources",
    "requirements_from",
    "server_resources",
    "widest",
]

GPU = "gpu"
MEM_MB = "mem_mb"
GPU_MODEL_PREFIX = "gpu_model:"
GPU_MANUFACTURER_PREFIX = "gpu_manufacturer:"
#: What Snakemake puts in a resource that is only known where the job runs.
UNKNOWN = "<TBD>"


class Advertised(Protocol):
    """A server as far as resources go: a name and the Dask resources it offers."""

    @property
    def name(self) -> str: ...

    @property
    def resources(self) -> Mapping[str, float]: ...

    def describe(self) -> str: ...


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


def requirements_from(resources: Mapping[str, object]) -> Requirements:
    """Read a job's requirements from its Snakemake resources (unevaluated ones skipped)."""

    def integer(name: str) -> int | None:
        value = resources.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        return int(value)

    def text(name: str) -> str | None:
        value = resources.get(name)
        if not isinstance(value, str) or not value or value == UNKNOWN:
            return None
        return value

    return Requirements(
        gpu=integer("gpu") or 0,
        gpu_model=text("gpu_model"),
        gpu_manufacturer=text("gpu_manufacturer"),
        mem_mb=integer("mem_mb"),
    )


def widest(each: Iterable[Requirements]) -> Requirements:
    """What one server needs to run each of several jobs (a group's members), as it
    runs them, each in its own slots: the most GPUs and memory any of them asks,
    never their sum; the GPU model and manufacturer of the first that names one
    (the caller checks that they agree)."""
    each = list(each)
    memory = [r.mem_mb for r in each if r.mem_mb]
    return Requirements(
        gpu=max((r.gpu for r in each), default=0),
        gpu_model=next((r.gpu_model for r in each if r.gpu_model), None),
        gpu_manufacturer=next((r.gpu_manufacturer for r in each if r.gpu_manufacturer), None),
        mem_mb=max(memory) if memory else None,
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


def covers(offered: Mapping[str, float], wanted: Mapping[str, float]) -> bool:
    """Whether a server's advertised resources cover a job's: the one can-run check."""
    return all(offered.get(name, 0) >= amount for name, amount in wanted.items())


def model_from_resources(resources: Mapping[str, float]) -> str | None:
    """The most specific GPU model token a server advertises (None without one)."""
    tokens = [key[len(GPU_MODEL_PREFIX) :] for key in resources if key.startswith(GPU_MODEL_PREFIX)]
    return max(sorted(tokens), key=len) if tokens else None


def explain_unrunnable(
    label: str, req: Requirements, servers: Iterable[Advertised], *, waited: float, planned: int = 0
) -> str:
    """Why no server can run a job, naming the job (``label``: "rule 'x'" or "group
    'g'"), the resource, the servers seen and the fix; with fewer servers than the
    ``planned`` fleet, that lost servers did not come back."""
    servers = list(servers)
    wanted = job_resources(req)
    seen = "; ".join(server.describe() for server in servers) or "no servers at all"
    waited_text = f" after waiting {waited:.0f} s" if waited >= 1 else ""
    if len(servers) < planned:
        return (
            f"No context server can run {label}{waited_text}: {len(servers)} of {planned} "
            f"planned servers are running, the lost ones did not come back. Servers seen: "
            f"{seen}. Fix: read the cluster's log (named on the run's first lines) for why."
        )
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
    fix_target = label.split("'")[1] if label.count("'") >= 2 else label
    return (
        f"No context server can run {label}{waited_text}: {'; '.join(reasons)}. "
        f"Servers seen: {seen}. Fix: change the rule's resources (--set-resources "
        f"{fix_target}:...), or start servers that have them."
    )


def describe_offer(resources: Mapping[str, float]) -> str:
    """What a server offers, as users read it: 'gpu=1, h200, mem_mb=12000'."""
    parts = [f"gpu={resources.get(GPU, 0):g}"]
    model = model_from_resources(resources)
    if model:
        parts.append(model)
    if MEM_MB in resources:
        parts.append(f"mem_mb={resources[MEM_MB]:g}")
    return ", ".join(parts)
