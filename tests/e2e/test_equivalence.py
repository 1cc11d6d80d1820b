"""A context job's script sees what Snakemake's own script preamble gives it.

The same Snakefile runs under ``--executor local`` (Snakemake's per-job script
subprocess) and ``--executor context`` (in-process on a server); the script dumps
everything it can see, and the dumps must be equal but for a documented allow-list.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.conftest import context_run, snakemake

pytestmark = pytest.mark.slow

#: What may differ, and why.
ALLOWED = {
    # tmpdir is evaluated where the job runs: the main process under --executor local,
    # the server under --executor context (both real directories, checked below).
    ("resources", "tmpdir"),
    ("env", "TMPDIR"),
    ("env", "TMP"),
    ("env", "TEMP"),
    ("env", "TEMPDIR"),
}


def _prepare(workdir: Path) -> None:
    """A stale output from an earlier attempt, older than the job's input."""
    stale = workdir / "results/a/nested/deep/dump.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("stale")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    (workdir / "data/a.txt").touch()  # copies keep the repository's mtime


def _run(workflow, executor: str) -> dict:
    workdir = workflow("equivalence", dest=executor)
    _prepare(workdir)
    args = ["--config", "scale=5", "fixed=from-cli"]
    env = {"EQUIV_TOKEN": "secret-42"}
    if executor == "local":
        snakemake(workdir, "--executor", "local", "--cores", "2", *args, env=env).check()
    else:
        context_run(workdir, *args, env=env).check()
    dump = json.loads((workdir / "results/a/nested/deep/dump.json").read_text())
    benchmark = (workdir / "benchmarks/dump/a.tsv").read_text().splitlines()
    dump["benchmark_header"] = benchmark[0]
    dump["benchmark_rows"] = len(benchmark) - 1
    dump["log"]["content"] = (workdir / "logs/dump/a.log").read_text()
    return _relative(dump, workdir)


def _relative(value, workdir: Path):
    if isinstance(value, str):
        return value.replace(str(workdir.resolve()), "<WORKDIR>").replace(str(workdir), "<WORKDIR>")
    if isinstance(value, dict):
        return {k: _relative(v, workdir) for k, v in value.items()}
    if isinstance(value, list):
        return [_relative(v, workdir) for v in value]
    return value


def test_script_sees_the_same_job_under_both_executors(workflow):
    local = _run(workflow, "local")
    context = _run(workflow, "context")

    differences = []
    for section in sorted(set(local) | set(context)):
        a, b = local.get(section), context.get(section)
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                if a.get(key) != b.get(key) and (section, key) not in ALLOWED:
                    differences.append(
                        f"{section}.{key}: local={a.get(key)!r} context={b.get(key)!r}"
                    )
        elif a != b:
            differences.append(f"{section}: local={a!r} context={b!r}")
    assert not differences, "\n".join(differences)

    # What the allow-list lets differ is still right on each side.
    for dump in (local, context):
        assert dump["tmpdir_is_dir"]
        assert dump["env"]["TMPDIR"] == dump["resources"]["tmpdir"]
    # And the values are the ones asked for (not equal-but-wrong on both sides).
    assert context["params"] == {"label": "label-a", "fixed": "from-cli"}
    assert context["context"] == {"scale": 5}
    assert context["threads"] == 2
    assert context["env"]["OMP_NUM_THREADS"] == "2"
    assert context["env"]["EQUIV_TOKEN"] == "secret-42"
    assert context["stale_output_present"] is False
    assert context["output_dir_present"] and context["log_dir_present"]
    assert context["cwd"] == "<WORKDIR>"
    assert context["file"] == "<WORKDIR>/scripts/dump.py"
    assert context["benchmark_rows"] == 1
    assert context["benchmark_header"].split("\t")[:3] == ["s", "h:m:s", "max_rss"]
    assert dict(context["thread_pools"]).get("openblas", 2) == 2


def _run_four(workflow, executor: str) -> dict[str, dict]:
    workdir = workflow("equivalence", dest=f"{executor}-four")
    for sample in "abcd":
        (workdir / f"data/{sample}.txt").touch()
    args = ["--config", "scale=5", "fixed=from-cli", "samples=abcd", "barrier=4"]
    env = {"EQUIV_TOKEN": "secret-42"}
    if executor == "local":
        snakemake(workdir, "--executor", "local", "--cores", "8", *args, env=env).check()
    else:
        context_run(
            workdir, "--context-servers", "1", "--context-slots", "4", *args, env=env
        ).check()
    dumps = {}
    for sample in "abcd":
        dump = json.loads((workdir / f"results/{sample}/nested/deep/dump.json").read_text())
        dumps[sample] = _relative(dump, workdir)
    return dumps


def test_four_concurrent_jobs_on_one_server_each_see_what_local_jobs_see(workflow):
    """Slots: four jobs in one server process at once (a barrier holds each until all
    four have started) see cwd, environment, sys.path, __main__, thread pools and
    their own snakemake object exactly as four concurrent local jobs do."""
    local = _run_four(workflow, "local")
    context = _run_four(workflow, "context")
    differences = []
    for sample in "abcd":
        a, b = local[sample], context[sample]
        assert a["barrier_reached"] and b["barrier_reached"], (sample, a, b)
        for section in sorted(set(a) | set(b)):
            x, y = a.get(section), b.get(section)
            if isinstance(x, dict) and isinstance(y, dict):
                differences += [
                    f"{sample}: {section}.{key}: local={x.get(key)!r} context={y.get(key)!r}"
                    for key in sorted(set(x) | set(y))
                    if x.get(key) != y.get(key) and (section, key) not in ALLOWED
                ]
            elif x != y:
                differences.append(f"{sample}: {section}: local={x!r} context={y!r}")
    assert not differences, "\n".join(differences)
    # Each job saw its own job, not another's (equal-but-wrong on both sides fails).
    for sample in "abcd":
        assert context[sample]["wildcards"] == {"sample": sample}
        assert context[sample]["main_snakemake_output"].endswith(f"{sample}/nested/deep/dump.json")
        assert context[sample]["main_is_this_module"] is True
        assert context[sample]["env"]["OMP_NUM_THREADS"] == "2"
