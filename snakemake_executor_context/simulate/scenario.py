"""The ``simulate`` command's arguments made a :class:`~.whatif.Scenario`: the
workload, the catalog's times, the flags for the rest (one line naming what is still
missing), the fleet, its pool and its preemptions."""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from typing import Any

from ..errors import ContextExecutorError
from .buckets import LoadKind
from .measured import MeasuredRun, contexts_from, read_run, times_from
from .model import ANY_MODEL, Fleet, JobTimes, Options, PoolSpec, Preemption, Storage
from .whatif import (
    Scenario,
    missing_times,
    number,
    parse_gpus,
    parse_pairs,
    parse_rates,
)
from .workload import Workload, from_spec, parse_size

__all__ = ["build", "replay_text"]


def _config(values: list[str]) -> dict[str, Any]:
    import yaml

    return {k: yaml.safe_load(v) for k, v in parse_pairs(values, "--config").items()}


def _workload(args: argparse.Namespace) -> Workload:
    if args.spec is not None:
        return from_spec(args.spec)
    from pathlib import Path

    from .snakefile import from_snakefile

    snakefile = args.snakefile or Path("Snakefile")
    return from_snakefile(
        snakefile,
        workdir=args.directory,
        config=_config(args.config),
        configfiles=args.configfile,
        needed_only=args.needed_only,
    )


def _with_catalog(workload: Workload, run: MeasuredRun) -> JobTimes:
    """The catalog's times: items per job, loads per context, seconds per item."""
    measured = contexts_from([run])
    for name, model in workload.contexts.items():
        found = measured.get(name)
        if found is not None:
            workload.contexts[name] = replace(found, identity=model.identity)
    items = run.items_of()
    typical: dict[str, int] = {}
    for rule in {job.rule for job in run.jobs}:
        sizes = [job.items for job in run.jobs if job.rule == rule and job.items]
        if sizes:
            typical[rule] = int(statistics.median(sizes))
    workload.jobs = [
        replace(job, items=items.get((job.rule, job.wildcards)) or typical.get(job.rule, job.items))
        for job in workload.jobs
    ]
    return times_from([run])


def _flags(args: argparse.Namespace, workload: Workload, times: JobTimes) -> None:
    for key, text in parse_pairs(args.item_seconds, "--item-seconds").items():
        rule, _, model = key.partition("@")
        times.item[(rule, model.lower() or ANY_MODEL)] = number(text, f"--item-seconds {key}")
    for model, text in parse_pairs(args.slowdown, "--slowdown").items():
        times.slowdown[model.lower()] = number(text, f"--slowdown {model}")
    for key, text in parse_pairs(args.slot_gain, "--slot-gain").items():
        times.slot_gain[int(number(key, "--slot-gain"))] = number(text, f"--slot-gain {key}")
    for rule, text in parse_pairs(args.local_seconds, "--local-seconds").items():
        times.local[rule] = number(text, f"--local-seconds {rule}")
    times.cv = args.job_cv
    sizes = {
        r: int(number(t, f"--items {r}")) for r, t in parse_pairs(args.items, "--items").items()
    }
    workload.jobs = [replace(j, items=sizes.get(j.rule, j.items)) for j in workload.jobs]
    for key, text in parse_pairs(args.load_seconds, "--load-seconds").items():
        name, _, kind = key.partition(":")
        model = _context(workload, name, "--load-seconds")
        try:
            load_kind = LoadKind(kind.lower())
        except ValueError:
            raise ContextExecutorError(
                f"--load-seconds {key}: the kind is one of "
                f"{', '.join(k.value for k in LoadKind)} (CONTEXT:KIND=S)."
            ) from None
        model.load[load_kind] = number(text, f"--load-seconds {key}")
        model.converts = model.converts or load_kind == LoadKind.CONVERSION
    for name, text in parse_pairs(args.context_bytes, "--context-bytes").items():
        _context(workload, name, "--context-bytes").nbytes = parse_size(text, "--context-bytes")


def _context(workload: Workload, name: str, flag: str) -> Any:
    if name not in workload.contexts:
        raise ContextExecutorError(
            f"{flag}: no context {name!r} in the workload (its contexts: "
            f"{', '.join(sorted(workload.contexts)) or 'none'})."
        )
    return workload.contexts[name]


def build(args: argparse.Namespace) -> tuple[Scenario, list[int]]:
    """The scenario of the command's arguments, and the GPU counts of its table."""
    workload = _workload(args)
    run = read_run(args.catalog, args.run) if args.catalog else None
    times = _with_catalog(workload, run) if run else JobTimes()
    _flags(args, workload, times)
    budget = parse_size(args.budget or 0, "--budget")
    if args.gpus:
        kinds = parse_gpus(args.gpus, max(1, args.slots), budget)
    elif run is not None:
        from .replay import fleet_of

        kinds = [replace(k, slots=max(1, args.slots)) for k in fleet_of(run).kinds]
    else:
        raise ContextExecutorError(
            "simulate: no fleet. Fix: --gpus MODEL:COUNT[,...] (a10:10,titanx:10), or "
            "--catalog PATH to take a run's servers."
        )
    preemption = Preemption(
        rates=parse_rates(args.preempt),
        signal=args.preempt_signal,
        trace=_trace(args, run),
    )
    missing = missing_times(workload, times, kinds, args.mode)
    if missing:
        raise ContextExecutorError(
            f"simulate {workload.source}: missing times: {'; '.join(missing)}. Fix: give "
            "them, or --catalog PATH of a run that measured them."
        )
    pool = None
    if args.pilots:
        total = sum(kind.count for kind in kinds)
        pool = PoolSpec(
            minimum=args.min_pilots,
            maximum=args.max_pilots or total,
            queue_wait=args.queue_wait,
            walltime=args.walltime,
            loads_per_source=args.loads_per_source,
        )
    storage = Storage(shared_bandwidth=args.shared_bandwidth * 1e9 / 8, peer=args.peer)
    options = Options(jobs=args.jobs, mode=args.mode, seed=args.seed, log=False)
    scenario = Scenario(workload, times, Fleet(kinds, pool=pool), storage, preemption, options)
    total = sum(kind.count for kind in kinds)
    if args.counts.strip().lower() == "none":
        totals: list[int] = []
    elif args.counts:
        totals = [int(number(t, "--counts")) for t in args.counts.split(",") if t.strip()]
    else:
        totals = sorted({max(1, total // 2), total, 2 * total, 4 * total})
    return scenario, totals


def _trace(args: argparse.Namespace, run: MeasuredRun | None) -> list[tuple[float, str]]:
    if args.preempt_trace is None:
        return []
    out = []
    try:
        lines = args.preempt_trace.read_text().splitlines()
    except OSError as error:
        raise ContextExecutorError(f"--preempt-trace: {error}") from None
    for line in filter(None, (x.strip() for x in lines)):
        item = json.loads(line)
        at = float(item["at"])
        if at > 1e8:  # an absolute time (the injector's log): from the run's start
            at -= run.started if run is not None else at
        out.append((at, str(item.get("server") or item.get("name") or "*")))
    return out


def replay_text(args: argparse.Namespace) -> str:
    """``--replay``: the catalog's run, predicted against measured."""
    if not args.catalog:
        raise ContextExecutorError("simulate --replay needs --catalog PATH (the run to replay).")
    from .replay import replay

    result = replay(
        args.catalog,
        run_id=args.run,
        snakefile=args.snakefile,
        workdir=args.directory,
        config=_config(args.config),
        seed=args.seed,
    )
    return result.describe()
