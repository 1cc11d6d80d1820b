"""Snakemake's own test workflows pass under ``--executor context`` (see
:mod:`tests.e2e.snakemake_suite` for the cases, and those that cannot apply)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.conftest import context_run
from tests.e2e.snakemake_suite import (
    CACHE_ENV,
    CASES,
    NOT_APPLICABLE,
    Case,
    differences,
    fetch_tests,
    prepare,
    require,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def snakemake_tests() -> Path:
    """Snakemake's tests/ from the installed version's source distribution."""
    default = Path.home() / ".cache" / "snakemake-executor-plugin-context"
    try:
        return fetch_tests(Path(os.environ.get(CACHE_ENV) or default))
    except Exception as error:
        if require():
            pytest.fail(f"Snakemake's test workflows are required: {error}")
        pytest.skip(f"Snakemake's test workflows are not available: {error}")


@pytest.mark.parametrize("case", [pytest.param(case, id=case.name) for case in CASES])
def test_snakemake_workflow(case: Case, snakemake_tests: Path, tmp_path: Path) -> None:
    workdir = prepare(case, snakemake_tests, tmp_path / "wf")
    run = context_run(workdir, "--context-servers", "2", *case.args, timeout=240)
    if case.shouldfail:
        assert run.returncode != 0, run.output
        assert case.failure_text in run.output, run.output
        assert "Traceback" not in run.output, run.output
        return
    run.check()
    assert not differences(case, snakemake_tests, workdir), run.output


@pytest.mark.long
@pytest.mark.timeout(900)
def test_pipes_fail_20_times_in_a_row(snakemake_tests: Path, tmp_path: Path) -> None:
    """test_pipes_fail hung in about one run in 10-20 before the job processes ended
    failed pipe groups (server/pipegroups.py): 20 runs in a row each end, and fail."""
    (case,) = [case for case in CASES if case.name == "test_pipes_fail"]
    for attempt in range(1, 21):
        workdir = prepare(case, snakemake_tests, tmp_path / f"wf{attempt}")
        started = time.monotonic()
        run = context_run(workdir, "--jobs", "2", "--context-servers", "2", timeout=120)
        assert run.returncode != 0, run.output
        assert case.failure_text in run.output, run.output
        assert "Traceback" not in run.output, run.output
        print(f"run {attempt}: ended, exit {run.returncode}, {time.monotonic() - started:.1f} s")


def test_script_python_reruns(snakemake_tests: Path, tmp_path: Path) -> None:
    """test_script_python's reruns: a script's new mtime alone reruns its job only
    when the code trigger is on."""
    (case,) = [case for case in CASES if case.name == "test_script_python"]
    workdir = prepare(case, snakemake_tests, tmp_path / "wf")
    context_run(workdir, "--context-servers", "2").check()
    os.utime(workdir / "scripts/test_explicit_import.py")
    output = workdir / "explicit_import.py.out"
    before = output.stat().st_mtime
    context_run(workdir, "--context-servers", "2", "--rerun-triggers", "mtime").check()
    assert output.stat().st_mtime == before
    context_run(workdir, "--context-servers", "2").check()
    assert output.stat().st_mtime != before


def test_the_selection_is_large_and_says_what_cannot_apply() -> None:
    names = {case.name for case in CASES}
    assert len(CASES) >= 25
    required = {
        "test_group_jobs",
        "test_multicomp_group_jobs",
        "test_group_job_fail",
        "test_group_temp",
        "test_issue850",
        "test_issue916",
        "test_issue916[in-process]",
        "test_github_issue_14",
        "test_github_issue_14[in-process]",
        "test_script_python",
        "test_checkpoints",
        "test_temp",
        "test_nonstr_params",
        "test_retries",
        "test_default_resources",
        "test_pipes_simple",
    }
    assert required <= names
    assert all(reason for reason in NOT_APPLICABLE.values())


@pytest.mark.parametrize("cases", sorted(NOT_APPLICABLE))
def test_cases_that_cannot_apply(cases: str) -> None:
    pytest.skip(f"{cases}: {NOT_APPLICABLE[cases]}")
