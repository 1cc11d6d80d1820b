"""The paper's experiments at their size (Phung & Thain, arXiv 2510.14024): RQ1 on
20 GPUs, RQ2's batch sizes, RQ3 under one preemption a minute, RQ4 growing onto a
cluster's 18 GPU models; run in the simulator with every parameter the paper states
fixed, three unknowns fitted to RQ1's three makespans, and the rest predicted.

Stated (fixed): 145,449 claims (FEVER train); SmolLM2-1.7B, 3.7 GB on disk; a shared
filesystem of 84 Gb/s; one GPU per worker; RQ1 on 10 A10 + 10 TITAN X Pascal; RQ3 one
GPU preempted a minute; RQ4 186 of 567 GPUs of 18 models. Fitted to RQ1: seconds per
claim on an A10 (full-context), the model state's creation on the GPU (partial:
every job does it), a load from the source's fixed part beyond its bytes (software,
imports; context-agnostic: every job does it). Everything else is an assumption,
stated in :data:`ASSUMED` and docs/simulator.md with the sensitivity to it.

A load from the source is the read of the model's 3.7 GB over the shared filesystem
(the reads at that moment share its 84 Gb/s; a pool's turn covers the read alone),
then its fixed part and the state's creation, outside the turn; a load from a peer
is the transfer over the network, then the state's creation; one from the local
cache, its read from local disk, then the state's creation. RQ4's pool runs with the
plugin's defaults (:mod:`.simdefaults`) unless a row says otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from snakemake_executor_context.fleet.loads import LoadKind
from snakemake_executor_context.simulate.engine import Simulation
from snakemake_executor_context.simulate.model import (
    ANY_MODEL,
    Fleet,
    JobTimes,
    Options,
    PoolSpec,
    Preemption,
    ServerKind,
    Storage,
)
from snakemake_executor_context.simulate.result import SimResult
from snakemake_executor_context.simulate.simdefaults import LOADS_PER_SOURCE, PEER_TRANSFERS
from snakemake_executor_context.simulate.workload import Workload, from_spec

__all__ = [
    "ASSUMED",
    "CLUSTER",
    "FITTED",
    "PAPER",
    "RQ4_POOLS",
    "STATED",
    "Assumptions",
    "Params",
    "Stated",
    "fit",
    "rq1",
    "rq2",
    "rq3",
    "rq4",
    "rq4_pool",
    "run",
]


@dataclass(frozen=True)
class Stated:
    """What the paper states, fixed in every simulation here."""

    claims: int = 145_449
    model_bytes: float = 3.7e9
    shared_gbps: float = 84.0
    #: RQ1's fleet: 10 A10 + 10 TITAN X Pascal, one GPU per worker.
    rq1_a10: int = 10
    rq1_titanx: int = 10
    rq3_per_minute: float = 1.0
    rq4_gpus: int = 186
    cluster_gpus: int = 567
    cluster_models: int = 18


STATED = Stated()

#: The paper's numbers (seconds, or inferences for RQ3).
PAPER = {
    "rq1_agnostic": 10_400.0,
    "rq1_partial": 5_300.0,
    "rq1_full": 2_900.0,
    "rq2_full_spread": 0.136,
    "rq2_partial_batch1": 141_100.0,
    "rq3_partial": 46_000.0,
    "rq3_full": 62_900.0,
    "rq4_small_within": 5_000.0,
    "rq4_186": 783.0,
}


@dataclass(frozen=True)
class Assumptions:
    """What the paper's numbers (as we have them) do not settle, each stated."""

    #: Claims per task in RQ1, RQ3 and RQ4 (the paper's is not in our numbers).
    claims_per_task: int = 100
    #: A TITAN X Pascal's time per claim over an A10's.
    titanx_slowdown: float = 2.0
    #: Node-local disk and the network between nodes (for peer transfers), Gb/s.
    local_gbps: float = 16.0
    peer_gbps: float = 10.0
    #: RQ2's batch sizes.
    rq2_batches: tuple[int, ...] = (1, 10, 100, 1000)
    #: RQ3: inferences counted over this window; a preempted GPU is replaced (cold)
    #: after this many seconds.
    rq3_window: float = 1800.0
    rq3_replacement: float = 30.0
    #: RQ4: mean seconds a pilot waits in the batch queue; the small fleets.
    rq4_queue_wait: float = 60.0
    rq4_small: tuple[int, ...] = (4, 8, 12, 16, 20)
    #: Snakemake's own seconds per job (measured here: 36 ms of CPU).
    snakemake_job_seconds: float = 0.036


