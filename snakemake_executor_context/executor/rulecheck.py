"""Checks at the start of a run, before any job is submitted: pure functions of the
workflow's rules and settings. Each refusal names the rule, the context and the fix."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from snakemake_interface_executor_plugins.settings import SharedFSUsage

from ..contexts import ContextDeclaration, undeclared
from ..errors import ContextDeclarationError, ContextExecutorError

__all__ = ["REQUIRED_SHARED_FS", "check_context_rules", "check_shared_fs", "constant_resource"]

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
        label = f"context '{resource.value}'" if not resource.is_evaluable() else "a context"
        if not resource.is_evaluable() and resource.value not in declarations:
            raise undeclared(name, resource.value, declarations)
        kind = _rule_kind(rule)
        if kind is not None:
            raise ContextDeclarationError(
                f"Rule '{name}' names {label} but uses {kind}; a context rule runs a "
                "Python `script:` (.py) inside a context server. Fix: move the code into "
                "a .py script, or remove `context=` from the rule's resources."
            )
        if rule.shadow_depth:
            raise ContextDeclarationError(
                f"Rule '{name}' names {label} and `shadow: \"{rule.shadow_depth}\"`; a "
                "context job runs in the server's process, in the workflow directory, "
                "not in a shadow directory. Fix: remove `shadow:` from the rule."
            )
        software = []
        if "conda" in deployment and rule.conda_env:
            software.append("conda:")
        if "apptainer" in deployment and rule.container_img:
            software.append("container:")
        if "env-modules" in deployment and rule.env_modules:
            software.append("envmodules:")
        if software:
            raise ContextDeclarationError(
                f"Rule '{name}' names {label} and {' and '.join(software)} while "
                "software deployment is on; a context job runs in the server's own Python "
                "environment, which cannot switch per job. Fix: install what the script "
                "needs in the servers' environment and drop the directive, or remove "
                "`context=` from the rule."
            )


def _rule_kind(rule: Any) -> str | None:
    if rule.is_shell:
        return "`shell:`"
    if rule.is_wrapper:
        return "`wrapper:`"
    if rule.is_notebook:
        return "`notebook:`"
    if rule.is_cwl:
        return "`cwl:`"
    if rule.is_template_engine:
        return "`template_engine:`"
    if rule.norun:
        return "no action (no `script:`)"
    if rule.is_run:
        return "`run:`"
    script = str(rule.script)
    if not script.endswith(".py"):
        return f"a non-Python script ({script})"
    return None


def _resource_of(rule: Any, name: str) -> Any:
    """The rule's Resource called ``name``; None if the rule does not set it."""
    resources = getattr(rule, "resources", None)
    if resources is None or name not in resources:
        return None
    resource = resources[name]
    if not resource.is_evaluable() and resource.value is None:
        return None
    return resource


def constant_resource(rule: Any, name: str) -> Any:
    """The value of a rule's resource when it is a constant (None otherwise)."""
    resource = _resource_of(rule, name)
    if resource is None or resource.is_evaluable():
        return None
    return resource.value


def check_pool_fits(rules: Iterable[Any], kinds: Sequence[Mapping[str, Any]]) -> None:
    """Every rule a pool's pilots must run fits one kind of pilot: a job that fits
    waits for a pilot however long the batch queue takes; one that fits none fails
    here, at start, naming the rule, the kinds and the fix."""
    from ..fleet.pool import kind_resources
    from ..fleet.resources import covers, job_resources, requirements_from

    offered = [
        kind_resources(k.get("gpu_type"), int(k.get("gpus", 0)), int(k.get("memory_bytes", 0)))
        for k in kinds
    ]
    described = "; ".join(
        f"{k.get('gpus', 0)} x {k.get('gpu_type') or 'GPU'}, {k.get('memory', '?')}" for k in kinds
    )
    for rule in rules:
        if getattr(rule, "is_local", False):
            continue
        names = ("gpu", "gpu_model", "gpu_manufacturer", "mem_mb")
        req = requirements_from({n: constant_resource(rule, n) for n in names})
        wanted = job_resources(req)
        if wanted and not any(covers(kind, wanted) for kind in offered):
            raise ContextExecutorError(
                f"Rule '{rule.name}' asks for {req.describe()}, which no pilot of the pool "
                f"can offer (pilots: {described}). Fix: --context-pilot-gpu-types, "
                "--context-pilot-gpus or --context-pilot-memory, or the rule's resources."
            )
