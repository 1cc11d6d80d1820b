"""What a simulated run has to do: its jobs, their dependencies and contexts.

A workload comes from a real Snakefile (the job graph Snakemake itself builds,
:mod:`.snakefile`) or from a small YAML spec (:func:`from_spec`), which can state
work no machine here has the data for (the paper's 145,449 FEVER claims)::

    contexts:
      smollm2: {bytes: 7.4e9, converts: false}
    stages:
      - {rule: infer, context: smollm2, items: 145449, per_job: 100}
      - {rule: merge, local: true, after: [infer]}

A stage is ``count`` jobs (or ``items`` split ``per_job`` items a job), each
depending on every job of the stages named in ``after``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ContextExecutorError
from ..fleet.resources import Requirements
from ..settings.checks import WHOLE, Allowed, check_value
from .bounds import BYTES, ITEMS
from .model import ContextModel

__all__ = ["MAX_JOBS", "SimJob", "Workload", "from_spec", "parse_size"]

#: Jobs of one spec (the paper's batch-1 runs have 145,449).
MAX_JOBS = 1_000_000
_COUNT = Allowed(WHOLE, least=0, most=MAX_JOBS, unit="jobs")
_GPUS = Allowed(WHOLE, least=0, most=64, unit="GPUs")
_PRIORITY = Allowed(WHOLE, least=-(10**9), most=10**9)


@dataclass(frozen=True)
class SimJob:
    """One job of the workload."""

    jobid: str
    rule: str
    #: "context" (runs on a server against its context), "plain" (no context) or
    #: "local" (a local rule: Snakemake's own process).
    kind: str = "context"
    #: The context's name (a context job).
    context: str | None = None
    items: int = 1
    deps: tuple[str, ...] = ()
    requirements: Requirements = field(default_factory=lambda: Requirements(gpu=1))
    priority: int = 0
    wildcards: tuple[tuple[str, str], ...] = ()

    @property
    def remote(self) -> bool:
        """Whether it reaches the executor (not a local rule)."""
        return self.kind != "local"


@dataclass
class Workload:
    """Jobs in an order their dependencies allow, and the contexts they name."""

    jobs: list[SimJob]
    contexts: dict[str, ContextModel]
    #: Where it came from, for messages.
    source: str = "spec"

    def rules(self, kind: str | None = None) -> list[str]:
        """The rules of its jobs (of one kind), in order of first appearance."""
        seen: dict[str, None] = {}
        for job in self.jobs:
            if kind is None or job.kind == kind:
                seen.setdefault(job.rule, None)
        return list(seen)

    def items(self) -> int:
        """Items of its context jobs."""
        return sum(job.items for job in self.jobs if job.kind == "context")


def parse_size(value: Any, what: str, shown: str = "") -> int:
    """Bytes from a number or a size ("7.4GB"), naming ``what`` and ``shown`` (default
    the value) when it is neither (or out of :data:`~.bounds.BYTES`)."""
    from dask.utils import parse_bytes

    check_value(what, str(value), BYTES, shown or str(value))
    return int(parse_bytes(str(value)))


def from_spec(path: Path | str, data: Mapping[str, Any] | None = None) -> Workload:
    """A workload from a YAML spec (see the module's docstring)."""
    if data is None:
        import yaml

        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as error:
            problem = " ".join(str(error).split())
            raise ContextExecutorError(f"Workload spec {path}: {problem}") from None
    if not isinstance(data, Mapping):
        raise ContextExecutorError(f"Workload spec {path}: a mapping with 'stages' expected.")
    contexts = {
        str(name): _context(str(name), _mapping(item, f"context {name!r}", path), path)
        for name, item in _mapping(data.get("contexts"), "contexts", path).items()
    }
    stages = data.get("stages") or []
    if not isinstance(stages, list):
        raise ContextExecutorError(f"Workload spec {path}: 'stages' is a list of mappings.")
    jobs: list[SimJob] = []
    by_stage: dict[str, list[str]] = {}
    for index, stage in enumerate(stages):
        jobs.extend(
            _stage(_mapping(stage, f"stage {index + 1}", path), index, contexts, by_stage, path)
        )
        if len(jobs) > MAX_JOBS:
            raise ContextExecutorError(
                f"Workload spec {path}: more than {MAX_JOBS:,} jobs (each an event of the "
                "simulation). Fix: fewer jobs, or more items per job (per_job)."
            )
    if not jobs:
        raise ContextExecutorError(f"Workload spec {path}: no stages. Fix: add one (see --help).")
    return Workload(jobs, contexts, source=str(path))


def _mapping(value: Any, what: str, path: Path | str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ContextExecutorError(
            f"Workload spec {path}: {what} is {value!r}, not a mapping (see --help)."
        )
    return dict(value)


def _context(name: str, item: dict[str, Any], path: Path | str) -> ContextModel:
    identity = hashlib.sha256(f"simulated context {name}".encode()).hexdigest()
    return ContextModel(
        name=name,
        identity=identity,
        nbytes=parse_size(item.get("bytes", 0), f"{path}: context {name!r} bytes"),
        converts=bool(item.get("converts", False)),
        caches=bool(item.get("caches", True)),
        shareable=bool(item.get("shareable", True)),
        job_bytes=parse_size(item.get("job_bytes", 0), f"{path}: context {name!r} job_bytes"),
    )


def _stage(
    stage: dict[str, Any],
    index: int,
    contexts: dict[str, ContextModel],
    by_stage: dict[str, list[str]],
    path: Path | str,
) -> list[SimJob]:
    rule = str(stage.get("rule") or f"stage{index}")
    context = stage.get("context")
    if context is not None and str(context) not in contexts:
        contexts[str(context)] = _context(str(context), {}, path)
    local = bool(stage.get("local", False))
    kind = "local" if local else ("context" if context else "plain")
    where = f"Workload spec {path}: stage {rule!r}"

    def whole(key: str, default: Any, allowed: Allowed) -> int:
        value = stage.get(key, default)
        return int(check_value(f"{where}: {key}", str(value), allowed, str(value)))

    per_job = whole("per_job", 1, ITEMS)
    if stage.get("items") is not None:
        items = whole("items", None, Allowed(WHOLE, least=1, most=per_job * MAX_JOBS))
        sizes = [per_job] * (items // per_job)
        if items % per_job:
            sizes.append(items % per_job)
    else:
        sizes = [per_job] * whole("count", 1, _COUNT)
    deps: list[str] = []
    after = stage.get("after") or []
    for name in after if isinstance(after, list) else [after]:
        if name not in by_stage:
            raise ContextExecutorError(
                f"Workload spec {path}: stage {rule!r} comes after {name!r}, which no "
                "earlier stage is. Fix: list stages in the order they run."
            )
        deps.extend(by_stage[name])
    requirements = Requirements(
        gpu=whole("gpu", 0 if local else 1, _GPUS),
        gpu_model=stage.get("gpu_model"),
        mem_mb=stage.get("mem_mb"),
    )
    priority = whole("priority", 0, _PRIORITY)
    width = max(1, int(math.log10(max(1, len(sizes)))) + 1)
    jobs = [
        SimJob(
            jobid=f"{rule}-{n:0{width}d}",
            rule=rule,
            kind=kind,
            context=str(context) if context else None,
            items=size,
            deps=tuple(deps),
            requirements=requirements,
            priority=priority,
        )
        for n, size in enumerate(sizes)
    ]
    by_stage[rule] = [job.jobid for job in jobs]
    return jobs
