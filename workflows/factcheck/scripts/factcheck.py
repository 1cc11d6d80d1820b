"""The fact-verification prompt search: templates, claims, calibration and metrics.

Pure functions (no model, no Snakemake), shared by the workflow's scripts, the
benchmark and the tests. The scripts find this module beside them: Snakemake puts a
script's directory on ``sys.path`` (and so does the context server, for that job).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jsonl import read_jsonl, write_jsonl

SUPPORTS, REFUTES, NEI = "SUPPORTS", "REFUTES", "NOT ENOUGH INFO"
FEVER_LABELS = (SUPPORTS, REFUTES, NEI)
#: The content-free input of contextual calibration (Zhao et al., 2021).
CONTENT_FREE = "N/A"


# ------------------------------------------------------------------------------------
# Templates.


@dataclass(frozen=True)
class Template:
    """A prompt template and the two answer words it compares.

    ``prompt`` may use ``{claim}`` (the claim as written) and ``{statement}`` (the
    claim without its final period, for questions such as "Is it true that ...?").
    With ``chat: true`` the prompt is the user message of the tokenizer's chat
    template, and the answer words follow the assistant prefix.
    """

    name: str
    prompt: str
    true_word: str
    false_word: str
    chat: bool = False
    description: str = ""

    def render(self, claim: str, tokenizer: Any = None) -> str:
        """The model input for one claim."""
        statement = claim.strip()
        if statement.endswith("."):
            statement = statement[:-1]
        text = self.prompt.format(claim=claim.strip(), statement=statement)
        if not self.chat:
            return text
        if tokenizer is None:
            raise ValueError(f"Template {self.name}: a chat template needs the tokenizer")
        rendered: str = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        return rendered


def load_template(path: str | Path) -> Template:
    """Read a template file (YAML); a clear error names the file and what is wrong."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ValueError(f"Template {path}: cannot be read: {error}") from error
    name = path.stem
    if not isinstance(data, dict):
        raise ValueError(f"Template {name} ({path}): expected a mapping of fields")
    missing = [key for key in ("prompt", "true_word", "false_word") if not data.get(key)]
    if missing:
        raise ValueError(f"Template {name} ({path}): missing {', '.join(missing)}")
    prompt = str(data["prompt"])
    if "{claim}" not in prompt and "{statement}" not in prompt:
        raise ValueError(
            f"Template {name} ({path}): the prompt uses neither {{claim}} nor {{statement}}"
        )
    try:
        prompt.format(claim="x", statement="x")
    except (KeyError, IndexError, ValueError) as error:
        raise ValueError(
            f"Template {name} ({path}): bad placeholder in prompt: {error}. "
            "Only {claim} and {statement} exist; write {{ and }} for braces."
        ) from error
    return Template(
        name=name,
        prompt=prompt,
        true_word=str(data["true_word"]),
        false_word=str(data["false_word"]),
        chat=bool(data.get("chat", False)),
        description=str(data.get("description", "")),
    )


# ------------------------------------------------------------------------------------
# Claims.


