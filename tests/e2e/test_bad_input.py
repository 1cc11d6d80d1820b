"""Bad input gets a clear error that names the rule, the context and the fix."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from snakemake_executor_context import __version__
from tests.conftest import TOY_LOADER, TOY_SCRIPT, context_run, plain_dask_cluster, toy_files

pytestmark = pytest.mark.slow


NOTEBOOK = (
    '{"cells": [], "metadata": {"language_info": {"name": "python"}}, '
    '"nbformat": 4, "nbformat_minor": 5}'
)


def _no_traceback(output: str) -> None:
    assert "Traceback (most recent call last)" not in output, output


def test_undeclared_context_fails_before_any_job(make_workflow):
    workdir = make_workflow(
        toy_files("""
        rule use:
            output: "out.txt"
            resources: context="smollm3"
            script: "scripts/use.py"
    """)
    )
    run = context_run(workdir)
    assert run.returncode != 0
    assert "Rule 'use' uses context 'smollm3', which is not declared (declared: toy)" in run.output
    assert 'declare_context(config, "smollm3"' in run.output
    assert not (workdir / ".snakemake" / "context" / "cluster").exists()  # no cluster started
    _no_traceback(run.output)


def test_undeclared_context_from_a_function_fails_the_job(make_workflow):
    workdir = make_workflow(
        toy_files("""
        rule use:
            output: "out.txt"
            resources: context=lambda wildcards: "other"
            script: "scripts/use.py"
    """)
    )
    run = context_run(workdir)
    assert run.returncode != 0
    assert "Rule 'use' uses context 'other', which is not declared" in run.output


@pytest.mark.parametrize(
    ("action", "named"),
    [
        ('shell: "echo > {output}"', "`shell:`"),
        ('run:\n                open(output[0], "w").close()', "`run:`"),
        ('wrapper: "v3.0.0/bio/samtools/index"', "`wrapper:`"),
        ('notebook: "nb.py.ipynb"', "`notebook:`"),
        ('script: "scripts/use.R"', "a non-Python script (scripts/use.R)"),
    ],
)
def test_context_rule_needs_a_python_script(make_workflow, action, named):
    workdir = make_workflow(
        toy_files(
            f"""
        rule use:
            output: "out.txt"
            resources: context="toy"
            {action}
    """,
            {"scripts/use.R": "1", "nb.py.ipynb": NOTEBOOK},
        )
    )
    run = context_run(workdir)
    assert run.returncode != 0
    assert f"Rule 'use' names context 'toy' but uses {named}" in run.output, run.output
    assert "Fix: move the code into a .py script" in run.output
    _no_traceback(run.output)


def test_context_rule_with_shadow(make_workflow):
    workdir = make_workflow(
        toy_files("""
        rule use:
            output: "out.txt"
            shadow: "minimal"
            resources: context="toy"
            script: "scripts/use.py"
    """)
    )
    run = context_run(workdir)
    assert run.returncode != 0
    assert "Rule 'use' names context 'toy' and `shadow: \"minimal\"`" in run.output
    assert "Fix: remove `shadow:`" in run.output


def test_context_rule_with_software_deployment(make_workflow):
    # envmodules is the deployment method that runs here without conda or apptainer.
    workdir = make_workflow(
        toy_files("""
        rule use:
            output: "out.txt"
            envmodules: "python/3.11"
            resources: context="toy"
            script: "scripts/use.py"
    """)
    )
    run = context_run(workdir, "--software-deployment-method", "env-modules")
    assert run.returncode != 0
    assert "Rule 'use' names context 'toy' and envmodules: while software deployment" in run.output
    # Without deployment, the directive is ignored and the rule runs.
    context_run(workdir).check()


@pytest.mark.parametrize("directive", ["conda", "container"])
def test_conda_and_container_rules_are_refused(tmp_path, directive):
    """conda and apptainer are not installed here, and Snakemake checks them before
    any executor starts: check_context_rules is tested on the real parsed rules."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, ResourceSettings

    from snakemake_executor_context.contexts import declarations_from_config
    from snakemake_executor_context.errors import ContextDeclarationError
    from snakemake_executor_context.executor.rulecheck import check_context_rules

    value = '"env.yaml"' if directive == "conda" else '"docker://python:3.11"'
    for name, content in toy_files(
        f"""
        rule use:
            output: "out.txt"
            {directive}: {value}
            resources: context="toy"
            script: "scripts/use.py"
    """,
        {"env.yaml": "dependencies: [python]"},
    ).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(content)
    with SnakemakeApi() as api:
        workflow_api = api.workflow(
            resource_settings=ResourceSettings(),
            config_settings=ConfigSettings(),
            snakefile=tmp_path / "Snakefile",
            workdir=tmp_path,
        )
        workflow = workflow_api._workflow
        rules = list(workflow.rules)
        declarations = declarations_from_config(workflow.config)
    method = "conda" if directive == "conda" else "apptainer"
    expected = f"Rule 'use' names context 'toy' and {directive}:"
    with pytest.raises(ContextDeclarationError, match=expected):
        check_context_rules(rules, declarations, {method})
    check_context_rules(rules, declarations, set())  # fine without deployment


