"""A measured run, read from a catalog: its span, servers, jobs, attempts, loads and
losses, and the times a simulation takes from them (seconds per item by rule and GPU
model, seconds per load by context and kind).

A load's kind comes from its cache probe: weights found on local disk is a load from
the cache; not found, by a loader that probes, is a conversion (it fills the cache);
no probe is a load from the source. A load that fetched its template from peers is a
peer load, and one that recorded conversions a conversion, as the ledger splits them.

A context is its identity (the loader, its arguments and code): the catalog keeps one
row per identity, under the first name it saw, while a Snakefile may declare it under
two names, and a name may stand for another identity in another run.
:func:`measured_contexts` therefore matches a workload's contexts by identity first.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import select

from ..catalog.models import Attempt, Context, Job, Placement, Run, Server, ServerLoss
from ..catalog.store import open_reader
from ..errors import ContextExecutorError
from ..fleet.loads import LoadKind, load_parts
from .model import ContextModel, JobTimes
from .workload import Workload

__all__ = ["MeasuredRun", "contexts_from", "measured_contexts", "read_run", "times_from"]


@dataclass(frozen=True)
class ServerRow:
    """One incarnation of a server."""

    name: str
    gpu_model: str
    slots: int
    budget: int
    joined: float
    left: float | None
    host: str = ""


@dataclass(frozen=True)
class JobRow:
    """One job of the run."""

    jobid: str
    rule: str
    wildcards: tuple[tuple[str, str], ...]
    context: str | None
    submitted: float | None
    reported: float | None
    outcome: str | None
    items: int
    #: Its context's identity (None: a plain job).
    identity: str | None = None


@dataclass(frozen=True)
class AttemptRow:
    """One attempt of a job."""

    jobid: str
    rule: str
    server: str
    gpu_model: str
    started: float | None
    finished: float | None
    load_seconds: float
    outcome: str | None
    items: int


@dataclass(frozen=True)
class LoadRow:
    """One load of a context on a server."""

    server: str
    context: str
    loading_at: float
    seconds: float | None
    kind: LoadKind
    identity: str = ""


@dataclass
class MeasuredRun:
    """A run as its catalog recorded it."""

    run_id: str
    started: float
    finished: float
    servers: list[ServerRow] = field(default_factory=list)
    jobs: list[JobRow] = field(default_factory=list)
    attempts: list[AttemptRow] = field(default_factory=list)
    loads: list[LoadRow] = field(default_factory=list)
    #: (when, server name) of each server lost during the run.
    losses: list[tuple[float, str]] = field(default_factory=list)
    #: identity -> (the catalog's name for it, bytes), of the contexts the run used.
    contexts: dict[str, tuple[str, int]] = field(default_factory=dict)

    @property
    def makespan(self) -> float:
        """From the run's start to its end."""
        return self.finished - self.started

    def per_server(self) -> dict[str, int]:
        """Jobs each server (by name) ran to an ok end."""
        out: dict[str, int] = defaultdict(int)
        for attempt in self.attempts:
            if attempt.outcome == "ok":
                out[attempt.server] += 1
        return dict(sorted(out.items()))

    def items_of(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], int]:
        """Items per job, by (rule, wildcards)."""
        return {(job.rule, job.wildcards): job.items for job in self.jobs}


def _kind(placement: Placement) -> LoadKind:
    """A load that fetched from peers or converted is what the ledger's first part of
    it is (:func:`~..fleet.loads.load_parts`); any other by its cache probe."""
    if placement.peer_seconds is not None or placement.conversions:
        parts = load_parts(
            placement.load_seconds or 0.0,
            from_cache=placement.from_cache,
            conversions=placement.conversions,
            reload_seconds=placement.reload_seconds,
            peer_seconds=placement.peer_seconds,
        )
        return parts[0][0]
    if placement.from_cache is None:
        return LoadKind.SOURCE
    return LoadKind.CACHE if placement.from_cache else LoadKind.CONVERSION


def read_run(catalog: str, run_id: str | None = None) -> MeasuredRun:
    """The run ``run_id`` (default: the latest that finished) of a catalog."""
    reader = open_reader(catalog)
    try:
        with reader.session() as session:
            query = select(Run).where(Run.finished.is_not(None))
            if run_id:
                query = query.where(Run.run_id == run_id)
            run = session.scalars(query.order_by(Run.started.desc()).limit(1)).first()
            if run is None:
                which = f"run {run_id} that finished" if run_id else "finished run"
                raise ContextExecutorError(
                    f"The catalog {catalog} holds no {which}. Fix: name a run that "
                    "finished (snakemake-context status lists them), or run one first."
                )
            return _read(session, run)
    finally:
        reader.close()


