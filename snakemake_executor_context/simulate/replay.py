"""A measured run replayed: the same workload, fleet and times as its catalog
recorded, simulated, and the prediction set beside the measurement.

What the simulator does not model is taken as measured: the time before the first
context job reached the executor (Snakemake's start, the cluster's, the local rules
before it) and after the last one was reported (the local rules after it, the
shutdown). The servers join when they joined; a server lost mid-run is killed at the
time its loss was recorded (less the detection), and comes back as it came back.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..fleet.loads import LoadKind
from .engine import DETECT_SECONDS, Simulation
from .measured import MeasuredRun, contexts_from, measured_contexts, read_run, times_from
from .model import Fleet, JobTimes, Options, Preemption, ServerKind
from .result import SimResult
from .snakefile import from_snakefile
from .workload import SimJob, Workload

__all__ = ["Replay", "fleet_of", "options_of", "replay", "workload_of"]


@dataclass
class Replay:
    """A run measured, and the same run simulated."""

    measured: MeasuredRun
    predicted: SimResult

    @property
    def makespan_error(self) -> float:
        """(predicted - measured) / measured makespan."""
        return (self.predicted.makespan - self.measured.makespan) / self.measured.makespan

    def server_errors(self) -> dict[str, tuple[int, int, float]]:
        """Per server name: measured jobs, predicted jobs, relative error."""
        measured, predicted = self.measured.per_server(), self.predicted.per_server
        out = {}
        for name in sorted(set(measured) | set(predicted)):
            m, p = measured.get(name, 0), predicted.get(name, 0)
            out[name] = (m, p, (p - m) / m if m else float(p > 0))
        return out

    def worst_server_error(self) -> float:
        """The largest relative error of a server's job count."""
        return max((abs(e) for _, _, e in self.server_errors().values()), default=0.0)

    def describe(self) -> str:
        """Predicted against measured, in lines."""
        m, p = self.measured, self.predicted
        lines = [
            f"run {m.run_id}: makespan measured {m.makespan:.1f} s, predicted "
            f"{p.makespan:.1f} s ({100 * self.makespan_error:+.1f}%)",
        ]
        for name, (mj, pj, error) in self.server_errors().items():
            lines.append(f"  {name}: {mj} job(s) measured, {pj} predicted ({100 * error:+.1f}%)")
        return "\n".join(lines)


def workload_of(run: MeasuredRun) -> Workload:
    """The run's context jobs, from the catalog alone (independent of each other)."""
    contexts = {model.name: model for model in contexts_from([run]).values()}
    jobs = [
        SimJob(
            jobid=job.jobid,
            rule=job.rule,
            context=job.context,
            items=max(1, job.items),
            wildcards=job.wildcards,
        )
        for job in sorted(run.jobs, key=lambda j: (j.submitted or 0.0, j.jobid))
        if job.context
    ]
    return Workload(jobs, contexts, source=f"catalog run {run.run_id}")


def fleet_of(run: MeasuredRun) -> Fleet:
    """The run's servers: one per name, as they joined; restarts as they took."""
    first: dict[str, Any] = {}
    gaps: list[float] = []
    ends: dict[str, float | None] = {}
    for server in run.servers:
        if server.name not in first:
            first[server.name] = server
        elif ends.get(server.name) is not None:
            gaps.append(server.joined - (ends[server.name] or server.joined))
        ends[server.name] = server.left
    shapes = Counter((s.gpu_model, s.slots, s.budget) for s in first.values())
    kinds = {
        shape: ServerKind(shape[0], count, shape[1], shape[2])
        for shape, count in sorted(shapes.items())
    }
    schedule = sorted(
        (
            (max(0.0, s.joined - run.started), kinds[(s.gpu_model, s.slots, s.budget)], s.name)
            for s in first.values()
        ),
        key=lambda item: (item[0], item[2]),
    )
    restart = statistics.median(gaps) if gaps else 1.0
    # A context whose first load of the run came from the local cache was on disk.
    first_load: dict[str, LoadKind] = {}
    for load in sorted(run.loads, key=lambda item: item.loading_at):
        first_load.setdefault(load.identity, load.kind)
    cached = tuple(sorted(i for i, kind in first_load.items() if kind == LoadKind.CACHE))
    hosts = {s.host for s in run.servers}
    return Fleet(
        kinds=list(kinds.values()),
        join_at=min((at for at, _, _ in schedule), default=0.0),
        restart=restart,
        one_host=len(hosts) == 1,
        schedule=schedule,
        cached=cached,
    )


def options_of(run: MeasuredRun, **overrides: Any) -> Options:
    """What the run's catalog says of its settings: its --jobs (the most jobs it held
    at once), its mode, the time before its first context job and after its last."""
    context = [j for j in run.jobs if j.context and j.submitted is not None]
    spans = [(j.submitted or run.started, j.reported or run.finished) for j in context]
    steps = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    held = most = 0
    for _, step in steps:
        held += step
        most = max(most, held)
    attempts = [a for a in run.attempts if a.outcome == "ok"]
    loads = len(run.loads)
    mode = "full"
    if attempts and loads >= len(attempts):  # every job loaded: context-agnostic
        mode = "partial" if any(load.kind.value == "cache" for load in run.loads) else "agnostic"
    first = min((a for a, _ in spans), default=run.started)
    last = max((j.reported or 0.0 for j in context), default=run.finished)
    options = Options(
        jobs=max(1, most),
        mode=mode,
        start_seconds=max(0.0, first - run.started),
        end_seconds=max(0.0, run.finished - last),
    )
    return replace(options, **overrides)


def replay(
    catalog: str,
    *,
    run_id: str | None = None,
    snakefile: Path | str | None = None,
    workdir: Path | str | None = None,
    config: dict[str, Any] | None = None,
    times: JobTimes | None = None,
    fleet: Fleet | None = None,
    **overrides: Any,
) -> Replay:
    """Replay a catalog's run (default its latest): the Snakefile's job graph when
    given (else the catalog's context jobs), the catalog's times and fleet (or
    ``fleet``: the same run on another fleet, a pool of pilots for one)."""
    run = read_run(catalog, run_id)
    if snakefile is not None:
        workload = from_snakefile(snakefile, workdir=workdir, config=config)
        items = run.items_of()
        workload.jobs = [
            replace(job, items=max(1, items.get((job.rule, job.wildcards), job.items)))
            for job in workload.jobs
        ]
        workload.contexts.update(measured_contexts(workload, run))
    else:
        workload = workload_of(run)
    options = options_of(run, **overrides)
    trace = [
        (at - run.started - DETECT_SECONDS - options.event_latency, name) for at, name in run.losses
    ]
    result = Simulation(
        workload,
        fleet or fleet_of(run),
        times or times_from([run]),
        preemption=Preemption(trace=trace),
        options=options,
    ).run()
    return Replay(run, result)