ASSUMED = Assumptions()

#: The cluster's 18 GPU models (an assumed mix: a campus cluster's generations, from
#: Pascal to Hopper) with each one's time per claim over an A10's (memory bandwidth
#: and fp16 throughput from the vendors' sheets, rounded; Pascal has no fast fp16),
#: and how many of the 567 each is.
CLUSTER: list[tuple[str, float, int]] = [
    ("titanx", 2.0, 48),
    ("gtx1080ti", 2.0, 60),
    ("gtx1080", 2.4, 24),
    ("p100", 1.6, 16),
    ("t4", 1.8, 24),
    ("v100", 0.9, 32),
    ("titanv", 1.0, 8),
    ("rtx2080ti", 1.2, 48),
    ("titanrtx", 1.1, 16),
    ("quadrortx6000", 1.1, 32),
    ("rtx3090", 0.8, 32),
    ("a10", 1.0, 40),
    ("a30", 0.8, 24),
    ("a40", 0.75, 48),
    ("rtxa6000", 0.75, 40),
    ("a100", 0.5, 32),
    ("l40s", 0.5, 27),
    ("h100", 0.3, 16),
]


@dataclass
class Params:
    """The three unknowns (fitted) and the assumptions they are fitted under."""

    #: Seconds per claim on an A10.
    claim_seconds: float = 0.4
    #: Seconds to create the model's state on a GPU (every load pays it, after its
    #: bytes are on the node; outside any turn).
    init_seconds: float = 15.0
    #: Seconds of a load from the source beyond reading its bytes (software start,
    #: imports), after its turn at the source is released.
    source_seconds: float = 30.0
    claims_per_task: int = ASSUMED.claims_per_task
    titanx_slowdown: float = ASSUMED.titanx_slowdown
    slowdowns: dict[str, float] = field(default_factory=dict)

    def times(self) -> JobTimes:
        """Seconds per claim on each GPU model."""
        slow = {model: factor for model, factor, _ in CLUSTER}
        slow.update(self.slowdowns)
        slow["titanx"] = self.titanx_slowdown
        return JobTimes(item={("infer", ANY_MODEL): self.claim_seconds}, slowdown=slow)


#: What :func:`fit` gave on 2026-12-04 (docs/simulator.md), for a bench that does not
#: refit (a fit is some fifty simulations at the paper's size).
FITTED = Params(claim_seconds=0.285, init_seconds=29.7, source_seconds=70.0)


def workload(params: Params, claims: int = STATED.claims) -> Workload:
    """FEVER's claims in tasks of ``claims_per_task``, one context (the model)."""
    made = from_spec(
        "the paper's workload",
        {
            "contexts": {"smollm2": {"bytes": STATED.model_bytes}},
            "stages": [
                {
                    "rule": "infer",
                    "context": "smollm2",
                    "items": claims,
                    "per_job": params.claims_per_task,
                },
            ],
        },
    )
    model = made.contexts["smollm2"]
    model.load = {
        LoadKind.SOURCE: params.source_seconds + params.init_seconds,
        LoadKind.CACHE: params.init_seconds,
        LoadKind.PEER: params.init_seconds,
    }
    return made


