"""Bad values on the command line: one line that says what is wrong, a non-zero exit,
no traceback, no hang, and nothing created where it should not be.

Each case is a real command (``snakemake-context ...``) run in a fresh directory of its
own. The executor's settings are refused in-process, as Snakemake builds them
(``tests/settings/test_bad_settings.py``), two of them through its command line.
``{tmp}`` in an argument is the case's directory; ``prepare`` makes what the command
needs there first (a catalog, a Snakefile); ``after`` checks afterwards that nothing was
created or changed.
The cases are grouped by the part of the plugin that refuses them.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import BIN


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
_SPEC = "contexts: {m: {}}\nstages:\n  - {rule: infer, context: m, count: 4}\n"


def _spec(tmp: Path, text: str = _SPEC) -> None:
    (tmp / "w.yaml").write_text(text)


def _trace(tmp: Path) -> None:
    _spec(tmp)
    (tmp / "trace.jsonl").write_text('{"at": 5, "server": "a10-0"}\n{"at": "soon"}\n')


def _simulate(case: str, *args: str, says: str, prepare=_spec, timeout: float = 60) -> Refusal:
    """``simulate`` of a 4-job spec on 2 GPUs, its times given, with ``args`` added."""
    base = ("--spec", "w.yaml", "--gpus", "a10:2", "--item-seconds", "infer=1")
    argv = ("snakemake-context", "simulate", *base, "--load-seconds", "m:source=3", *args)
    return Refusal(f"simulate-{case}", argv, says, prepare=prepare, timeout=timeout)


SIMULATE_CASES: list[Refusal] = [
    _simulate("slots-0", "--slots", "0", says="--slots 0 is not allowed"),
    _simulate("slots-malformed", "--slots", "1e3", says="--slots '1e3' is not allowed"),
    _simulate("jobs-negative", "--jobs", "-3", says="--jobs -3 is not allowed"),
    _simulate("seed-negative", "--seed", "-1", says="--seed -1 is not allowed"),
    _simulate("job-cv-huge", "--job-cv", "1e300", says="--job-cv 1e+300 is not allowed"),
    _simulate("walltime-negative", "--pilots", "--walltime", "-5", says="--walltime -5.0 is not"),
    _simulate("walltime-no-pilots", "--walltime", "7200", says="not allowed without --pilots"),
    _simulate("queue-wait-nan", "--pilots", "--queue-wait", "nan", says="--queue-wait nan is not"),
    _simulate(
        "min-over-max-pilots",
        "--pilots",
        "--min-pilots",
        "5",
        "--max-pilots",
        "1",
        says="--min-pilots 5 is not allowed above --max-pilots 1",
    ),
    _simulate(
        "min-pilots-over-fleet",
        "--pilots",
        "--min-pilots",
        "5",
        says="--min-pilots 5 is not allowed above the fleet's 2 GPUs",
    ),
    _simulate(
        "loads-per-source-negative",
        "--pilots",
        "--loads-per-source",
        "-1",
        says="--loads-per-source -1 is not allowed",
    ),
    _simulate("bandwidth-tiny", "--shared-bandwidth", "1e-9", says="--shared-bandwidth 1e-09"),
    _simulate("bandwidth-inf", "--shared-bandwidth", "inf", says="--shared-bandwidth inf is not"),
    _simulate("budget-negative", "--budget", "-5", says="--budget '-5' is not allowed"),
    _simulate("counts-0", "--counts", "0", says="--counts '0' is not allowed"),
    _simulate("counts-huge", "--counts", "1e12", says="--counts '1e12' is not allowed"),
    _simulate("gpus-huge", "--gpus", "a10:100000", says="--gpus 'a10:100000' is not allowed"),
    _simulate("gpus-over-all", "--gpus", "a:3000,b:3000", says="6000 GPUs, at most 4096"),
    # 1e9/min spun until killed: every preemption is an event of the simulation.
    _simulate(
        "preempt-rate-huge",
        "--preempt",
        "1e9/min",
        timeout=20,
        says="--preempt '1e9/min' is not allowed: at most 60/min per partition",
    ),
    _simulate("preempt-signal-alone", "--preempt-signal", "TERM", says="without --preempt"),
    _simulate(
        "preempt-trace-not-a-trace",
        "--preempt-trace",
        "/etc/passwd",
        says="--preempt-trace '/etc/passwd' line 1: ",
    ),
    _simulate(
        "preempt-trace-bad-line",
        "--preempt-trace",
        "trace.jsonl",
        prepare=_trace,
        says="--preempt-trace 'trace.jsonl' line 2: ",
    ),
    _simulate("item-seconds-inf", "--item-seconds", "infer=inf", says="'infer=inf' is not"),
    _simulate("items-inf", "--items", "infer=inf", says="--items 'infer=inf' is not allowed"),
    _simulate("slowdown-inf", "--slowdown", "a10=inf", says="--slowdown 'a10=inf' is not"),
    _simulate("slot-gain-0", "--slot-gain", "2=0", says="--slot-gain '2=0' is not allowed"),
    _simulate("local-seconds-nan", "--local-seconds", "x=nan", says="'x=nan' is not allowed"),
    _simulate("context-bytes-huge", "--context-bytes", "m=1e30", says="'m=1e30' is not allowed"),
    # A job longer than the simulated span: refused, not printed as a prediction.
    _simulate(
        "never-ends",
        "--items",
        "infer=1000000",
        "--item-seconds",
        "infer=1000",
        "--counts",
        "none",
        says="the run cannot end within the simulator's 30 simulated days",
    ),
    _simulate("catalog-empty", "--catalog", "", says="--catalog '' is not allowed"),
    _simulate("run-without-catalog", "--run", "x", says="--run 'x' is not allowed without"),
    _simulate("spec-and-snakefile", "-s", "Snakefile", says="--spec 'w.yaml' is not allowed with"),
    Refusal(
        "simulate-directory-missing",
        ("snakemake-context", "simulate", "-d", "{tmp}/missing", "--gpus", "a10:1"),
        "/missing' is not allowed: no such directory",
    ),
    _simulate(
        "spec-malformed",
        prepare=lambda tmp: _spec(tmp, "contexts: [1, 2]\nstages: [{count: 1}]\n"),
        says="Workload spec w.yaml: contexts is [1, 2], not a mapping",
    ),
    _simulate(
        "spec-count-huge",
        prepare=lambda tmp: _spec(tmp, "stages: [{rule: infer, count: 1e12}]\n"),
        says="stage 'infer': count '1e12' is not allowed",
    ),
]

CASES = CATALOG_CASES + SIMULATE_CASES


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
    assert CATALOG_CASES and SIMULATE_CASES
