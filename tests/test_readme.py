"""The README stays true: its example runs, its settings table is complete, and CI
calls its test command."""

from __future__ import annotations

import re
from dataclasses import fields

import pytest

from snakemake_executor_context.executor.settings import ExecutorSettings

from .conftest import REPO, context_run, snakemake

README = (REPO / "README.md").read_text()


def examples() -> dict[str, str]:
    """Code blocks preceded by an ``<!-- example: path -->`` marker."""
    found = re.findall(r"<!-- example: (\S+) -->\n```\w*\n(.*?)```", README, flags=re.S)
    return dict(found)


@pytest.mark.slow
def test_readme_example_runs_under_context_and_local(tmp_path):
    files = examples()
    assert set(files) == {"Snakefile", "loaders.py", "scripts/embed.py"}
    outputs = {}
    for executor in ("context", "local"):
        workdir = tmp_path / executor
        for name, content in files.items():
            (workdir / name).parent.mkdir(parents=True, exist_ok=True)
            (workdir / name).write_text(content)
        if executor == "context":
            run = context_run(workdir).check()
            (summary,) = run.summaries()
            assert sum(job["items"] for job in summary["jobs"]) == 4
        else:
            snakemake(workdir, "--executor", "local", "--cores", "2").check()
        outputs[executor] = {
            path.name: path.read_text() for path in sorted((workdir / "vectors").iterdir())
        }
    assert len(outputs["context"]) == 4
    assert outputs["context"] == outputs["local"]


def test_settings_table_lists_every_setting():
    for field in fields(ExecutorSettings):
        flag = "--context-" + field.name.replace("_", "-")
        assert f"| `{flag}` |" in README, flag


def test_ci_runs_the_readme_test_command():
    command = ".venv/bin/python -m pytest"
    assert f"\n{command}\n" in README
    assert f"\n{command}\n" in (REPO / ".ci/run").read_text()
    assert "bash .ci/setup && .venv/bin/snakemake -s workflows/factcheck/Snakefile" in README
