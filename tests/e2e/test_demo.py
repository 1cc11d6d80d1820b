"""The README's main job: the demo workflow with the real SmolLM2 on the embedded cluster."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import REPO, snakemake

pytestmark = [pytest.mark.slow, pytest.mark.model]


def test_demo_scores_claims_with_the_real_model(tmp_path):
    workdir = tmp_path / "demo"
    shutil.copytree(
        REPO / "workflows/demo", workdir, ignore=shutil.ignore_patterns("results", ".snakemake")
    )
    shutil.copytree(REPO / "workflows/llm", tmp_path / "llm")
    cache = tmp_path / "model-cache"  # cold: the GGUF is converted once, here
    run = snakemake(
        workdir,
        "-s",
        "Snakefile",
        "-d",
        ".",
        "--context-servers",
        "2",
        env={"SNAKEMAKE_CONTEXT_MODEL_CACHE": str(cache)},
        timeout=600,
    ).check()

    report = (workdir / "results/report.md").read_text()
    assert "16 claims" in report and report.count("| SUPPORTS |") == 8
    scores = [
        float(line.split("\t")[2])
        for path in sorted((workdir / "results/scores").glob("*.tsv"))
        for line in path.read_text().splitlines()[1:]
    ]
    assert len(scores) == 16 and len(set(scores)) > 8  # real, varied model scores
    (summary,) = run.summaries()
    servers = list(summary["servers"].values())
    assert sum(s["loads"] for s in servers) <= 2
    assert sum(s["conversions"] for s in servers) == 1  # converted once, under the lock
    assert len([p for p in cache.iterdir() if not p.name.startswith(".")]) == 1
    assert sum(job["items"] for job in summary["jobs"]) == 16
    json.dumps(summary)