def test_loader_that_raises_fails_the_job_and_is_retried(make_workflow):
    loader = """
import os

calls = 0

def load(value=1):
    global calls
    calls += 1
    if calls == 1:
        raise RuntimeError("the first load fails")
    return {"value": value}
"""
    workdir = make_workflow(
        toy_files(
            """
        rule all:
            input: expand("out/{i}.txt", i=range(2))

        rule use:
            output: "out/{i}.txt"
            resources: context="toy"
            script: "scripts/use.py"
    """,
            {"loader.py": loader},
        )
    )
    run = context_run(workdir, "--context-servers", "1", "--keep-going")
    assert run.returncode != 0
    expected = "Context 'toy': loader 'loader.py:load' raised RuntimeError: the first load fails"
    assert expected in run.output
    assert "Rule 'use'" in run.output and "next job that needs this context tries" in run.output
    outputs = sorted(p.name for p in (workdir / "out").glob("*.txt"))
    assert len(outputs) == 1  # the second job loaded it again, and succeeded
    logs = list((workdir / ".snakemake/context/logs/use").glob("*.log"))
    failed = [p.read_text() for p in logs if "RuntimeError" in p.read_text()]
    assert len(failed) == 1
    assert 'raise RuntimeError("the first load fails")' in failed[0]
    assert "loader.py" in failed[0]


def test_loader_not_importable_on_the_servers(make_workflow, scheduler_file, tmp_path):
    """The module imports in the Snakemake process (PYTHONPATH) but not on servers
    started without it."""
    libdir = tmp_path / "only_here"
    libdir.mkdir()
    (libdir / "onlyhere_loader.py").write_text(TOY_LOADER)
    workdir = make_workflow(
        {
            "Snakefile": textwrap.dedent("""
            from snakemake_executor_context import declare_context
            declare_context(config, "toy", "onlyhere_loader:load", value=2)

            rule use:
                output: "out.txt"
                resources: context="toy"
                script: "scripts/use.py"
        """),
            "scripts/use.py": TOY_SCRIPT,
        }
    )
    run = context_run(
        workdir,
        "--context-scheduler-file",
        str(scheduler_file),
        env={"PYTHONPATH": str(libdir)},
    )
    assert run.returncode != 0
    expected = "Context 'toy': loader 'onlyhere_loader:load' could not be imported on host"
    assert expected in run.output
    assert "ModuleNotFoundError" in run.output
    assert "Fix: install the package in the servers' Python environment" in run.output


def test_version_skew_is_refused(make_workflow, tmp_path):
    """A worker whose plugin reports another version (patched by a preload)."""
    preload = tmp_path / "skew_preload.py"
    preload.write_text(
        "import snakemake_executor_context.server.calls as server\n"
        "server.__version__ = '0.0.0+skew'\n"
    )
    with plain_dask_cluster(tmp_path, "--preload", str(preload)) as scheduler:
        workdir = make_workflow(
            toy_files("""
            rule use:
                output: "out.txt"
                resources: context="toy"
                script: "scripts/use.py"
        """)
        )
        run = context_run(
            workdir, "--context-scheduler-file", str(scheduler), "--context-allow-plaintext"
        )
    assert run.returncode != 0
    assert "The attached servers run other versions than this client" in run.output
    assert f"snakemake-executor-plugin-context {__version__}" in run.output  # ours
    assert "snakemake-executor-plugin-context 0.0.0+skew" in run.output  # theirs
    _no_traceback(run.output)


@pytest.mark.parametrize(
    ("resources", "says"),
    [
        ("gpu=2", "asks for gpu=2, which no server of the embedded cluster offers"),
        ('gpu=1, gpu_model="h100"', "asks for gpu=1, gpu_model=h100, which no server"),
        ("mem_mb=10_000_000", "asks for mem_mb=10000000, which no server"),
    ],
)
def test_a_rule_no_server_of_the_embedded_cluster_fits_fails_at_start(
    make_workflow, resources, says
):
    workdir = make_workflow(
        toy_files(f"""
        rule use:
            output: "out.txt"
            resources: context="toy", {resources}
            script: "scripts/use.py"
    """)
    )
    run = context_run(workdir, "--context-servers", "1")
    assert run.returncode != 0
    assert f"Rule 'use' {says}" in run.output, run.output
    assert "(servers: cpu0 (gpu=1" in run.output
    assert "--set-resources use:" in run.output
    assert "Traceback (most recent call last)" not in run.output
    # Refused before any job was submitted.
    assert "Job stats:" not in run.output, run.output
    assert not (workdir / "out.txt").exists()


