"""Raw and calibrated accuracy of one template over all its shards."""

import json

from factcheck import template_accuracy

rows, content_free, template = [], [], None
for path in snakemake.input:
    with open(path) as f:
        shard = json.load(f)
    template = shard["template"]
    rows += shard["rows"]
    content_free.append(shard["content_free_score"])
result = template_accuracy(template, rows, sum(content_free) / len(content_free))
with open(snakemake.output[0], "w") as out:
    json.dump(result, out, indent=1)
