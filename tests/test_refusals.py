"""Bad values on the command line: one line that says what is wrong, a non-zero exit,
no traceback, no hang, and nothing created where it should not be.

Each case is a real command (``snakemake-context ...`` or ``snakemake --executor
context ...``) run in a fresh directory of its own. ``{tmp}`` in an argument is that
directory; ``prepare`` makes what the command needs there first (a catalog, a
Snakefile); ``after`` checks afterwards that nothing was created or changed.
The cases are grouped by the part of the plugin that refuses them.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import BIN


@dataclass(frozen=True)
class Refusal:
    """One bad command line and what its refusal must say."""

    id: str
    argv: tuple[str, ...]
    #: A phrase the one-line refusal must contain (case-sensitive).
    says: str
    prepare: Callable[[Path], None] | None = None
    after: Callable[[Path], None] | None = None
    #: Seconds before the command counts as hung (it then fails the test).
    timeout: float = 60


# ---- report, status, story, upgrade and the catalog (snakemake-context ...) ----
def _catalog(tmp: Path) -> None:
    """``{tmp}/c.db``: one run (of this plugin's id form), one job."""
    from tests.catalog_builder import CatalogBuilder

    with CatalogBuilder(tmp / "c.db") as b:
        run = b.run("20261201T070021-4242", jobs_total=1)
        server = b.server("gpu0")
        model = b.context("smollm2")
        b.load(server, model)
        b.job(run, "score", server=server, context=model)
        b.finish_run(run)


def _catalog_without_jobs(tmp: Path) -> None:
    """``{tmp}/c.db`` with its ``jobs`` table dropped (a damaged catalog), and a
    workload spec for ``simulate``."""
    import sqlite3

    _catalog(tmp)
    with sqlite3.connect(tmp / "c.db") as db:
        db.execute("DROP TABLE jobs")
    (tmp / "w.yaml").write_text("contexts: {m: {}}\nstages:\n  - {rule: a, context: m}\n")


def _catalog_and_a_file(tmp: Path) -> None:
    _catalog(tmp)
    (tmp / "file").write_text("x")


def _nothing_at(*names: str) -> Callable[[Path], None]:
    """An ``after`` check: none of ``names`` (relative to {tmp}) exists, and no report
    was written anywhere under {tmp}."""

    def check(tmp: Path) -> None:
        for name in names:
            path = tmp / name
            assert not (path.exists() or path.is_symlink()), f"{name} was created"
        assert not list(tmp.rglob("*.html")), list(tmp.rglob("*.html"))

    return check


_REPORT = ("snakemake-context", "report", "--catalog", "{tmp}/c.db")
_LACKS = "lacks the table jobs"
CATALOG_CASES: list[Refusal] = [
    Refusal("report-since-nan", (*_REPORT, "--since", "nan"), "--since 'nan'", _catalog),
    Refusal("report-since-inf", (*_REPORT, "--since", "inf"), "--since 'inf'", _catalog),
    Refusal("report-since-1e300", (*_REPORT, "--since", "1e300"), "in the future", _catalog),
    Refusal("report-o-dir", (*_REPORT, "-o", "{tmp}"), "is a directory", _catalog, _nothing_at()),
    Refusal(
        "report-o-missing-dir",
        (*_REPORT, "-o", "{tmp}/missing/r.html"),
        "missing does not exist",
        _catalog,
        _nothing_at("missing"),
    ),
    Refusal(
        "report-o-under-a-file",
        (*_REPORT, "-o", "{tmp}/file/r.html"),
        "is not a directory",
        _catalog_and_a_file,
        _nothing_at("file/r.html"),
    ),
    Refusal(
        "report-csv-missing-dir",
        (*_REPORT, "--csv", "{tmp}/missing/l.csv"),
        "does not exist",
        _catalog,
        _nothing_at("missing", ".snakemake"),
    ),
    Refusal(
        "report-json-missing-dir",
        (*_REPORT, "-o", "{tmp}/r.html", "--json", "{tmp}/missing/l.json"),
        "does not exist",
        _catalog,
        _nothing_at("missing"),
    ),
    # Not writable even for root: sysfs takes no new files.
    Refusal("report-csv-unwritable", (*_REPORT, "--csv", "/sys/l.csv"), "no new file", _catalog),
    Refusal(
        "status-no-table",
        ("snakemake-context", "status", "--catalog", "{tmp}/c.db"),
        _LACKS,
        _catalog_without_jobs,
    ),
    Refusal(
        "story-no-table",
        ("snakemake-context", "story", "score", "--catalog", "{tmp}/c.db"),
        _LACKS,
        _catalog_without_jobs,
    ),
    Refusal(
        "report-no-table",
        (*_REPORT, "-o", "{tmp}/r.html"),
        _LACKS,
        _catalog_without_jobs,
        _nothing_at(),
    ),
    Refusal(
        "simulate-catalog-no-table",
        (
            "snakemake-context",
            "simulate",
            "--spec",
            "{tmp}/w.yaml",
            "--gpus",
            "a10:1",
            "--catalog",
            "{tmp}/c.db",
        ),
        _LACKS,
        _catalog_without_jobs,
    ),
    Refusal(
        "upgrade-mistyped-path",
        ("snakemake-context", "upgrade", "--catalog", "{tmp}/typo.db"),
        "No catalog at",
        after=_nothing_at("typo.db"),
    ),
    Refusal(
        "upgrade-mistyped-sqlite-url",
        ("snakemake-context", "upgrade", "--catalog", "sqlite:///{tmp}/typo.db"),
        "nothing to upgrade",
        after=_nothing_at("typo.db"),
    ),
]

# ---- the simulator (snakemake-context simulate ...) ----
SIMULATE_CASES: list[Refusal] = []

# ---- the executor's settings (snakemake --executor context --context-...) ----
SETTINGS_CASES: list[Refusal] = []

CASES = CATALOG_CASES + SIMULATE_CASES + SETTINGS_CASES


def _command(argv: tuple[str, ...], tmp: Path) -> list[str]:
    program, *rest = (part.replace("{tmp}", str(tmp)) for part in argv)
    return [str(BIN / program), *rest]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_a_bad_value_is_refused_in_one_line(case: Refusal, tmp_path: Path) -> None:
    if case.prepare is not None:
        case.prepare(tmp_path)
    try:
        run = subprocess.run(
            _command(case.argv, tmp_path),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=case.timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as hung:
        raise AssertionError(f"{case.id}: still running after {case.timeout} s") from hung
    output = run.stdout + run.stderr
    assert run.returncode != 0, f"{case.id}: accepted (exit 0):\n{output}"
    assert "Traceback (most recent call last)" not in output, output
    lines = [line for line in output.splitlines() if case.says in line]
    assert lines, f"{case.id}: no line says {case.says!r}:\n{output}"
    if case.after is not None:
        case.after(tmp_path)


def test_every_group_has_cases() -> None:
    assert CATALOG_CASES and SIMULATE_CASES and SETTINGS_CASES
