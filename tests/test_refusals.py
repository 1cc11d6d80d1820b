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
CATALOG_CASES: list[Refusal] = []

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
