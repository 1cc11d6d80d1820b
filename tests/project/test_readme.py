"""The README stays a true front page: its example runs, the docs hold the same files and
every setting, its links lead to pages and headings that exist, it stays short, and CI
calls its test command."""

from __future__ import annotations

import re
from dataclasses import fields

import pytest

from snakemake_executor_context.executor.settings import ExecutorSettings, Tuning
from snakemake_executor_context.settings.table import PILOT_KEYS
from tests.conftest import REPO, context_run, snakemake

README = (REPO / "README.md").read_text()
DOCS = REPO / "docs"
MAX_README_LINES = 250


def examples(text: str) -> dict[str, str]:
    """Code blocks preceded by an ``<!-- example: path -->`` marker."""
    found = re.findall(r"<!-- example: (\S+) -->\n```\w*\n(.*?)```", text, flags=re.S)
    return dict(found)


@pytest.mark.slow
def test_readme_example_runs_under_context_and_local(tmp_path):
    files = examples(README)
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


def test_contexts_page_shows_the_readme_example():
    assert examples((DOCS / "contexts.md").read_text()) == examples(README)


def test_settings_page_lists_every_setting():
    page = (DOCS / "settings.md").read_text()
    for field in fields(ExecutorSettings):
        flag = "--context-" + field.name.replace("_", "-")
        assert f"| `{flag}` |" in page, flag
    for field in fields(Tuning):
        assert f"| `{field.name}` |" in page, f"--context-tuning {field.name}"
    for key in PILOT_KEYS:
        assert f"| `{key}` |" in page, f"--context-pilots {key}"


def test_readme_settings_tour_names_real_settings():
    flags = {"--context-" + field.name.replace("_", "-") for field in fields(ExecutorSettings)}
    toured = re.findall(r"^\| `(--context-[a-z-]+)` \|", README, flags=re.M)
    assert 8 <= len(toured) <= 12
    assert set(toured) <= flags


def test_readme_is_a_front_page():
    assert len(README.splitlines()) <= MAX_README_LINES


def test_readme_links_lead_to_docs_pages_and_headings():
    from markdown.extensions.toc import slugify  # MkDocs's default heading ids

    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#([^)\s]+))?\)", README)
    assert len(links) >= 15
    for path, anchor in links:
        page = REPO / path
        assert page.is_file(), path
        if anchor:
            headings = re.findall(r"^#{1,6} (.+)$", page.read_text(), flags=re.M)
            assert anchor in {slugify(heading, "-") for heading in headings}, (path, anchor)


def test_ci_runs_the_readme_test_command():
    command = '.venv/bin/python -m pytest -m "not long"'
    assert f"\n{command}\n" in README
    assert f"\n{command}\n" in (REPO / ".ci/run").read_text()
    assert "bash .ci/setup && .venv/bin/snakemake -s workflows/factcheck/Snakefile" in README


def test_docs_home_shows_the_readme_set_up_commands():
    def set_up(text: str) -> str:
        return text.split("## Set-up: two commands", 1)[1].split("```bash\n", 1)[1].split("```")[0]

    assert set_up((DOCS / "index.md").read_text()) == set_up(README)
