"""A server's zygote: which job commands it takes, and a real Snakemake run from it."""

from __future__ import annotations

import os
import sys
from importlib.metadata import version

import pytest

from snakemake_executor_context.server.zygote import Zygote, parse_command

PY = sys.executable


def test_it_takes_snakemake_job_commands_with_exported_variables():
    command = (
        f"export A='1' B='x y' && {PY} -m snakemake "
        "--snakefile /w/Snakefile --target-jobs 'echo:i=3'"
    )
    assert parse_command(command) == (
        {"A": "1", "B": "x y"},
        ["--snakefile", "/w/Snakefile", "--target-jobs", "echo:i=3"],
    )
    assert parse_command(f"{PY} -m snakemake --cores all") == ({}, ["--cores", "all"])


@pytest.mark.parametrize(
    "command",
    [
        f"module load x && {PY} -m snakemake --cores all",  # a --precommand
        "/other/python -m snakemake --cores all",  # another Python
        f"{PY} -m snakemake --cores all && touch done",  # a suffix
        f"{PY} -c 'print(1)'",
        "export A && true",
        "'unbalanced",
    ],
)
def test_other_commands_run_as_a_fresh_process(command):
    assert parse_command(command) is None


@pytest.mark.slow
def test_a_forked_job_runs_snakemake_in_its_directory_with_its_environment(tmp_path):
    (tmp_path / "Snakefile").write_text(
        'rule all:\n    output: "out.txt"\n    shell: "echo $GREETING > {output}"\n'
    )
    zygote = Zygote()
    env = {**os.environ, "GREETING": "hello"}
    assert zygote.usable(env)
    log = tmp_path / "job.log"
    job = zygote.start(["--cores", "1", "--quiet", "all"], str(tmp_path), env, str(log))
    assert job.pid > 0 and job.wait() == 0, log.read_text()
    assert (tmp_path / "out.txt").read_text() == "hello\n"

    failing = zygote.start(["--cores", "1", "nothing.txt"], str(tmp_path), env, str(log))
    assert failing.wait() == 1
    assert "MissingRuleException" in log.read_text() or "nothing.txt" in log.read_text()
    assert not zygote.usable({**env, "PYTHONPATH": "/elsewhere"})

    versions = zygote.start(["--version"], str(tmp_path), env, str(log))
    assert versions.wait() == 0 and version("snakemake") in log.read_text()
