"""The fact-verification workflow: generator, calibration, metrics, and the real model."""

from __future__ import annotations

import itertools
import json
import random
import shutil
import sqlite3
import sys

import pytest

from tests.conftest import REPO, context_run, snakemake

FACTCHECK = REPO / "workflows/factcheck"
sys.path[:0] = [str(FACTCHECK / "scripts"), str(REPO / "workflows/llm")]

import claimgen  # noqa: E402
import factcheck  # noqa: E402

TEMPLATES = sorted((FACTCHECK / "templates").glob("*.yaml"))


# ----------------------------------------------------------------------------------
# Pure parts.


def _rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        target = factcheck.SUPPORTS if i % 2 else factcheck.REFUTES
        score = rng.gauss(0.3 if target == factcheck.SUPPORTS else -0.1, 1.0)
        rows.append(
            {
                "id": i,
                "label": target,
                "target": target,
                "score": score,
                "split": "calibration" if i < n // 4 else "evaluation",
            }
        )
    return rows


def test_swapped_answer_words_give_exactly_one_minus_accuracy():
    rows = _rows(200)
    for shift in (0.0, 0.37):
        accuracy = factcheck.evaluate(rows, shift=shift).accuracy
        swapped = factcheck.evaluate(factcheck.swap_mapping(rows), shift=-shift).accuracy
        assert swapped == pytest.approx(1 - accuracy, abs=0)
        assert accuracy != 0.5  # the check would be vacuous at exactly chance


def test_wilson_interval_known_values():
    low, high = factcheck.wilson_interval(5, 10)
    assert (round(low, 4), round(high, 4)) == (0.2366, 0.7634)
    low, high = factcheck.wilson_interval(0, 10)
    assert low == 0.0 and round(high, 4) == 0.2775
    assert factcheck.wilson_interval(0, 0) == (0.0, 1.0)


def test_threshold_is_fitted_on_calibration_claims_only():
    rows = _rows(200)
    result = factcheck.template_accuracy("t", rows, content_free=0.2)
    moved = [{**r, "score": r["score"] + 5} if r["split"] == "evaluation" else r for r in rows]
    again = factcheck.template_accuracy("t", moved, content_free=0.2)
    assert again["calibrated"]["threshold"] == result["calibrated"]["threshold"]
    assert result["n_calibration"] == 50 and result["n_evaluation"] == 150
    calibration = [r for r in rows if r["split"] == "calibration"]
    fitted = factcheck.fit_threshold(calibration)
    assert (
        factcheck.evaluate(calibration, fitted).correct
        >= factcheck.evaluate(calibration, 0.0).correct
    )


def test_rank_reports_overlap_with_runner_up():
    def acc(name, correct, total=100):
        low, high = factcheck.wilson_interval(correct, total)
        outcome = {"accuracy": correct / total, "wilson95": [low, high]}
        return {"template": name, "calibrated": outcome}

    close = factcheck.rank([acc("a", 60), acc("b", 58), acc("c", 40)])
    assert close["best"] == "a" and close["runner_up"] == "b" and close["overlaps_runner_up"]
    apart = factcheck.rank([acc("a", 90), acc("b", 50)])
    assert apart["overlaps_runner_up"] is False


def test_select_claims_handles_fever_labels():
    records = [
        {"id": i, "claim": f"claim {i}", "label": label}
        for i, label in enumerate(["SUPPORTS", "REFUTES", "NOT ENOUGH INFO"] * 10)
    ]
    dropped = factcheck.select_claims(
        records, n_claims=20, nei="drop", seed=1, calibration_fraction=0.3
    )
    assert {r["label"] for r in dropped} == {"SUPPORTS", "REFUTES"}
    assert sum(r["target"] == "SUPPORTS" for r in dropped) == 10
    assert sum(r["split"] == "calibration" for r in dropped) == 6  # 3 per label
    kept = factcheck.select_claims(
        records, n_claims=30, nei="refutes", seed=1, calibration_fraction=0.25
    )
    assert {r["target"] for r in kept if r["label"] == "NOT ENOUGH INFO"} == {"REFUTES"}
    with pytest.raises(ValueError, match="20 usable claims, but n_claims is 21"):
        factcheck.select_claims(records, n_claims=21, nei="drop", seed=1, calibration_fraction=0.25)
    with pytest.raises(ValueError, match="label 'MAYBE' is not one of"):
        factcheck.select_claims(
            [{"id": 1, "claim": "x", "label": "MAYBE"}],
            n_claims=1,
            nei="drop",
            seed=1,
            calibration_fraction=0.25,
        )
    with pytest.raises(ValueError, match="lacks 'claim'"):
        factcheck.select_claims(
            [{"id": 1, "label": "SUPPORTS"}],
            n_claims=1,
            nei="drop",
            seed=1,
            calibration_fraction=0.25,
        )