# Asked for by functions of the wildcards: only the job knows them, so the job reaches
# placement, which refuses it with the fleet it saw.
@pytest.mark.parametrize(
    ("resources", "reason"),
    [
        ("gpu=lambda wildcards: 2", "gpu=2 but the servers have at most 1"),
        (
            'gpu=1, gpu_model=lambda wildcards: "h100"',
            "gpu_model='h100' but no server has that GPU model",
        ),
        ("mem_mb=lambda wildcards: 10_000_000", "mem_mb=10000000 but the largest server has"),
    ],
)
def test_job_no_server_can_run_fails_fast(make_workflow, resources, reason):
    workdir = make_workflow(
        toy_files(f"""
        rule use:
            output: "out.txt"
            resources: context="toy", {resources}
            script: "scripts/use.py"
    """)
    )
    started = time.monotonic()
    run = context_run(workdir, "--context-servers", "1")
    assert time.monotonic() - started < 60
    assert run.returncode != 0
    assert f"No context server can run rule 'use': {reason}" in run.output, run.output
    assert "Job stats:" in run.output  # the run started: placement refused the job
    assert "Servers seen: cpu0 (gpu=1" in run.output
    assert "--set-resources use:" in run.output


def test_job_waits_for_a_server_on_an_attached_cluster(make_workflow, scheduler_file):
    workdir = make_workflow(
        toy_files("""
        rule use:
            output: "out.txt"
            resources: context="toy", gpu=4
            script: "scripts/use.py"
    """)
    )
    started = time.monotonic()
    run = context_run(
        workdir,
        "--context-scheduler-file",
        str(scheduler_file),
        "--context-tuning",
        "wait_for_server=3",
    )
    waited = time.monotonic() - started
    assert run.returncode != 0
    assert "No context server can run rule 'use' after waiting" in run.output
    assert 3 <= waited < 60


@pytest.mark.parametrize(
    ("usage", "missing"),
    [
        (["persistence", "input-output", "sources"], "software-deployment"),
        (["input-output", "software-deployment", "source-cache"], "persistence sources"),
    ],
)
def test_shared_fs_usage_lacking_what_servers_need_is_refused(make_workflow, usage, missing):
    workdir = make_workflow(
        toy_files("""
        rule use:
            output: "out.txt"
            resources: context="toy"
            script: "scripts/use.py"
    """)
    )
    run = context_run(workdir, "--shared-fs-usage", *usage)
    assert run.returncode != 0
    assert f"--shared-fs-usage lacks {missing}:" in run.output
    assert f"Fix: add {missing} to --shared-fs-usage" in run.output
    _no_traceback(run.output)


def test_script_error_fails_only_that_job(make_workflow):
    script = """
from snakemake_executor_context import load_context

obj = load_context(snakemake)
if snakemake.wildcards.i == "1":
    print("about to fail")
    raise ValueError("bad claim 1")
with open(snakemake.output[0], "w") as f:
    f.write(str(obj["value"]))
"""
    workdir = make_workflow(
        toy_files(
            """
        rule all:
            input: expand("out/{i}.txt", i=range(4))

        rule use:
            output: "out/{i}.txt"
            resources: context="toy"
            script: "scripts/use.py"
    """,
            {"scripts/use.py": script},
        )
    )
    run = context_run(workdir, "--keep-going", "--context-servers", "1")
    assert run.returncode != 0
    assert sorted(p.name for p in (workdir / "out").glob("*")) == ["0.txt", "2.txt", "3.txt"]
    assert "Rule 'use' (i=1) (context 'toy') failed on cpu0" in run.output
    assert "ValueError: bad claim 1" in run.output
    log = next(p for p in Path(workdir, ".snakemake/context/logs/use").glob("i=1.*.log"))
    text = log.read_text()
    assert text.startswith("about to fail")
    assert text.rstrip().endswith("ValueError: bad claim 1")
    assert 'raise ValueError("bad claim 1")' in text
    assert str(log) in run.output  # passed to Snakemake as the job's log
    (summary,) = run.summaries()
    (server,) = summary["servers"].values()
    assert server["loads"] == 1  # the server survived the error with its context


def test_missing_output_is_named(make_workflow):
    script = "from snakemake_executor_context import load_context\nload_context(snakemake)\n"
    workdir = make_workflow(
        toy_files(
            """
        rule use:
            output: "out.txt", "never.txt"
            resources: context="toy"
            script: "scripts/use.py"
    """,
            {"scripts/use.py": script},
        )
    )
    run = context_run(workdir)
    assert run.returncode != 0
    assert "declared output 'out.txt', 'never.txt' is missing" in run.output


def test_sys_exit(make_workflow):
    script = """
import sys
open(snakemake.output[0], "w").close()
sys.exit(int(snakemake.wildcards.code))
"""
    workdir = make_workflow(
        toy_files(
            """
        rule all:
            input: "out/0.txt", "out/3.txt"

        rule use:
            output: "out/{code}.txt"
            resources: context="toy"
            script: "scripts/use.py"
    """,
            {"scripts/use.py": script},
        )
    )
    run = context_run(workdir, "--keep-going")
    assert run.returncode != 0
    assert (workdir / "out/0.txt").exists()  # SystemExit(0) is success
    assert not (workdir / "out/3.txt").exists()
    assert "the script called sys.exit(3)" in run.output
