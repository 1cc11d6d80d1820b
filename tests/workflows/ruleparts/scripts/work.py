"""What a job sees of its rule's shared part, then changes it: the next job must not
see the change (each job has its own objects, as in a fresh interpreter)."""

import hashlib
import json
import os
import time

from snakemake_executor_context import load_context

load_context(snakemake)
time.sleep(float(snakemake.params.sleep))
config = snakemake.config
seen = {
    "pid": os.getpid(),
    "i": snakemake.wildcards.i,
    "rule": snakemake.rule,
    "label": snakemake.params.label,
    "claims": len(config["claims"]),
    "claims_digest": hashlib.sha256(json.dumps(config["claims"]).encode()).hexdigest(),
    # Snakemake rebuilds a list param per job, of the same items.
    "param_items_are_the_configs": snakemake.params.claims[0] is config["claims"][0],
    "weights": dict(snakemake.params.weights),
    "changed_seen": "changed" in config or "changed" in config["claims"][0],
}
config["changed"] = True
config["claims"][0]["changed"] = True
snakemake.params.weights["changed"] = True
with open(snakemake.output[0], "w") as out:
    json.dump(seen, out)