def storage(peer: bool = False) -> Storage:
    """The shared filesystem (stated), local disk and network (assumed)."""
    return Storage(
        shared_bandwidth=STATED.shared_gbps * 1e9 / 8,
        local_bandwidth=ASSUMED.local_gbps * 1e9 / 8,
        peer_bandwidth=ASSUMED.peer_gbps * 1e9 / 8,
        peer=peer,
    )


def rq1_fleet(restart: float | None = 1.0) -> Fleet:
    """10 A10 + 10 TITAN X Pascal (stated)."""
    kinds = [ServerKind("a10", STATED.rq1_a10), ServerKind("titanx", STATED.rq1_titanx)]
    return Fleet(kinds, join_at=0.0, restart=restart)


def mixed_fleet(
    total: int, *, pool: PoolSpec | None = None, slowdown: float | None = None
) -> tuple[Fleet, dict[str, float]]:
    """``total`` GPUs of the cluster's 18 models in the cluster's proportions (a pool
    of up to ``total`` pilots of them, with ``pool``), and the models' slowdowns
    (every model at ``slowdown`` when given: the sensitivity to the mix)."""
    from snakemake_executor_context.simulate.whatif import scaled

    kinds = [ServerKind(model, count) for model, _, count in CLUSTER]
    slow = {model: factor if slowdown is None else slowdown for model, factor, _ in CLUSTER}
    if pool is not None:
        return Fleet(kinds, pool=replace(pool, maximum=total), join_at=0.0), slow
    return Fleet(scaled(kinds, total), join_at=0.0), slow


def run(
    params: Params,
    mode: str,
    fleet: Fleet | None = None,
    *,
    preemption: Preemption | None = None,
    peer: bool = False,
    claims: int = STATED.claims,
    seed: int = 1,
    survival: bool = False,
    limit: float = Options.limit,
) -> SimResult:
    """One simulated run of the paper's workload; Snakemake's --jobs is the fleet's
    GPU count (an assumption: twice that keeps more jobs queued in the executor,
    which costs its dispatch machine CPU at this size, see docs/simulator.md).
    ``survival``: survival placement on; ``limit``: stop after so many simulated
    seconds (a window's claims need no more)."""
    fleet = fleet or rq1_fleet()
    jobs = fleet.pool.maximum if fleet.pool else sum(kind.count for kind in fleet.kinds)
    options = Options(
        mode=mode,
        seed=seed,
        log=False,
        jobs=jobs,
        snakemake_job_seconds=ASSUMED.snakemake_job_seconds,
        survival=survival,
        limit=limit,
    )
    return Simulation(
        workload(params, claims),
        fleet,
        params.times(),
        storage=storage(peer),
        preemption=preemption,
        options=options,
    ).run()


def _solve(makespan: Callable[[float], float], target: float, low: float, high: float) -> float:
    """The value in [low, high] whose makespan is ``target`` (makespans grow with it):
    regula falsi (Illinois), a makespan being nearly linear in each unknown."""
    f_low, f_high = makespan(low) - target, makespan(high) - target
    if f_low >= 0:
        return low
    if f_high <= 0:
        return high
    side = 0
    value = low
    for _ in range(30):
        value = (low * f_high - high * f_low) / (f_high - f_low)
        f_value = makespan(value) - target
        if abs(f_value) <= 0.0005 * target:
            break
        if f_value < 0:
            low, f_low = value, f_value
            if side == -1:
                f_high /= 2
            side = -1
        else:
            high, f_high = value, f_value
            if side == 1:
                f_low /= 2
            side = 1
    return value


def fit(params: Params | None = None, rounds: int = 2) -> Params:
    """The three unknowns fitted to RQ1's three makespans, each by the mode it
    drives (full: seconds per claim; partial: state creation; agnostic: the source's
    fixed part), twice round (each mode depends a little on the others' unknowns)."""
    params = replace(params or Params())
    for _ in range(rounds):
        params.claim_seconds = _solve(
            lambda x: run(replace(params, claim_seconds=x), "full").makespan,
            PAPER["rq1_full"],
            0.001,
            2.0,
        )
        params.init_seconds = _solve(
            lambda x: run(replace(params, init_seconds=x), "partial").makespan,
            PAPER["rq1_partial"],
            0.0,
            400.0,
        )
        params.source_seconds = _solve(
            lambda x: run(replace(params, source_seconds=x), "agnostic").makespan,
            PAPER["rq1_agnostic"],
            0.0,
            800.0,
        )
    return params


