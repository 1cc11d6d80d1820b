"""Checks at the start of a run, before any job is submitted: pure functions of the
workflow's rules and settings. Each refusal names the rule, the context and the fix."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from snakemake_interface_executor_plugins.settings import SharedFSUsage

from ..contexts import ContextDeclaration, undeclared
from ..errors import ContextDeclarationError, ContextExecutorError
from ..settings.table import executor_flag
from ..snakemake_internals import (
    RuleResource,
    rule_action,
    rule_resource,
    rule_script,
    shadow_depth,
    software_directives,
    written_resource,
)

if TYPE_CHECKING:
    from ..cluster.info import PlannedServer

__all__ = [
    "REQUIRED_SHARED_FS",
    "check_context_rules",
    "check_fleet_fits",
    "check_pool_fits",
    "check_resources",
    "check_shared_fs",
    "constant_resource",
]

#: What servers need to share with the Snakemake process: they read inputs and write
#: outputs in place, plain jobs write Snakemake's metadata, read the Snakefile, and
#: run the same Python.
REQUIRED_SHARED_FS = (
    SharedFSUsage.PERSISTENCE,
    SharedFSUsage.INPUT_OUTPUT,
    SharedFSUsage.SOURCES,
    SharedFSUsage.SOFTWARE_DEPLOYMENT,
)


def check_shared_fs(usage: Iterable[SharedFSUsage]) -> None:
    """Refuse a --shared-fs-usage that lacks what servers need, naming what is missing."""
    present = set(usage)
    missing = [item for item in REQUIRED_SHARED_FS if item not in present]
    if missing:
        names = " ".join(item.item_to_choice() for item in missing)
        raise ContextExecutorError(
            f"--shared-fs-usage lacks {names}: context servers read inputs and write "
            "outputs in the workflow directory, run Snakemake's job command with the same "
            f"Python, and record job metadata there. Fix: add {names} to "
            "--shared-fs-usage (the default is all), or use an executor that stages files."
        )


def check_context_rules(
    rules: Iterable[Any], declarations: dict[str, ContextDeclaration], deployment: set[str]
) -> None:
    """Refuse rules that cannot run against a context, before any job is submitted."""
    for rule in rules:
        resource = _resource_of(rule, "context")
        if resource is None:
            continue
        name = rule.name
        label = f"context '{resource.value}'" if not resource.evaluable else "a context"
        if not resource.evaluable and resource.value not in declarations:
            raise undeclared(name, resource.value, declarations)
        kind = _rule_kind(rule)
        if kind is not None:
            raise ContextDeclarationError(
                f"Rule '{name}' names {label} but uses {kind}; a context rule runs a "
                "Python `script:` (.py) inside a context server. Fix: move the code into "
                "a .py script, or remove `context=` from the rule's resources."
            )
        if shadow_depth(rule):
            raise ContextDeclarationError(
                f"Rule '{name}' names {label} and `shadow: \"{shadow_depth(rule)}\"`; a "
                "context job runs in the server's process, in the workflow directory, "
                "not in a shadow directory. Fix: remove `shadow:` from the rule."
            )
        software = []
        has = software_directives(rule)
        if "conda" in deployment and has["conda"]:
            software.append("conda:")
        if "apptainer" in deployment and has["apptainer"]:
            software.append("container:")
        if "env-modules" in deployment and has["env-modules"]:
            software.append("envmodules:")
        declaration = declarations.get(resource.value) if not resource.evaluable else None
        if declaration is not None and declaration.ranks > 1:
            _check_gang_gpus(rule, declaration)
        if software:
            raise ContextDeclarationError(
                f"Rule '{name}' names {label} and {' and '.join(software)} while "
                "software deployment is on; a context job runs in the server's own Python "
                "environment, which cannot switch per job. Fix: install what the script "
                "needs in the servers' environment and drop the directive, or remove "
                "`context=` from the rule."
            )


def check_resources(rules: Iterable[Any]) -> None:
    """Refuse constant ``gpu`` and ``runtime`` resources that no job can have: a
    negative or fractional ``gpu`` (a server's GPUs are whole), a negative ``runtime``."""
    for rule in rules:
        gpu, runtime = constant_resource(rule, "gpu"), constant_resource(rule, "runtime")
        written = written_resource(rule, "gpu")
        if _number(written) and gpu == round(written):  # not changed by --set-resources
            gpu = written
        if _number(gpu) and (gpu < 0 or gpu != int(gpu)):
            raise ContextExecutorError(
                f"Rule '{rule.name}' asks for gpu={gpu}: GPUs are counted whole, from 0. "
                f"Fix: give it a whole number of GPUs (--set-resources {rule.name}:gpu=1)."
            )
        if _number(runtime) and runtime < 0:
            raise ContextExecutorError(
                f"Rule '{rule.name}' has runtime={runtime}: a time limit cannot be negative. "
                f"Fix: give it its minutes (--set-resources {rule.name}:runtime=30), or none."
            )


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_gang_gpus(rule: Any, declaration: ContextDeclaration) -> None:
    """A context of k ranks puts one process on each of k devices: its rules ask for
    them, so that placement and Snakemake's ``--resources gpu=N`` count them."""
    gpus = constant_resource(rule, "gpu")
    if gpus is None and _resource_of(rule, "gpu") is not None:
        return  # evaluated per job: placement checks each job's own
    if isinstance(gpus, bool) or not isinstance(gpus, (int, float)) or gpus < declaration.ranks:
        k = declaration.ranks
        raise ContextDeclarationError(
            f"Rule '{rule.name}' uses context '{declaration.name}', which spans {k} "
            f"ranks (one process per device), but asks for gpu={gpus or 0}. Fix: give the "
            f"rule gpu={k} in its resources (--set-resources {rule.name}:gpu={k})."
        )


#: How a refusal names a rule's action (by :func:`rule_action`), if not a script.
_ACTIONS = {
    "shell": "`shell:`",
    "wrapper": "`wrapper:`",
    "notebook": "`notebook:`",
    "cwl": "`cwl:`",
    "template_engine": "`template_engine:`",
    "norun": "no action (no `script:`)",
    "run": "`run:`",
}


def _rule_kind(rule: Any) -> str | None:
    action = rule_action(rule)
    if action in _ACTIONS:
        return _ACTIONS[action]
    script = rule_script(rule)
    if not script.endswith(".py"):
        return f"a non-Python script ({script})"
    return None


def _resource_of(rule: Any, name: str) -> RuleResource | None:
    """The rule's resource called ``name``; None if the rule does not set it."""
    resource = rule_resource(rule, name)
    if resource is None or (not resource.evaluable and resource.value is None):
        return None
    return resource


def constant_resource(rule: Any, name: str) -> Any:
    """The value of a rule's resource when it is a constant (None otherwise)."""
    resource = _resource_of(rule, name)
    if resource is None or resource.evaluable:
        return None
    return resource.value


def check_pool_fits(rules: Iterable[Any], kinds: Sequence[Mapping[str, Any]]) -> None:
    """Every rule a pool's pilots must run fits one kind of pilot: a job that fits
    waits for a pilot however long the batch queue takes; one that fits none fails
    here, at start, naming the rule, the kinds and the fix."""
    from ..fleet.poolsizing import kind_resources
    from ..fleet.resources import covers

    offered = [
        kind_resources(k.get("gpu_type"), int(k.get("gpus", 0)), int(k.get("memory_bytes", 0)))
        for k in kinds
    ]
    described = "; ".join(
        f"{k.get('gpus', 0)} x {k.get('gpu_type') or 'GPU'}, {k.get('memory', '?')}" for k in kinds
    )
    for rule, req, wanted in _asking(rules):
        if not any(covers(kind, wanted) for kind in offered):
            raise ContextExecutorError(
                f"Rule '{rule.name}' asks for {req.describe()}, which no pilot of the pool "
                f"can offer (pilots: {described}). Fix: --context-pilots gpu_type, gpus "
                "or memory, or the rule's resources."
            )


def check_fleet_fits(rules: Iterable[Any], servers: Sequence[PlannedServer]) -> None:
    """Every rule fits one server of a fleet that will not grow (the embedded
    cluster's): one that fits none fails at start, naming the rule, what it asks, what
    the servers offer and the fix."""
    from ..fleet.resources import covers, describe_offer

    offers = [(s.name, dict(s.resources)) for s in servers]
    described = "; ".join(f"{name} ({describe_offer(offer)})" for name, offer in offers)
    for rule, req, wanted in _asking(rules):
        if not any(covers(offer, wanted) for _, offer in offers):
            most = max((offer.get("gpu", 0) for _, offer in offers), default=0)
            more = (
                f" {executor_flag('gpus_per_server')} {req.gpu} for servers of {req.gpu} GPUs,"
                if req.gpu > most
                else ""
            )
            raise ContextExecutorError(
                f"Rule '{rule.name}' asks for {req.describe()}, which no server of the "
                f"embedded cluster offers (servers: {described}). Fix:{more} "
                f"--set-resources {rule.name}:..., or attach to servers that have them "
                "(--context-scheduler-file)."
            )


def _asking(rules: Iterable[Any]) -> Iterator[tuple[Any, Any, dict[str, float]]]:
    """(rule, its requirements, its Dask resources) of each rule that runs on a server
    and asks for something (GPUs, a model, a maker, memory) in constant resources."""
    from ..fleet.resources import job_resources, requirements_from

    names = ("gpu", "gpu_model", "gpu_manufacturer", "mem_mb")
    for rule in rules:
        if getattr(rule, "is_local", False):
            continue
        req = requirements_from({n: constant_resource(rule, n) for n in names})
        wanted = job_resources(req)
        if wanted:
            yield rule, req, wanted
