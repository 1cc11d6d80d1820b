"""Score one shard of claims with one template against the loaded model."""

import json
import time

from factcheck import CONTENT_FREE, load_template, read_jsonl

from snakemake_executor_context import load_context, report_items

started = time.perf_counter()
model = load_context(snakemake)
template = load_template(snakemake.input.template)
true_id, false_id = model.answer_ids(template.true_word, template.false_word, template.name)
claims = read_jsonl(snakemake.input.shard)
batch = snakemake.params.forward_batch


def score(prompts):
    """Through the batcher, the forward passes are shared with the concurrent jobs of
    this server (any template); without it (config `batching: false`), this job's own."""
    if snakemake.params.batching:
        return model.score_batched([(p, true_id, false_id) for p in prompts], batch)
    return model.score(prompts, true_id, false_id, batch_size=batch)


scores = []
# Chunks of one forward batch: concurrent jobs' chunks merge into shared passes.
for start in range(0, len(claims), batch):
    chunk = claims[start : start + batch]
    scores += score([template.render(c["claim"], model.tokenizer) for c in chunk])
    report_items(len(chunk))
# The content-free input's score is the same for every shard of a template: the first
# shard measures it (one more forward pass), the others do not repeat it.
content_free = None
if snakemake.wildcards.shard == "0":
    content_free = score([template.render(CONTENT_FREE, model.tokenizer)])[0]

result = {
    "template": template.name,
    "content_free_score": content_free,
    "device": model.device,
    "seconds": time.perf_counter() - started,
    "rows": [
        {
            "id": c["id"],
            "label": c["label"],
            "target": c["target"],
            "split": c["split"],
            "score": score,
        }
        for c, score in zip(claims, scores, strict=True)
    ],
}
with open(snakemake.output[0], "w") as out:
    json.dump(result, out)