def test_shards_cover_every_claim_once():
    records = [{"id": i} for i in range(70)]
    shards = factcheck.shard(records, 32)
    assert [len(s) for s in shards] == [32, 32, 6] and factcheck.n_shards(70, 32) == 3
    assert [r["id"] for s in shards for r in s] == list(range(70))


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.stem)
def test_templates_load(path):
    template = factcheck.load_template(path)
    assert template.name == path.stem and template.true_word != template.false_word


def test_bad_templates_name_the_template(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text('prompt: "Q: {question}"\ntrue_word: " Yes"\nfalse_word: " No"\n')
    with pytest.raises(ValueError, match=r"Template broken .*\{claim\}"):
        factcheck.load_template(bad)
    bad.write_text('prompt: "Q: {claim}"\ntrue_word: " Yes"\n')
    with pytest.raises(ValueError, match=r"Template broken .*missing false_word"):
        factcheck.load_template(bad)


def test_at_least_eight_templates():
    assert len(TEMPLATES) >= 8


# ----------------------------------------------------------------------------------
# The claim generator.


def test_generator_is_deterministic_balanced_and_unique(tmp_path):
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    factcheck.write_jsonl(first, claimgen.generate(2000, seed=11))
    factcheck.write_jsonl(second, claimgen.generate(2000, seed=11))
    assert first.read_bytes() == second.read_bytes()
    other = tmp_path / "c.jsonl"
    factcheck.write_jsonl(other, claimgen.generate(2000, seed=12))
    assert other.read_bytes() != first.read_bytes()

    records = factcheck.read_jsonl(first)
    assert len(records) == 2000
    assert sum(r["label"] == "SUPPORTS" for r in records) == 1000
    assert len({r["claim"] for r in records}) == 2000
    assert len({r["id"] for r in records}) == 2000
    assert len({r["fact"]["family"] for r in records}) == 5


def _truth(family: str, subject: str, value: str) -> bool:
    """An independent reading of the packages' data."""
    import periodictable
    import pycountry

    if family in ("element_symbol", "atomic_number"):
        element = next(e for e in periodictable.elements if e.name == subject.lower())
        return value == (element.symbol if family == "element_symbol" else str(element.number))
    countries = [
        c for c in pycountry.countries if subject in (c.name, getattr(c, "common_name", None))
    ]
    if family == "country_code":
        return any(c.alpha_3 == value for c in countries)
    if family == "official_name":
        return any(getattr(c, "official_name", None) == value for c in countries)
    assert family == "subdivision"
    holders = [c for c in pycountry.countries if value in (c.name, getattr(c, "common_name", None))]
    return any(
        s.name == subject and s.parent_code is None
        for c in holders
        for s in pycountry.subdivisions.get(country_code=c.alpha_2) or []
    )


def test_every_generated_claim_agrees_with_the_data():
    for record in claimgen.generate(2000, seed=7):
        fact = record["fact"]
        assert _truth(fact["family"], fact["subject"], fact["value"]) == (
            record["label"] == "SUPPORTS"
        ), record


# ----------------------------------------------------------------------------------
# The real model.


@pytest.fixture(scope="module")
def model():
    import smollm2

    return smollm2.load_model()


@pytest.mark.model
def test_every_template_has_answer_words_with_distinct_first_tokens(model):
    for path in TEMPLATES:
        template = factcheck.load_template(path)
        true_id, false_id = model.answer_ids(template.true_word, template.false_word, template.name)
        assert true_id != false_id
    with pytest.raises(ValueError, match="Template broken: answer words ' SUPPORTED'"):
        model.answer_ids(" SUPPORTED", " SUPPORTS", "broken")


@pytest.mark.model
def test_pipeline_scores_equal_unbatched_model_calls(model):
    """Batched, left-padded, last-position scoring equals one plain model() call per
    claim: catches padding and batching bugs, and shows the real model ran."""
    import torch

    template = factcheck.load_template(FACTCHECK / "templates/two_shot_yes_no.yaml")
    claims = [r["claim"] for r in claimgen.generate(8, seed=3)]
    prompts = [template.render(claim, model.tokenizer) for claim in claims]
    true_id, false_id = model.answer_ids(template.true_word, template.false_word)
    batched = model.score(prompts, true_id, false_id, batch_size=8)

    independent = []
    with torch.no_grad():
        for prompt in prompts:
            ids = model.tokenizer(prompt, return_tensors="pt").input_ids
            logits = model.model(ids).logits[0, -1].double()
            logprobs = torch.log_softmax(logits, dim=-1)
            independent.append(float(logprobs[true_id] - logprobs[false_id]))
    assert len({len(model.tokenizer(p).input_ids) for p in prompts}) > 1  # padding happened
    assert batched == pytest.approx(independent, abs=1e-4)
    assert len({round(s, 3) for s in batched}) > 4
    swapped = model.score(prompts, false_id, true_id, batch_size=8)
    assert swapped == pytest.approx([-s for s in batched], abs=1e-6)


@pytest.mark.model
def test_scores_through_the_batcher_from_concurrent_jobs_equal_unbatched_scores(model):
    """Four threads, as four concurrent jobs on one server's slots, each with its own
    template (own answer ids), hand their claims one at a time to the shared batcher:
    the forward passes merge items of different jobs and templates, and every job gets
    the scores it gets alone (config `batching: false`), within 1e-4."""
    import threading

    names = ["two_shot_yes_no", "claim_true_false", "chat_yes_no", "right_wrong"]
    templates = [factcheck.load_template(FACTCHECK / f"templates/{n}.yaml") for n in names]
    claims = [r["claim"] for r in claimgen.generate(16, seed=5)]
    jobs = []
    for index, template in enumerate(templates):
        ids = model.answer_ids(template.true_word, template.false_word, template.name)
        prompts = [template.render(c, model.tokenizer) for c in claims[index * 4 : index * 4 + 4]]
        jobs.append((prompts, *ids))
    assert len({(yes, no) for _, yes, no in jobs}) > 1  # different answer ids merge
    alone = [model.score(prompts, yes, no, batch_size=8) for prompts, yes, no in jobs]

    out: list[list[float] | BaseException] = [[] for _ in jobs]
    barrier = threading.Barrier(len(jobs))

    def job(index: int) -> None:
        prompts, yes, no = jobs[index]
        barrier.wait(10)
        try:
            for prompt in prompts:  # as verify.py hands its chunks
                out[index] += model.score_batched([(prompt, yes, no)], forward_batch=8)
        except BaseException as error:
            out[index] = error

    threads = [threading.Thread(target=job, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
        assert not thread.is_alive()
    for scores, expected in zip(out, alone, strict=True):
        assert scores == pytest.approx(expected, abs=1e-4)
    histogram = model.batchers[8].histogram()
    assert sum(size * n for size, n in histogram.items()) == 16
    assert max(histogram) >= 2, histogram  # requests of one item: a batch of 2 spans jobs


def _workflow_copy(tmp_path):
    target = tmp_path / "factcheck"
    shutil.copytree(FACTCHECK, target, ignore=shutil.ignore_patterns("results", ".snakemake"))
    shutil.copytree(REPO / "workflows/llm", tmp_path / "llm")
    return target


@pytest.mark.slow
@pytest.mark.model
def test_small_config_runs_the_whole_dag(tmp_path):
    workdir = _workflow_copy(tmp_path)
    # As the README runs it: the workflow profile chooses --executor context.
    run = snakemake(
        workdir,
        "-s",
        "Snakefile",
        "-d",
        ".",
        "--config",
        "n_claims=24",
        "claims_per_job=8",
        "templates=[qa_yes_no,claim_true_false]",
        timeout=600,
    ).check()
    assert "Using workflow specific profile" in run.output
    report = json.loads((workdir / "results/report.json").read_text())
    assert report["n_calibration"] + report["n_evaluation"] == 24
    assert {t["template"] for t in report["templates"]} == {"qa_yes_no", "claim_true_false"}
    for template in report["templates"]:
        for rule in ("raw", "contextual", "calibrated"):
            outcome = template[rule]
            assert outcome["total"] == report["n_evaluation"]
            low, high = outcome["wilson95"]
            assert 0 <= low <= outcome["accuracy"] <= high <= 1
            assert sum(sum(c.values()) for c in outcome["confusion"].values()) == outcome["total"]
    assert report["best"]["best"] in {"qa_yes_no", "claim_true_false"}
    assert "overlaps_runner_up" in report["best"]
    markdown = (workdir / "results/report.md").read_text()
    assert "**Best template:" in markdown and "| `qa_yes_no` |" in markdown
    assert "What this run shows" in markdown
    assert (workdir / "results/report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (summary,) = run.summaries()
    assert sum(job["items"] for job in summary["jobs"]) == 2 * 24
    assert sum(s["loads"] for s in summary["servers"].values()) <= 2
    # Scored through the batcher (config batching: true): 6 jobs of one pass of 8, and
    # each template's content-free input; each pass counted once, shown at the end.
    assert summary["forward_batches"]["all"] == {"1": 2, "8": 6}
    assert "forward batches: 1 x 2, 8 x 6 (mean 6.2 items per call)" in run.output


@pytest.mark.slow
@pytest.mark.model
def test_fever_sample_goes_through_the_whole_dag(tmp_path):
    workdir = _workflow_copy(tmp_path)
    sample = factcheck.read_jsonl(workdir / "data/fever_sample.jsonl")
    assert {r["label"] for r in sample} == set(factcheck.FEVER_LABELS)
    context_run(
        workdir,
        "-s",
        "Snakefile",
        "-d",
        ".",
        "--config",
        "claims_file=data/fever_sample.jsonl",
        f"n_claims={len(sample)}",
        "nei=refutes",
        "claims_per_job=6",
        "templates=[two_shot_yes_no,chat_yes_no]",
        timeout=600,
    ).check()
    report = json.loads((workdir / "results/report.json").read_text())
    assert report["claims"] == "data/fever_sample.jsonl"
    confusion = report["templates"][0]["calibrated"]["confusion"]
    assert set(confusion) == set(factcheck.FEVER_LABELS)  # NEI scored, as configured


@pytest.mark.parametrize("seed", range(5))
def test_fitted_threshold_is_optimal_on_calibration_claims(seed):
    rows = _rows(60, seed)
    for row in rows[::7]:
        row["score"] = round(row["score"], 1)  # ties
    scores = sorted({r["score"] for r in rows})
    candidates = [scores[0] - 1, scores[-1] + 1, 0.0]
    candidates += [(a + b) / 2 for a, b in itertools.pairwise(scores)]
    best = max(factcheck.evaluate(rows, t).correct for t in candidates)
    assert factcheck.evaluate(rows, factcheck.fit_threshold(rows)).correct == best


def _scores(workdir) -> dict[str, float]:
    scores = {}
    for path in (workdir / "results/scores").rglob("*.json"):
        for row in json.loads(path.read_text())["rows"]:
            scores[f"{path.parent.name}/{row['id']}"] = row["score"]
    return scores


@pytest.mark.slow
@pytest.mark.model
def test_scores_with_slots_and_batching_equal_scores_without(tmp_path):
    """End to end: one-claim jobs, four at once on one server scoring through the
    batcher (their claims merged into shared forward passes), give the scores of the
    same jobs run one at a time without the batcher, within 1e-4 (fp32, CPU)."""
    config = ["n_claims=32", "claims_per_job=1", "templates=[qa_yes_no,claim_true_false]"]
    runs = {}
    for name, extra in (
        ("batched", ["--context-slots", "4", "--config", *config, "batching=true"]),
        ("plain", ["--context-slots", "1", "--config", *config, "batching=false"]),
    ):
        (tmp_path / name).mkdir()
        workdir = _workflow_copy(tmp_path / name)
        runs[name] = snakemake(
            workdir, "-s", "Snakefile", "-d", ".", "--context-servers", "1", *extra, timeout=600
        ).check()
        runs[name].scores = _scores(workdir)  # type: ignore[attr-defined]
    batched, plain = runs["batched"].scores, runs["plain"].scores  # type: ignore[attr-defined]
    assert len(plain) == 64 and batched.keys() == plain.keys()
    worst = max(abs(batched[k] - plain[k]) for k in plain)
    assert worst <= 1e-4, worst
    (summary,) = runs["batched"].summaries()
    sizes = {int(size): count for size, count in summary["forward_batches"]["all"].items()}
    # Concurrent jobs' claims shared forward passes (one-claim jobs alone give only 1s).
    assert max(sizes) >= 2, sizes
    (unbatched,) = runs["plain"].summaries()
    assert not unbatched.get("forward_batches", {}).get("all")


@pytest.mark.slow
@pytest.mark.model
def test_verify_jobs_at_tensor_parallel_3_score_as_tensor_parallel_1(tmp_path):
    """The factcheck workflow with its model split over 3 processes (a gang on one
    server of 3 stand-in devices) gives the scores of the model loaded whole, within
    1e-4 (fp32, CPU), on 32 claims; one gang of 3 ranks served every job."""
    config = ["n_claims=32", "claims_per_job=8", "templates=[qa_yes_no]"]
    scores = {}
    for tp, extra in (
        (1, ["--context-servers", "1"]),
        (3, ["--context-servers", "1", "--context-gpus-per-server", "3", "--context-slots", "2"]),
    ):
        (tmp_path / f"tp{tp}").mkdir()
        workdir = _workflow_copy(tmp_path / f"tp{tp}")
        run = snakemake(
            workdir,
            "-s",
            "Snakefile",
            "-d",
            ".",
            *extra,
            "--config",
            *config,
            f"tensor_parallel={tp}",
            timeout=600,
        ).check()
        scores[tp] = _scores(workdir)
        (summary,) = run.summaries()
        assert sum(s["loads"] for s in summary["servers"].values()) == 1
    assert len(scores[1]) == 32 and scores[1].keys() == scores[3].keys()
    worst = max(abs(scores[3][k] - scores[1][k]) for k in scores[1])
    assert worst <= 1e-4, worst
    with sqlite3.connect(tmp_path / "tp3/factcheck/.snakemake/context/catalog.db") as db:
        assert db.execute("select ranks from placements").fetchall() == [(3,)]