def select_claims(
    records: Sequence[dict[str, Any]],
    *,
    n_claims: int,
    nei: str,
    seed: int,
    calibration_fraction: float,
    source: str = "claims",
) -> list[dict[str, Any]]:
    """Validate FEVER records, handle NOT ENOUGH INFO, pick ``n_claims`` of them
    deterministically and mark each as calibration or evaluation.

    ``nei``: ``drop`` (filter them out) or ``refutes`` (score them as not supported).
    Each returned record has ``id``, ``claim``, ``label`` (FEVER's), ``target``
    (SUPPORTS or REFUTES) and ``split``.
    """
    if nei not in ("drop", "refutes"):
        raise ValueError(f"config nei: {nei!r} is neither 'drop' nor 'refutes'")
    usable = []
    for number, record in enumerate(records, 1):
        for key in ("id", "claim", "label"):
            if key not in record:
                raise ValueError(
                    f"{source} record {number} lacks {key!r} (FEVER schema: id, claim, label)"
                )
        if record["label"] not in FEVER_LABELS:
            raise ValueError(
                f"{source} record {number}: label {record['label']!r} is not "
                f"one of {', '.join(FEVER_LABELS)}"
            )
        if record["label"] == NEI and nei == "drop":
            continue
        target = SUPPORTS if record["label"] == SUPPORTS else REFUTES
        usable.append({**record, "target": target})
    if len(usable) < n_claims:
        raise ValueError(
            f"{source}: {len(usable)} usable claims, but n_claims is "
            f"{n_claims}. Fix: lower n_claims, or use a larger claim file."
        )
    # Stratified by target: each split keeps the source's label balance (a balanced
    # source gives balanced splits, so accuracy is not won by always saying REFUTES).
    groups = {
        t: sorted((r for r in usable if r["target"] == t), key=lambda r: _digest(seed, r["id"]))
        for t in (SUPPORTS, REFUTES)
    }
    quota = {SUPPORTS: round(n_claims * len(groups[SUPPORTS]) / len(usable))}
    quota[REFUTES] = n_claims - quota[SUPPORTS]
    chosen = []
    for target, group in groups.items():
        picked = group[: quota[target]]
        n_calibration = round(len(picked) * calibration_fraction)
        for index, record in enumerate(picked):
            record["split"] = "calibration" if index < n_calibration else "evaluation"
        chosen += picked
    chosen.sort(key=lambda r: _digest(seed + 1, r["id"]))
    return chosen


def shard(records: Sequence[dict[str, Any]], size: int) -> list[list[dict[str, Any]]]:
    """Consecutive shards of ``size`` claims (the last may be smaller)."""
    if size < 1:
        raise ValueError(f"claims_per_job must be at least 1, got {size}")
    return [list(records[start : start + size]) for start in range(0, len(records), size)]


def n_shards(n_claims: int, size: int) -> int:
    """How many shards :func:`shard` makes."""
    return max(1, math.ceil(n_claims / size))


def _digest(seed: int, value: Any) -> str:
    return hashlib.sha256(f"{seed}:{value}".encode()).hexdigest()


# ------------------------------------------------------------------------------------
# Decisions, calibration and metrics.


@dataclass
class Outcome:
    """Accuracy of one decision rule on one set of claims."""

    rule: str
    correct: int
    total: int
    threshold: float
    confusion: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def accuracy(self) -> float:
        """Fraction of claims decided right (0 when there are none)."""
        return self.correct / self.total if self.total else 0.0

    def wilson(self, z: float = 1.96) -> tuple[float, float]:
        """Wilson score interval of the accuracy (95% by default)."""
        return wilson_interval(self.correct, self.total, z)

    def as_dict(self) -> dict[str, Any]:
        """Plain data for the reports."""
        low, high = self.wilson()
        return {
            "rule": self.rule,
            "accuracy": self.accuracy,
            "correct": self.correct,
            "total": self.total,
            "threshold": self.threshold,
            "wilson95": [low, high],
            "confusion": self.confusion,
        }


