"""Score a chunk of claims with the loaded model (one forward pass per micro-batch)."""

import json

from snakemake_executor_context import load_context, report_items

model = load_context(snakemake)
template = snakemake.params.template
yes_id, no_id = model.answer_ids(template["true_word"], template["false_word"], template["prompt"])

claims = [json.loads(line) for line in open(snakemake.input[0])]
prompts = [template["prompt"].format(claim=c["claim"]) for c in claims]
scores = model.score(prompts, yes_id, no_id, batch_size=8)
report_items(len(claims))

with open(snakemake.output[0], "w") as out:
    print("id\tlabel\tscore\tclaim", file=out)
    for claim, score in zip(claims, scores, strict=True):
        print(f"{claim['id']}\t{claim['label']}\t{score:.6f}\t{claim['claim']}", file=out)