def rq1(params: Params) -> dict[str, float]:
    """RQ1's makespans (the fit's check)."""
    return {mode: run(params, mode).makespan for mode in ("agnostic", "partial", "full")}


def rq2(params: Params, partial_batch1: bool = True) -> dict[str, object]:
    """Full-context over the batch sizes; partial-context at batch 1."""
    full = {
        b: run(replace(params, claims_per_task=b), "full").makespan for b in ASSUMED.rq2_batches
    }
    out: dict[str, object] = {
        "full": full,
        "full_spread": (max(full.values()) - min(full.values())) / min(full.values()),
    }
    if partial_batch1:
        out["partial_batch1"] = run(replace(params, claims_per_task=1), "partial").makespan
    return out


def rq3(params: Params, window: float = ASSUMED.rq3_window) -> dict[str, float]:
    """Inferences done within the window, one GPU preempted a minute (replaced, cold,
    after the assumed delay): partial, full, and full with peer transfers."""
    preempt = Preemption(rates={"*": STATED.rq3_per_minute / 60.0})
    fleet = rq1_fleet(restart=ASSUMED.rq3_replacement)
    partial = run(params, "partial", fleet, preemption=preempt)
    full = run(params, "full", fleet, preemption=preempt)
    peer = run(params, "full", fleet, preemption=preempt, peer=True)
    return {
        "partial": partial.items_by(window),
        "full": full.items_by(window),
        "full_peer": peer.items_by(window),
        "partial_makespan": partial.makespan,
        "full_makespan": full.makespan,
    }


#: Whether the plugin's servers fetch templates from their peers by default.
_PEERS = PEER_TRANSFERS > 0
#: RQ4's pools at 186 GPUs: (name, reads from the source at once, peer transfers).
#: The first is what a user gets with the plugin's defaults.
RQ4_POOLS: tuple[tuple[str, int, bool], ...] = (
    ("pool_defaults", LOADS_PER_SOURCE, _PEERS),
    ("pool_limit_no_peer", LOADS_PER_SOURCE, False),
    ("pool_unlimited", 0, False),
    ("pool_peer", 0, True),
)


def rq4_pool(
    params: Params,
    loads_per_source: int = LOADS_PER_SOURCE,
    peer: bool = _PEERS,
    slowdown: float | None = None,
) -> SimResult:
    """A pool growing to 186 pilots of the cluster's mix (the plugin's defaults unless
    told: its limit on reads from the source at once, its peer transfers)."""
    spec = PoolSpec(queue_wait=ASSUMED.rq4_queue_wait, loads_per_source=loads_per_source)
    fleet, slow = mixed_fleet(STATED.rq4_gpus, pool=spec, slowdown=slowdown)
    return run(replace(params, slowdowns=slow), "full", fleet, peer=peer)


def rq4(params: Params, slowdown: float | None = None) -> dict[str, object]:
    """Fixed fleets of 4 to 20 GPUs of the cluster's mix, and a pool growing to 186
    pilots (:data:`RQ4_POOLS`: the plugin's defaults, its limit without peers, no
    limit, and no limit with peer transfers)."""
    small = {}
    for n in ASSUMED.rq4_small:
        fleet, slow = mixed_fleet(n, slowdown=slowdown)
        small[n] = run(replace(params, slowdowns=slow), "full", fleet).makespan
    out: dict[str, object] = {"small": small}
    for name, limit, peer in RQ4_POOLS:
        result = rq4_pool(params, limit, peer, slowdown)
        out[name] = result.makespan
        out[f"{name}_wall"] = result.wall
    return out
