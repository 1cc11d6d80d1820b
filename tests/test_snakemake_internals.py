"""The Snakemake internals the plugin reads: all in one module, checked at start.

The unit tests run against whatever Snakemake is installed: the newest in the normal
run, the oldest the dependencies allow in CI's oldest-versions step (.ci/oldest).
"""

from __future__ import annotations

import ast
import re
import textwrap
import tomllib
from pathlib import Path

import pytest
import snakemake

from snakemake_executor_context.errors import UnsupportedSnakemakeError
from snakemake_executor_context.snakemake_internals import (
    CHECKED_AGAINST,
    INTERNALS,
    check_snakemake,
    places,
)
from tests.conftest import REPO, context_run
from tests.project.test_architecture import MONITOR, SOURCES

INTERNALS_MODULE = "snakemake_executor_context.snakemake_internals"


def test_the_installed_snakemake_has_every_internal_the_plugin_reads():
    check_snakemake()  # raises naming what is missing


@pytest.mark.parametrize(
    ("name", "spec"),
    [
        ("workflow.made_up", "snakemake.workflow:Workflow.made_up"),
        ("snakemake.made_up", "snakemake.made_up:"),
        ("job.made_up()", "snakemake.jobs:Job.made_up()"),
        ("get_source(made_up)", "snakemake.script:get_source(made_up)"),
        ("rule.is_shell, .made_up", "snakemake.rules:Rule.is_shell .made_up"),
    ],
    ids=["attribute", "module", "method", "parameters", "second-part"],
)
def test_a_made_up_shape_is_refused_in_one_line_naming_the_version(name, spec):
    with pytest.raises(UnsupportedSnakemakeError) as raised:
        check_snakemake({"workflow.rules": "snakemake.workflow:Workflow.rules", name: spec})
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"This plugin reads {name}, which Snakemake ")
    assert f"Snakemake {snakemake.__version__} does not have; supported: " in message
    assert "workflow.rules" not in message  # only what is missing
    assert f"checked against {' and '.join(CHECKED_AGAINST)}" in message


def test_places_expand_to_full_paths():
    assert places("snakemake.dag:DAG.needrun_jobs .jobs Other.x f(a,b) snakemake.io:") == [
        "snakemake.dag:DAG.needrun_jobs",
        "snakemake.dag:DAG.jobs",
        "snakemake.dag:Other.x",
        "snakemake.dag:f(a,b)",
        "snakemake.io:",
    ]
    assert places("m:C.f(a) .g") == ["m:C.f(a)", "m:C.g"]
    assert all(":" in place for spec in INTERNALS.values() for place in places(spec))


def test_the_oldest_checked_version_is_the_declared_lower_bound():
    """CHECKED_AGAINST starts at pyproject.toml's lower bound, which CI installs."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (spec,) = [d for d in project["dependencies"] if re.match(r"snakemake\s*[<>=]", d)]
    assert re.search(r">=\s*([\w.]+)", spec).group(1) == CHECKED_AGAINST[0]


def _snakemake_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and not node.level
            else []
        )
        found.update(n for n in names if n == "snakemake" or n.startswith("snakemake."))
    return found


def test_only_the_internals_module_imports_snakemake():
    """Snakemake's own modules (not its plugin interfaces) are imported in one place."""
    importers = {
        name: imports
        for name, path in {**SOURCES, **MONITOR}.items()
        if name != INTERNALS_MODULE and (imports := _snakemake_imports(path))
    }
    assert not importers, importers
    assert _snakemake_imports(SOURCES[INTERNALS_MODULE])  # the check above reads imports


#: Names of Snakemake's that only its internals have (private, or the DAG's and jobs'
#: own), taken from INTERNALS: reading one elsewhere bypasses the start check.
INTERNAL_NAMES = {
    name
    for key in INTERNALS
    for name in re.findall(r"\.(\w+)", key)
    if name.startswith("_") or name in {"needrun_jobs", "is_norun", "wildcards_dict", "norun"}
} - {"_lock", "_processes", "_names", "_group"}  # private names the plugin's own classes use too


def _internal_reads(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr in INTERNAL_NAMES
        # internals.wildcards_dict(job): the accessor, not the attribute
        and not (isinstance(node.value, ast.Name) and node.value.id == "internals")
    } | {
        node.args[1].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and node.args[1].value in INTERNAL_NAMES
    }


def test_only_the_internals_module_reads_snakemakes_internal_attributes():
    """An attribute only Snakemake's internals have (``_user_kill``, ``needrun_jobs``,
    ``wildcards_dict``...) is read in one place, the module checked at start: imports
    alone would not show ``getattr(scheduler, "_user_kill")`` in another module."""
    assert {"_user_kill", "_localrules", "needrun_jobs", "wildcards_dict"} <= INTERNAL_NAMES
    readers = {
        name: reads
        for name, path in {**SOURCES, **MONITOR}.items()
        if name != INTERNALS_MODULE and (reads := _internal_reads(path))
    }
    assert not readers, readers
    assert _internal_reads(SOURCES[INTERNALS_MODULE]) >= {"_user_kill", "needrun_jobs"}


@pytest.mark.slow
def test_a_snakemake_without_an_internal_fails_at_start_in_one_line(toy_workflow, tmp_path):
    """A Snakemake without ``snakemake.benchmark.write_benchmark_records`` (removed by
    a sitecustomize before the run; Snakemake itself needs it only for a job with a
    benchmark): the run stops before any cluster starts."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        textwrap.dedent("""
        import snakemake.api
        import snakemake.benchmark
        del snakemake.benchmark.write_benchmark_records
        """)
    )
    workdir = toy_workflow(
        """
                rule use:
                    output: "out.txt"
                    resources: context="toy"
                    script: "scripts/use.py"
                """,
    )
    run = context_run(workdir, env={"PYTHONPATH": str(site)})
    assert run.returncode != 0, run.output
    line = (
        "This plugin reads snakemake.benchmark.BenchmarkRecord, .benchmarked(pid, "
        "benchmark_record), .write_benchmark_records(records, path, extended_fmt), which "
        f"Snakemake {snakemake.__version__} does not have; supported: "
    )
    assert line in run.output, run.output
    assert "Traceback (most recent call last)" not in run.output, run.output
    assert "server(s) on the" not in run.output  # no cluster was started
    assert not (workdir / "out.txt").exists()


def test_only_the_job_schedulers_wake_up_timers_are_cancelled_at_shutdown():
    """Snakemake's scheduler leaves a non-daemon 1 s Timer behind each pass of its loop
    (it kept the process alive after the last job), and the plugin's one pending
    wake-up stands in for them; the plugin cancels those, and no other timer."""
    import threading

    from snakemake_executor_context.snakemake_internals import (
        REEVALUATION_TIMER,
        cancel_scheduler_timers,
    )

    theirs = eval(compile("lambda: None", "/x/snakemake/scheduling/job_scheduler.py", "eval"))
    wake_up = threading.Timer(60, theirs)
    ours = threading.Timer(60, lambda: None)
    ours.name = REEVALUATION_TIMER
    other = threading.Timer(60, lambda: None)
    for timer in (wake_up, ours, other):
        timer.start()
    try:
        assert cancel_scheduler_timers() == 2
        wake_up.join(5)
        ours.join(5)
        assert not wake_up.is_alive() and not ours.is_alive() and other.is_alive()
    finally:
        other.cancel()
