"""Placement policy as pure functions: which servers can run a job, which one should,
and why none can.

No I/O here: the executor passes in what it knows of the fleet (the Dask resources
each server advertises, and the in-memory :class:`~.fleet.FleetView` maintained from
the catalog's events) and gets decisions and messages back.

:func:`choose_server` picks, for one job, in this order: a server warm for the job's
context with a free slot; then one whose local cache holds the weights; then the
fastest free server by measured time for this context and GPU model; then any free
one. While a server holds (or is loading) the context but none of those has a free
slot, the job goes to a server that must load it only when the expected wait for a
warm slot exceeds what the load costs there (:func:`expected_wait`,
:func:`load_cost`); otherwise it waits in the executor's queue. Times not measured
yet are bounded from below by what is running (a job's elapsed time, a load's), so a
long first job does not keep an idle server idle, and nothing is evicted on a guess.

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

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .gpus import GpuInfo, gpu_model_tokens, normalize_gpu_model

if TYPE_CHECKING:
    from .fleet import FleetView, ServerState

__all__ = [
    "Decision",
    "Requirements",
    "ServerView",
    "choose_server",
    "expected_wait",
    "explain_unrunnable",
    "job_resources",
    "load_cost",
    "requirements_from",
    "runnable_on",
    "server_resources",
    "victims",
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
    #: Jobs it runs at once (its Dask threads).
    slots: int = 1

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


# ----------------------------------------------------------------------------------
# Choosing a server for a job.

#: Jobs a warm server may hold queued behind its running ones (see choose_server).
PREFETCH = 1


@dataclass(frozen=True)
class Decision:
    """Where a job goes now (``address``), or None: it waits in the executor's queue.

    ``rule`` names the step of the policy that decided: ``warm``, ``cached``,
    ``fastest``, ``any``, ``plain``, ``load`` (a cold server beat waiting),
    ``wait`` (waiting for a warm slot beats loading), ``queued`` (behind a running job
    on a warm server), ``busy`` (no free slot) or ``unrunnable`` (no server has the
    resources).
    """

    address: str | None
    rule: str
    reason: str = ""


def choose_server(
    view: FleetView,
    wanted: Mapping[str, float],
    identity: str | None,
    *,
    queued_ahead: int = 0,
    demand: Mapping[str, int] | None = None,
    now: float | None = None,
    prefetch: int = PREFETCH,
) -> Decision:
    """Pick a server for one job (see the module's docstring for the order).

    ``wanted`` is the job's Dask resources (:func:`job_resources`), ``identity`` its
    context (None for a plain job), ``queued_ahead`` the jobs of the same context
    ahead of it in the executor's queue, ``demand`` the jobs queued or running per
    context (a context with demand is costly to evict), and ``now`` the wall-clock
    time (for times not measured yet, see :func:`expected_wait`).

    When the job would wait for a warm slot (a measured wait shorter than a load, or
    no free slot anywhere), it is queued behind a running job on a warm server with
    fewer than ``prefetch`` jobs queued there (rule ``queued``): the server starts it
    the moment its running job ends, instead of after the round trip through the
    executor (17-25 ms a job here, about 4% of an 8-claim SmolLM2 job on a CPU).
    """
    decision = _choose(view, wanted, identity, queued_ahead, demand, now)
    if prefetch <= 0 or identity is None or decision.address is not None:
        return decision
    if decision.rule == "busy" or (
        decision.rule == "wait" and decision.reason.startswith("warm slot in")
    ):
        holders = view.warm.get(identity, set())
        room = [
            view.servers[a]
            for a in view.runnable(wanted)
            if a in holders
            and view.servers[a].contexts[identity].state == "ready"
            and view.servers[a].busy < view.servers[a].slots + prefetch
        ]
        if room:
            best = min(room, key=lambda s: (s.busy, s.address))
            return Decision(best.address, "queued", f"behind {best.busy} job(s) on a warm server")
    return decision


def _choose(
    view: FleetView,
    wanted: Mapping[str, float],
    identity: str | None,
    queued_ahead: int,
    demand: Mapping[str, int] | None,
    now: float | None,
) -> Decision:
    candidates = view.runnable(wanted)
    if not candidates:
        return Decision(None, "unrunnable", "no server has the resources")
    servers = view.servers
    free = [servers[a] for a in candidates if servers[a].free]
    if identity is None:
        if not free:
            return Decision(None, "busy", "no free slot")
        # Plain jobs keep off servers that hold contexts, as far as they can.
        best = min(free, key=lambda s: (len(s.contexts), s.busy, s.name, s.address))
        return Decision(best.address, "plain")
    holders = view.warm.get(identity, set())
    warm = [servers[a] for a in candidates if a in holders]
    warm_free = [s for s in warm if s.free]
    if warm_free:
        measure = view.measure

        def warm_key(s: ServerState) -> tuple[bool, float, int, str]:
            seconds = measure.job_seconds(identity, s.gpu_model)
            return (
                s.contexts[identity].state != "ready",
                math.inf if seconds is None else seconds,
                s.busy,
                s.address,
            )

        return Decision(min(warm_free, key=warm_key).address, "warm")
    cold = [s for s in free if s.address not in holders]
    if not cold:
        return Decision(None, "busy", "no free slot")
    best, rule = _best_cold(view, cold, identity)
    if not warm:
        return Decision(best.address, rule)
    demand = demand or {}
    wait = expected_wait(view, identity, warm, queued_ahead, now=now)
    cost = load_cost(view, identity, best, demand, now=now)
    if wait <= 0:
        return Decision(None, "wait", "no job time measured or elapsed yet")
    if wait > cost:
        return Decision(best.address, "load", f"warm slot in {wait:.1f} s > load {cost:.1f} s")
    return Decision(None, "wait", f"warm slot in {wait:.1f} s <= load {cost:.1f} s")


def _best_cold(
    view: FleetView, cold: Sequence[ServerState], identity: str
) -> tuple[ServerState, str]:
    """The cold server to load on: one whose cache holds the weights, then the
    fastest by measured time for this context on its GPU model, then any (fewest
    contexts to evict first)."""
    cached = [s for s in cold if identity in s.cached]
    pool, rule = (cached, "cached") if cached else (list(cold), "any")
    measure = view.measure
    speeds = {s.gpu_model: measure.job_seconds(identity, s.gpu_model) for s in pool}
    known = {model: seconds for model, seconds in speeds.items() if seconds is not None}
    if known:
        fastest = min(known.values())
        fast = [s for s in pool if known.get(s.gpu_model) == fastest]
        if len(fast) < len(pool) and rule == "any":
            rule = "fastest"
        pool = fast
    return min(pool, key=lambda s: (len(s.contexts), s.busy, s.name, s.address)), rule


def expected_wait(
    view: FleetView,
    identity: str,
    warm: Sequence[ServerState],
    queued_ahead: int,
    *,
    now: float | None = None,
) -> float:
    """Seconds until a warm slot takes this job: the jobs ahead of it (and itself)
    times the job time, shared over the warm slots.

    The job time is the measured mean on the warm servers' GPU models; until one is
    measured, the longest time a job of this context has been running on a warm
    server since its context was ready (a lower bound that grows while it runs; 0
    before any has started).
    """
    times = [view.measure.job_seconds(identity, s.gpu_model) for s in warm]
    known = [t for t in times if t is not None]
    if known:
        seconds = sum(known) / len(known)
    else:
        seconds = _running_for(warm, identity, time.time() if now is None else now)
    slots = sum(s.slots for s in warm)
    return (queued_ahead + 1) * seconds / max(1, slots)


def _running_for(warm: Sequence[ServerState], identity: str, now: float) -> float:
    longest = 0.0
    for server in warm:
        placed = server.contexts.get(identity)
        if placed is None or placed.state != "ready":
            continue
        for key, started in server.started.items():
            if server.running_context.get(key) == identity:
                longest = max(longest, now - max(started, placed.at))
    return longest


def load_cost(
    view: FleetView,
    identity: str,
    server: ServerState,
    demand: Mapping[str, int],
    *,
    now: float | None = None,
) -> float:
    """Seconds a load of ``identity`` costs on ``server``: its measured load time
    there (else on its GPU model, else anywhere), plus the reload of every context it
    would evict that jobs still want.

    Until a load is measured, the time a load of it in progress has taken so far
    stands in (a lower bound), and every eviction counts as infinitely costly: the
    policy never evicts on a guess.
    """
    measure = view.measure
    seconds = measure.load_seconds(identity, server.gpu_model, server.address)
    evicts = victims(server, identity, measure.bytes.get(identity))
    if seconds is None:
        if evicts:
            return math.inf
        now = time.time() if now is None else now
        loading = []
        for address in view.warm.get(identity, ()):
            placed = view.servers[address].contexts.get(identity)
            if placed is not None and placed.state == "loading":
                loading.append(now - placed.at)
        return max(loading, default=0.0)
    for victim in evicts:
        if demand.get(victim, 0) > 0:
            reload = measure.load_seconds(victim, server.gpu_model, server.address)
            seconds += reload if reload is not None else seconds
    return seconds


def victims(server: ServerState, identity: str, nbytes: int | None) -> list[str]:
    """The contexts a server would evict to make room for ``identity`` (least
    recently used first). Without a known size or budget, every context it holds."""
    held = [
        (placed.last_used, ident, placed.bytes)
        for ident, placed in server.contexts.items()
        if ident != identity
    ]
    if not held:
        return []
    if not nbytes or server.budget is None or any(size <= 0 for _, _, size in held):
        return [ident for _, ident, _ in sorted(held)]
    used = sum(size for _, _, size in held)
    out = []
    for _, ident, size in sorted(held):
        if used + nbytes <= server.budget:
            break
        out.append(ident)
        used -= size
    return out
