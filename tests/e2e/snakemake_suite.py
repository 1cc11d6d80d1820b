"""Snakemake's own test workflows, run under ``--executor context``.

The workflows and their ``expected-results/`` come from the source distribution of the
installed Snakemake (``pip download --no-binary :all: --no-deps snakemake==<version>``),
cached; each case is compared with its expected results as Snakemake's
``tests/common.py`` does (every expected file exists, with the same MD5 unless the case
says otherwise). The ``run()`` arguments of each case in Snakemake's ``tests/tests.py``
become command-line flags; ``cluster="./qsub"`` becomes this executor.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

#: Set to 1 (CI) to fail instead of skipping when the source distribution cannot be had.
REQUIRE_ENV = "SNAKEMAKE_CONTEXT_REQUIRE_SNAKEMAKE_TESTS"
#: Where the source distribution and its extracted tests are cached.
CACHE_ENV = "SNAKEMAKE_CONTEXT_TESTS_CACHE"

#: What an in-process case adds to its Snakefile: a declared context, used by the
#: script rule so that the script runs inside a context server.
CONTEXT_HEADER = """
from snakemake_executor_context import declare_context

declare_context(config, "toy", "context_loader.py:load")
"""
CONTEXT_LOADER = "def load():\n    return {}\n"
#: The script a shell rule becomes in a case whose shell rules run in-process: the
#: rule's own command, formatted with the job's values as ``shell:`` formats it.
CONTEXT_SHELL = """from snakemake.shell import shell

job = snakemake
shell(
    job.params.cmd,
    input=job.input,
    output=job.output,
    log=job.log,
    wildcards=job.wildcards,
    threads=job.threads,
    resources=job.resources,
)
"""


@dataclass(frozen=True)
class Case:
    """One of Snakemake's test cases, as command-line flags."""

    name: str
    directory: str
    args: tuple[str, ...] = ()
    shouldfail: bool = False
    check_md5: bool = True
    #: Script rules given a context (run in-process on a server).
    context_rules: tuple[str, ...] = ()
    #: Every shell rule made a context rule whose script runs its command (in-process
    #: on a server, a group's members with it).
    context_shell: bool = False
    #: Output that a failing case must show (its own reason to fail).
    failure_text: str = ""
    #: A directory, relative to the workdir, that must be non-empty afterwards.
    nonempty: str = ""
    #: A directory, relative to the workdir, that must be empty (or absent) afterwards.
    empty: str = ""


