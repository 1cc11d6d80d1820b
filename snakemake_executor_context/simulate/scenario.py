"""The ``simulate`` command's arguments made a :class:`~.whatif.Scenario`: the
workload, the catalog's times, the flags for the rest (one line naming what is still
missing), the fleet, its pool and its preemptions."""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import ContextExecutorError, SettingError
from ..fleet.loads import LoadKind
from .bounds import MAX_SERVERS, parse_counts, parse_gpus, parse_pairs, parse_rates, read_pairs
from .hazard import parse_lifetimes
from .measured import MeasuredRun, measured_contexts, read_run, times_from
from .model import ANY_MODEL, Fleet, JobTimes, Options, PoolSpec, Preemption, Storage
from .preempt import trace_from
from .whatif import Scenario, missing_times
from .workload import Workload, from_spec, parse_size

__all__ = ["build", "replay_text"]


def _config(values: list[str]) -> dict[str, Any]:
    import yaml

    out = {}
    for key, text in parse_pairs(values, "--config").items():
        try:
            out[key] = yaml.safe_load(text)
        except yaml.YAMLError as error:
            problem = str(error).splitlines()[0]
            raise SettingError(f"--config {key}={text!r} is not allowed: {problem}.") from None
    return out


def _workload(args: argparse.Namespace) -> Workload:
    if args.spec is not None:
        return from_spec(args.spec)
    from .snakefile import from_snakefile

    snakefile = args.snakefile or Path("Snakefile")
    for path in args.configfile:
        if not path.is_file():
            raise SettingError(f"--configfile '{path}' is not allowed: no such file.")
    return from_snakefile(
        snakefile,
        workdir=args.directory,
        config=_config(args.config),
        configfiles=args.configfile,
        needed_only=args.needed_only,
    )


def _with_catalog(workload: Workload, run: MeasuredRun) -> JobTimes:
    """The catalog's times: items per job, loads per context, seconds per item."""
    workload.contexts.update(measured_contexts(workload, run))
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
    for key, seconds in read_pairs(args.item_seconds, "--item-seconds").items():
        rule, _, model = key.partition("@")
        times.item[(rule, model.lower() or ANY_MODEL)] = seconds
    for model, slowdown in read_pairs(args.slowdown, "--slowdown").items():
        times.slowdown[model.lower()] = slowdown
    times.slot_gain.update(read_pairs(args.slot_gain, "--slot-gain"))
    times.local.update(read_pairs(args.local_seconds, "--local-seconds"))
    times.cv = args.job_cv
    sizes = read_pairs(args.items, "--items")
    workload.jobs = [replace(j, items=sizes.get(j.rule, j.items)) for j in workload.jobs]
    for key, seconds in read_pairs(args.load_seconds, "--load-seconds").items():
        name, _, kind = key.partition(":")
        model = _context(workload, name, "--load-seconds")
        try:
            load_kind = LoadKind(kind.lower())
        except ValueError:
            raise ContextExecutorError(
                f"--load-seconds {key}: the kind is one of "
                f"{', '.join(k.value for k in LoadKind)} (CONTEXT:KIND=S)."
            ) from None
        model.load[load_kind] = seconds
        model.converts = model.converts or load_kind == LoadKind.CONVERSION
    for name, size in read_pairs(args.context_bytes, "--context-bytes").items():
        context = _context(workload, name, "--context-bytes")
        context.nbytes = parse_size(size, "--context-bytes", f"{name}={size}")


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
        kinds = parse_gpus(args.gpus, args.slots, budget)
    elif run is not None:
        from .replay import fleet_of

        kinds = [replace(k, slots=args.slots) for k in fleet_of(run).kinds]
    else:
        raise ContextExecutorError(
            "simulate: no fleet. Fix: --gpus MODEL:COUNT[,...] (a10:10,titanx:10), or "
            "--catalog PATH to take a run's servers."
        )
    preemption = Preemption(
        rates=parse_rates(args.preempt or ""),
        signal=args.preempt_signal,
        trace=_trace(args.preempt_trace, run),
        lifetimes=parse_lifetimes(args.lifetimes) if args.lifetimes else {},
    )
    missing = missing_times(workload, times, kinds, args.mode)
    if missing:
        raise ContextExecutorError(
            f"simulate {workload.source}: missing times: {'; '.join(missing)}. Fix: give "
            "them, or --catalog PATH of a run that measured them."
        )
    pool = None
    total = sum(kind.count for kind in kinds)
    if args.pilots:
        if args.min_pilots > total:
            raise SettingError(
                f"--min-pilots {args.min_pilots} is not allowed above the fleet's {total} "
                "GPUs (--gpus, or the catalog's servers). Fix: lower --min-pilots."
            )
        pool = PoolSpec(
            minimum=args.min_pilots,
            maximum=args.max_pilots or total,
            queue_wait=args.queue_wait,
            walltime=args.walltime,
            loads_per_source=args.loads_per_source,
        )
    storage = Storage(shared_bandwidth=args.shared_bandwidth * 1e9 / 8, peer=args.peer)
    options = Options(
        jobs=args.jobs, mode=args.mode, seed=args.seed, log=False, survival=args.survival
    )
    scenario = Scenario(workload, times, Fleet(kinds, pool=pool), storage, preemption, options)
    totals = parse_counts(args.counts)
    if totals is None:
        every = {max(1, total // 2), total, 2 * total, 4 * total}
        totals = sorted(n for n in every if n <= MAX_SERVERS)
    return scenario, totals


def _trace(path: Path | None, run: MeasuredRun | None) -> list[tuple[float, str]]:
    if path is None:
        return []
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise SettingError(f"--preempt-trace {str(path)!r} is not allowed: {error}.") from None
    return trace_from(lines, str(path), run.started if run is not None else None)


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