def _read(session: Any, run: Run) -> MeasuredRun:
    assert run.finished is not None
    out = MeasuredRun(run.run_id, run.started, run.finished)
    servers = session.scalars(
        select(Server).where(
            Server.joined <= run.finished, (Server.left.is_(None)) | (Server.left >= run.started)
        )
    ).all()
    names = {s.id: s for s in servers}
    out.servers = [
        ServerRow(s.name, s.gpu_model, s.slots, s.memory_budget or 0, s.joined, s.left, s.host)
        for s in sorted(servers, key=lambda s: (s.joined, s.name))
    ]
    contexts = {c.id: c for c in session.scalars(select(Context)).all()}
    jobs = session.scalars(select(Job).where(Job.run_pk == run.id)).all()
    by_job = {job.id: job for job in jobs}
    for job in jobs:
        wildcards = tuple(sorted((k, str(v)) for k, v in json.loads(job.wildcards).items()))
        row = contexts.get(job.context_id) if job.context_id is not None else None
        out.jobs.append(
            JobRow(
                job.jobid,
                job.rule,
                wildcards,
                row.name if row else None,
                job.submitted,
                job.finished,
                job.outcome,
                int(job.items or 0),
                row.identity if row else None,
            )
        )
    rows = (
        session.scalars(
            select(Attempt).where(Attempt.job_id.in_(list(by_job))).order_by(Attempt.id)
        ).all()
        if by_job
        else []
    )
    for attempt in rows:
        server = names.get(attempt.server_id)
        job = by_job[attempt.job_id]
        out.attempts.append(
            AttemptRow(
                job.jobid,
                job.rule,
                server.name if server else "",
                server.gpu_model if server else "cpu",
                attempt.started,
                attempt.finished,
                float(attempt.load_seconds or 0.0),
                attempt.outcome,
                int(attempt.items or 0),
            )
        )
    placements = (
        session.scalars(select(Placement).where(Placement.server_id.in_(list(names)))).all()
        if names
        else []
    )
    for placement in placements:
        if not run.started <= placement.loading_at <= run.finished:
            continue
        context = contexts[placement.context_id]
        out.loads.append(
            LoadRow(
                names[placement.server_id].name,
                context.name,
                placement.loading_at,
                placement.load_seconds,
                _kind(placement),
                context.identity,
            )
        )
    used = {job.identity for job in out.jobs} | {load.identity for load in out.loads}
    out.contexts = {
        c.identity: (c.name, c.bytes or 0) for c in contexts.values() if c.identity in used
    }
    for loss in session.scalars(
        select(ServerLoss).where(ServerLoss.at >= run.started, ServerLoss.at <= run.finished)
    ).all():
        server = names.get(loss.server_id)
        if server is not None:
            out.losses.append((loss.at, server.name))
    out.losses.sort()
    return out


def times_from(runs: Iterable[MeasuredRun]) -> JobTimes:
    """Seconds per item by (rule, GPU model), from the attempts that ended ok (an
    attempt that reported no items counts as one)."""
    seconds: dict[tuple[str, str], float] = defaultdict(float)
    items: dict[tuple[str, str], int] = defaultdict(int)
    for run in runs:
        for attempt in run.attempts:
            if attempt.outcome != "ok" or attempt.started is None or attempt.finished is None:
                continue
            key = (attempt.rule, attempt.gpu_model)
            seconds[key] += max(0.0, attempt.finished - attempt.started - attempt.load_seconds)
            items[key] += max(1, attempt.items)
    return JobTimes(item={key: seconds[key] / items[key] for key in seconds})


def contexts_from(runs: Iterable[MeasuredRun]) -> dict[str, ContextModel]:
    """Each context's loads by kind (the mean seconds of each), size, and whether it
    converts and caches; by identity."""
    out: dict[str, ContextModel] = {}
    samples: dict[tuple[str, LoadKind], list[float]] = defaultdict(list)
    for run in runs:
        for identity, (name, nbytes) in run.contexts.items():
            model = out.setdefault(identity, ContextModel(name=name, identity=identity))
            model.nbytes = nbytes or model.nbytes
        for load in run.loads:
            if load.seconds is not None:
                samples[(load.identity, load.kind)].append(load.seconds)
    for (identity, kind), values in samples.items():
        model = out[identity]
        model.load[kind] = statistics.fmean(values)
        model.converts = model.converts or kind == LoadKind.CONVERSION
        model.caches = kind != LoadKind.SOURCE
    return out


def measured_contexts(workload: Workload, run: MeasuredRun) -> dict[str, ContextModel]:
    """The run's measurements of the workload's contexts, by the workload's names:
    each by its identity (every name it is declared under gets them), else by the
    catalog's name for it, else through the rules that use it (the run's jobs of
    those rules, when they all used one context: its loader changed since)."""
    measured = contexts_from([run])
    by_name = {model.name: model for model in measured.values()}
    out = {}
    for name, model in workload.contexts.items():
        found = measured.get(model.identity) or by_name.get(name)
        if found is None:
            rules = {job.rule for job in workload.jobs if job.context == name}
            used = {job.identity for job in run.jobs if job.rule in rules and job.identity}
            found = measured.get(used.pop()) if len(used) == 1 else None
        if found is not None:
            out[name] = replace(found, name=name, identity=model.identity, load=dict(found.load))
    return out