CASES = [
    Case("test01", "test01"),
    Case("test02", "test02"),
    Case("test05", "test05"),
    Case("test_group_jobs", "test_group_jobs"),
    Case(
        "test_multicomp_group_jobs",
        "test_multicomp_group_jobs",
        ("--groups", "a=group0", "b=group0", "--group-components", "group0=2"),
    ),
    Case(
        "test_group_job_fail",
        "test_group_job_fail",
        shouldfail=True,
        failure_text="touch b/",
    ),
    Case("test_group_temp", "test_group_temp"),
    # The group cases again with every shell rule a context rule: each group runs as
    # one dispatch on a server, its members in-process.
    Case("test_group_jobs[in-process]", "test_group_jobs", context_shell=True),
    Case(
        "test_multicomp_group_jobs[in-process]",
        "test_multicomp_group_jobs",
        ("--groups", "a=group0", "b=group0", "--group-components", "group0=2"),
        context_shell=True,
    ),
    Case(
        "test_group_job_fail[in-process]",
        "test_group_job_fail",
        shouldfail=True,
        failure_text="touch b/",
        context_shell=True,
    ),
    Case("test_group_temp[in-process]", "test_group_temp", context_shell=True),
    Case(
        "test_group_jobs_attempts[in-process]",
        "test_group_jobs_attempts",
        ("--retries", "2"),
        context_shell=True,
    ),
    Case(
        "test_groupid_expand_cluster[in-process]",
        "test_groupid_expand_cluster",
        context_shell=True,
    ),
    Case("test_group_jobs_attempts", "test_group_jobs_attempts", ("--retries", "2")),
    Case("test_groupid_expand_cluster", "test_groupid_expand_cluster"),
    # Its rule a_1 asks for mem_mb=40000, more than a server of the embedded cluster
    # has on a 24 GB machine (two servers of about 12 GB): refused at start, naming
    # the rule, not a crash.
    Case(
        "test_cores_limited_by_global_supply",
        "test_group_jobs_resources",
        ("--cores", "1"),
        shouldfail=True,
        failure_text="which no server of the embedded cluster offers",
    ),
    Case("test_issue850", "test_issue850"),
    Case("test_issue916", "test_issue916"),
    Case(
        "test_issue916[in-process]",
        "test_issue916",
        context_rules=("testIssue916",),
        empty=".snakemake/scripts",  # the script's copy is cleaned up
    ),
    Case(
        "test_github_issue_14",
        "test_github_issue_14",
        ("--skip-script-cleanup",),
        nonempty=".snakemake/scripts",
    ),
    Case(
        "test_github_issue_14[in-process]",
        "test_github_issue_14",
        ("--skip-script-cleanup",),
        context_rules=("test_github_issue_14",),
        nonempty=".snakemake/scripts",
    ),
    Case("test_script_python", "test_script_py"),
    Case("test_checkpoints", "test_checkpoints"),
    Case("test_checkpoints_many", "test_checkpoints_many"),
    Case("test_temp", "test_temp", ("test.realigned.bam",)),
    Case("test_temp_expand", "test_temp_expand"),
    Case("test_nonstr_params", "test_nonstr_params", ("--benchmark-extended",)),
    Case("test_retries", "test_retries"),
    Case(
        "test_default_resources",
        "test_default_resources",
        (
            "--default-resources",
            "mem_mb=max(2*input.size, 1000.1)",
            "disk_mb=max(2*input.size, 1000.2)",
        ),
    ),
    Case("test_pipes_simple", "test_pipes", ("--printshellcmds",)),
    Case("test_pipes_multiple", "test_pipes_multiple", ("--cores", "5")),
    Case("test_pipes_fail", "test_pipes_fail", shouldfail=True, failure_text="ddo"),
    Case("test_log_input", "test_log_input"),
    Case("test_params", "test_params"),
    Case("test_same_wildcard", "test_same_wildcard"),
    Case("test_localrule", "test_localrule", ("1.txt", "2.txt")),
    Case("test_run_namedlist", "test_run_namedlist"),
    Case("test_format_params", "test_format_params"),
    Case("test_threads", "test_threads", ("--cores", "20")),
    Case("test_shadow", "test_shadow"),
    Case("test_update_flag", "test_update_flag"),
]

#: Cases of the selection's kind that cannot apply, and why.
NOT_APPLICABLE = {
    "test_resources_can_be_overwritten_as_global": "it counts the submissions that the "
    "generic cluster executor's ./qsub script logs; this executor submits none there",
    "test_benchmark, test_benchmark_jsonl": "they need the stress-ng package",
}


def fetch_tests(cache: Path) -> Path:
    """The ``tests/`` directory of the installed Snakemake's source distribution,
    downloaded and extracted into ``cache`` once. Raises RuntimeError with the reason
    when it cannot be had."""
    wanted = version("snakemake")
    target = cache / f"snakemake-{wanted}-tests"
    if (target / "tests" / "common.py").exists():
        return target / "tests"
    cache.mkdir(parents=True, exist_ok=True)
    # Each test process calls this: the first downloads and extracts, the others wait.
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "tests" / "common.py").exists():
            return target / "tests"
        return _download_tests(cache, wanted, target)