def wilson_interval(successes: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval for a binomial proportion."""
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def predict(score: float, threshold: float = 0.0) -> str:
    """SUPPORTS when the true word beats the false word by more than ``threshold``."""
    return SUPPORTS if score > threshold else REFUTES


def evaluate(
    rows: Sequence[dict[str, Any]],
    threshold: float = 0.0,
    rule: str = "raw",
    shift: float = 0.0,
) -> Outcome:
    """Accuracy and confusion (FEVER label x prediction) of ``score - shift > threshold``."""
    confusion: dict[str, dict[str, int]] = {}
    correct = 0
    for row in rows:
        predicted = predict(row["score"] - shift, threshold)
        correct += predicted == row["target"]
        per_label = confusion.setdefault(row["label"], {SUPPORTS: 0, REFUTES: 0})
        per_label[predicted] += 1
    return Outcome(
        rule=rule, correct=correct, total=len(rows), threshold=threshold, confusion=confusion
    )


def fit_threshold(rows: Sequence[dict[str, Any]]) -> float:
    """The threshold that decides the most calibration claims right.

    Candidates are midpoints between consecutive sorted scores (and the ends); ties go
    to the candidate closest to 0, so a threshold is only moved when it helps.
    """
    if not rows:
        return 0.0
    ordered = sorted((row["score"], row["target"]) for row in rows)
    # Sweep upwards: below every score all claims are predicted SUPPORTS; passing a
    # score flips that claim to REFUTES. O(n log n), for FEVER-sized calibration sets.
    correct = sum(target == SUPPORTS for _, target in ordered)
    best = (correct, -abs(ordered[0][0] - 1.0), ordered[0][0] - 1.0)
    for index, (score, target) in enumerate(ordered):
        correct += 1 if target == REFUTES else -1
        following = ordered[index + 1][0] if index + 1 < len(ordered) else score + 2.0
        if following == score:
            continue
        threshold = (score + following) / 2
        best = max(best, (correct, -abs(threshold), threshold))
    at_zero = evaluate(rows, 0.0).correct
    if at_zero >= best[0]:
        return 0.0
    return float(best[2])


def swap_mapping(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same claims scored with the answer words swapped: every score negated."""
    return [{**row, "score": -row["score"]} for row in rows]


def template_accuracy(
    template: str, rows: Sequence[dict[str, Any]], content_free: float
) -> dict[str, Any]:
    """Raw, contextually calibrated and threshold-calibrated accuracy of a template.

    The threshold is fitted on the calibration split and evaluated on the evaluation
    split only; raw and contextual use no fitted parameter.
    """
    calibration = [row for row in rows if row["split"] == "calibration"]
    evaluation = [row for row in rows if row["split"] == "evaluation"]
    threshold = fit_threshold(calibration)
    return {
        "template": template,
        "n_calibration": len(calibration),
        "n_evaluation": len(evaluation),
        "content_free_score": content_free,
        "raw": evaluate(evaluation, 0.0, "raw").as_dict(),
        "contextual": evaluate(evaluation, 0.0, "contextual", shift=content_free).as_dict(),
        "calibrated": evaluate(evaluation, threshold, "calibrated").as_dict(),
        "mean_score": sum(r["score"] for r in rows) / len(rows) if rows else 0.0,
    }


def rank(accuracies: Sequence[dict[str, Any]], rule: str = "calibrated") -> dict[str, Any]:
    """The best template by ``rule``, and whether its interval overlaps the runner-up's."""
    ordered = sorted(accuracies, key=lambda a: a[rule]["accuracy"], reverse=True)
    best = ordered[0]
    summary: dict[str, Any] = {
        "rule": rule,
        "best": best["template"],
        "accuracy": best[rule]["accuracy"],
        "order": [a["template"] for a in ordered],
    }
    if len(ordered) > 1:
        runner = ordered[1]
        low_best = best[rule]["wilson95"][0]
        high_runner = runner[rule]["wilson95"][1]
        summary["runner_up"] = runner["template"]
        summary["overlaps_runner_up"] = low_best <= high_runner
    return summary


# ------------------------------------------------------------------------------------
# The workflow's local steps (called from `run:` blocks: no subprocess per step).


def prepare_claims(
    output: str,
    *,
    source: str | None,
    n_claims: int,
    seed: int,
    nei: str,
    calibration_fraction: float,
    generated_pool: int,
) -> None:
    """Write the claims to score: from a FEVER file, or a generated balanced set."""
    if source:
        records = read_jsonl(source)
        label = source
    else:
        from claimgen import generate

        records = generate(generated_pool, seed)
        label = f"the generated set ({generated_pool} claims)"
    chosen = select_claims(
        records,
        n_claims=n_claims,
        nei=nei,
        seed=seed,
        calibration_fraction=calibration_fraction,
        source=label,
    )
    write_jsonl(output, chosen)


def accuracy_from_shards(paths: Sequence[str | Path], output: str | Path) -> None:
    """Join a template's scored shards and write its accuracies (JSON)."""
    rows: list[dict[str, Any]] = []
    content_free: list[float] = []
    template = ""
    for path in paths:
        with open(path) as handle:
            scored = json.load(handle)
        template = scored["template"]
        rows += scored["rows"]
        if scored.get("content_free_score") is not None:
            content_free.append(scored["content_free_score"])
    free = sum(content_free) / len(content_free) if content_free else 0.0
    with open(output, "w") as handle:
        json.dump(template_accuracy(template, rows, free), handle, indent=1)