def _download_tests(cache: Path, wanted: str, target: Path) -> Path:
    """Download Snakemake ``wanted``'s sdist into ``cache``; extract its tests/ to ``target``."""
    archive = cache / f"snakemake-{wanted}.tar.gz"
    if not archive.exists():
        download = subprocess.run(
            [
                *(sys.executable, "-m", "pip", "download", "--no-binary", ":all:"),
                *("--no-deps", "--no-build-isolation", f"snakemake=={wanted}"),
                *("-d", str(cache)),
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if download.returncode != 0 or not archive.exists():
            tail = (download.stderr or download.stdout).strip().splitlines()[-1:]
            raise RuntimeError(f"cannot download snakemake=={wanted}'s sdist: {tail}")
    partial = cache / f"snakemake-{wanted}-tests.partial"
    shutil.rmtree(partial, ignore_errors=True)
    prefix = f"snakemake-{wanted}/tests/"
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        for member in members:
            member.name = member.name[len(f"snakemake-{wanted}/") :]
        tar.extractall(partial, members=members, filter="tar")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target / "tests"


def prepare(case: Case, tests: Path, workdir: Path) -> Path:
    """Copy the case's workflow to ``workdir`` (with a context on its script rules
    for an in-process case)."""
    shutil.copytree(tests / case.directory, workdir, symlinks=True)
    if case.context_rules:
        snakefile = workdir / "Snakefile"
        text = snakefile.read_text()
        for rule in case.context_rules:
            text, found = re.subn(
                rf"^rule {re.escape(rule)}:\n",
                f'rule {rule}:\n    resources: context="toy"\n',
                text,
                flags=re.MULTILINE,
            )
            assert found == 1, f"rule {rule} not found in {case.directory}"
        snakefile.write_text(CONTEXT_HEADER + text)
        (workdir / "context_loader.py").write_text(CONTEXT_LOADER)
    if case.context_shell:
        snakefile = workdir / "Snakefile"
        rules = re.split(r"(?m)^(?=rule )", snakefile.read_text())
        converted = [_shell_made_context(rule) for rule in rules]
        assert converted != rules, f"no shell rule in {case.directory}"
        snakefile.write_text(CONTEXT_HEADER + "".join(converted))
        (workdir / "context_loader.py").write_text(CONTEXT_LOADER)
        (workdir / "context_shell.py").write_text(CONTEXT_SHELL)
    return workdir


def _shell_made_context(rule: str) -> str:
    """A rule's ``shell:`` made a context rule's script that runs the same command
    (the command's literal is everything up to the rule's next directive)."""
    lines = rule.split("\n")
    at = next((i for i, line in enumerate(lines) if line.startswith("    shell:")), None)
    if at is None:
        return rule
    end = next(
        (i for i in range(at + 1, len(lines)) if re.match(r"(\S|    \w+:)", lines[i])),
        len(lines),
    )
    literal = "\n".join([lines[at][len("    shell:") :], *lines[at + 1 : end]]).strip()
    command = f"    params: cmd=lambda wildcards: {literal}"
    text = "\n".join([*lines[:at], command, '    script: "context_shell.py"', "", *lines[end:]])
    with_context, given = re.subn(r"(?m)^    resources:\s*", '    resources: context="toy", ', text)
    if given:
        return with_context
    return text.replace("    script:", '    resources: context="toy"\n    script:', 1)


def differences(case: Case, tests: Path, workdir: Path) -> list[str]:
    """What differs from ``expected-results/`` (as Snakemake's tests/common.py checks)."""
    expected = tests / case.directory / "expected-results"
    problems = []
    for path in sorted(p for p in expected.rglob("*") if p.is_file()):
        relative = path.relative_to(expected)
        if relative.name in (".gitignore", ".gitkeep") or relative.name.endswith("_WIN"):
            continue
        produced = workdir / relative
        if not produced.exists():
            problems.append(f"{relative}: not produced")
        elif case.check_md5 and _md5(produced) != _md5(path):
            problems.append(f"{relative}: content differs")
    if case.nonempty and not any((workdir / case.nonempty).glob("*")):
        problems.append(f"{case.nonempty}: empty")
    if case.empty and any((workdir / case.empty).glob("*")):
        problems.append(f"{case.empty}: not empty")
    return problems


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes(), usedforsecurity=False).hexdigest()


def require() -> bool:
    """Whether a missing source distribution fails the test instead of skipping it."""
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")
